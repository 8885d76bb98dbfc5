"""``aot doctor``: versions, devices, the environment fingerprint, cache location and health."""

from __future__ import annotations

import importlib.metadata
import platform
from dataclasses import dataclass
from typing import Any

from aot.errors import AotError

_DISTRIBUTIONS = ("jax-aot", "jax", "jaxlib", "numpy", "sqlalchemy", "zstandard", "click", "psycopg")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in _DISTRIBUTIONS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            if dist != "psycopg":
                out[dist] = "not installed"
    return out


@dataclass(frozen=True, slots=True)
class Diagnosis:
    versions: dict[str, str]
    devices: dict[str, Any]
    environment: dict[str, Any]
    location: str
    index: str | None = None
    schema_version: int | None = None
    supported_schema_version: int | None = None
    entries: int | None = None
    entries_here: int | None = None
    quarantined: int | None = None
    stored_bytes: int | None = None
    health: Any = None  # VerifyReport
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and (self.health is None or self.health.ok)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "versions": self.versions,
            "devices": self.devices,
            "environment": self.environment,
            "cache": {
                "location": self.location,
                "index": self.index,
                "schema_version": self.schema_version,
                "supported_schema_version": self.supported_schema_version,
                "entries": self.entries,
                "entries_this_environment": self.entries_here,
                "quarantined": self.quarantined,
                "stored_bytes": self.stored_bytes,
                "error": self.error,
            },
            "health": self.health.to_dict() if self.health is not None else None,
        }


def diagnose(location: str | None = None, *, check: bool = True) -> Diagnosis:
    """Gathers everything ``aot doctor`` shows. Opens the cache read-only (it never
    creates, migrates or quarantines anything); a cache that cannot be opened is
    reported in ``error``, not raised."""
    import jax

    from aot.cache.cache import Cache, default_location, is_url
    from aot.cache.index import SCHEMA_VERSION, mask_url
    from aot.fingerprint import environment_fingerprint, xla_flags_outside_key

    devices = jax.devices()
    first = devices[0]
    device_info = {
        "platform": first.platform,
        "device_kind": first.device_kind,
        "count": len(devices),
        "local_count": jax.local_device_count(),
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
    }
    env = environment_fingerprint()
    environment = {
        "digest": env.digest,
        "parts": env.as_dict(),
        # Set here but not in the key: they cannot change an executable.
        "outside_key": {"xla_flags": xla_flags_outside_key()},
    }
    location = str(location) if location is not None else default_location()
    shown = mask_url(location) if is_url(location) else location
    base = dict(
        versions=versions(), devices=device_info, environment=environment, location=shown,
        supported_schema_version=SCHEMA_VERSION,
    )
    try:
        cache = Cache(location, read_only=True)
    except AotError as exc:
        return Diagnosis(**base, error=str(exc))  # type: ignore[arg-type]
    try:
        entries = cache.index.entries()
        health = cache.verify(quarantine=False) if check else None
        return Diagnosis(
            **base,  # type: ignore[arg-type]
            index=cache.index.url,
            schema_version=cache.index.schema_version(),
            entries=len(entries),
            entries_here=sum(1 for e in entries if e.env_fp == env.digest and e.ok),
            quarantined=sum(1 for e in entries if not e.ok),
            stored_bytes=sum(cache.blobs.stored_size(d) or 0 for d in cache.blobs.digests()),
            health=health,
        )
    except AotError as exc:
        return Diagnosis(**base, index=cache.index.url, error=str(exc))  # type: ignore[arg-type]
    finally:
        cache.close()


__all__ = ["Diagnosis", "diagnose", "versions"]
