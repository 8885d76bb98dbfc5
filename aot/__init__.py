"""jax-aot: ahead-of-time compilation of JAX programs and a fingerprint-keyed cache."""

from __future__ import annotations

from aot.computation import MeshComputation, PmapComputation
from aot.errors import (
    AotError,
    ArtifactNotFoundError,
    AvalMismatchError,
    CacheError,
    CorruptArtifactError,
    IncompatibleEnvironmentError,
    IntegrityError,
    ManifestError,
    ReadOnlyCacheError,
    SignatureNotFoundError,
    SpecError,
    UnsupportedComputationError,
)
from aot.executable import MeshExecutable, PmapExecutable
from aot.lowering import lower, lower_pmap
from aot.specs import spec

__version__ = "0.1.0"


def __getattr__(name: str):  # noqa: ANN202 - lazy re-exports keep `import aot` light
    if name == "Cache":
        from aot.cache.cache import Cache

        return Cache
    if name == "load":
        from aot.cache.loader import load

        return load
    raise AttributeError(f"module 'aot' has no attribute {name!r}")

__all__ = [
    "AotError",
    "ArtifactNotFoundError",
    "AvalMismatchError",
    "Cache",
    "CacheError",
    "CorruptArtifactError",
    "IncompatibleEnvironmentError",
    "IntegrityError",
    "ManifestError",
    "MeshComputation",
    "MeshExecutable",
    "PmapComputation",
    "PmapExecutable",
    "ReadOnlyCacheError",
    "SignatureNotFoundError",
    "SpecError",
    "UnsupportedComputationError",
    "lower",
    "lower_pmap",
    "load",
    "spec",
]
