"""The value objects of the index's rows of KIND ``jit`` (:mod:`aot.cache.index.jit`):
what listings, statistics and the JAX cache backend read, without SQLAlchemy."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aot.cache.index.entry import as_utc, fields_to_json, utcnow

__all__ = ["JIT", "AOT", "JitEntry", "JitStats", "function_name", "sign_entry", "signature_problem"]

#: The KIND of an entry of JAX's persistent cache, and of an artifact compiled through jax-aot.
JIT = "jit"
AOT = "aot"


#: Why a jit backend may store nothing: JAX writes only compiles that took at least its
#: minimum compile time (1 s by default). Said by install()'s log and by ``aot stats``.
MIN_COMPILE_TIME_HINT = (
    "JAX stores only compiles that took at least jax_persistent_cache_min_compile_time_secs "
    "({seconds:g} s here); to store every compile, set JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 "
    "in the environment (or jax.config.update('jax_persistent_cache_min_compile_time_secs', 0))"
)


def function_name(jax_key: str) -> str:
    """The jitted function's name from JAX's cache key (``jit_train_step-<hash>`` ->
    ``train_step``; JAX prefixes the module name, ``jit_``/``pmap_`` included)."""
    module, sep, _ = jax_key.rpartition("-")
    module = module if sep else jax_key
    for prefix in ("jit_", "pmap_", "xla_computation_"):
        if module.startswith(prefix) and len(module) > len(prefix):
            return module[len(prefix):]
    return module


@dataclass(frozen=True, slots=True)
class JitEntry:
    """One entry of JAX's persistent cache kept by jax-aot (KIND ``jit``)."""

    key: str
    name: str
    digest: str
    size: int
    stored_size: int
    compile_seconds: float
    platform: str
    signature: str | None = None
    created_at: datetime = field(default_factory=utcnow)
    last_used_at: datetime = field(default_factory=utcnow)
    hits: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "created_at", as_utc(self.created_at, "created_at"))
        object.__setattr__(self, "last_used_at", as_utc(self.last_used_at, "last_used_at"))

    @property
    def kind(self) -> str:
        return JIT

    def to_dict(self) -> dict[str, Any]:
        data = fields_to_json(self)
        data["hmac"] = data.pop("signature")  # "signature" is an aot entry's arguments
        return {"kind": JIT, **data}


def sign_entry(secret: bytes, key: str, name: str, digest: str, size: int) -> str:
    """The HMAC of a jit entry: what selects it (JAX's key, the name) and its blob."""
    message = f"jax-aot jit entry\n{key}\n{name}\n{digest}\n{size}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def signature_problem(secret: bytes | None, entry: JitEntry) -> str | None:
    """Why ``entry`` must not be executed under the signing key ``secret`` (None: it
    may; always None without a key)."""
    if secret is None:
        return None
    if entry.signature is None:
        return "unsigned (the cache has a signing key)"
    expected = sign_entry(secret, entry.key, entry.name, entry.digest, entry.size)
    if not hmac.compare_digest(expected, entry.signature):
        return "signed with another key, or altered"
    return None


@dataclass(frozen=True, slots=True)
class JitStats:
    """Hits and misses of JAX's persistent cache through jax-aot for one function name."""

    name: str
    hits: int
    misses: int
    saved_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "hits": self.hits, "misses": self.misses, "saved_seconds": self.saved_seconds}
