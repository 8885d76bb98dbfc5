"""The digests of fingerprints: sha256 over canonical JSON.

Kept apart from :mod:`aot.fingerprint` (its value objects) so that ``aot.load``'s
read-ahead can compute this environment's digest before anything slower is imported
(:mod:`aot.environment`, :mod:`aot.cache.serving.read_ahead`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def sorted_parts(parts: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """A fingerprint's parts as :func:`parts_digest` takes them: ``(name, value)``
    strings, sorted by name."""
    return tuple(sorted((str(k), str(v)) for k, v in parts.items()))


@lru_cache(maxsize=256)
def parts_digest(kind: str, parts: tuple[tuple[str, str], ...]) -> str:
    """The digest of a fingerprint of ``kind`` whose ``parts`` are sorted ``(name, value)``
    pairs, computed once per fingerprint (a load asks for the same few several times:
    the manifest's key check, the environment's row filter)."""
    return sha256_hex(canonical_json({"kind": kind, "parts": dict(parts)}))
