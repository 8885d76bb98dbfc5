"""jax-aot: ahead-of-time compilation of JAX programs and a fingerprint-keyed cache.

The errors are imported eagerly (they are light); everything that needs JAX is
imported on first use, so ``import aot`` (and ``aot --help``) stays quick.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import TYPE_CHECKING, Any

from aot.errors import (
    AotError,
    ArtifactNotFoundError,
    AvalMismatchError,
    BlobLocationError,
    CacheError,
    CorruptArtifactError,
    DeviceBusyError,
    DeviceUnavailableError,
    DeviceTargetError,
    DistributedJobError,
    GpuCompilerMissingError,
    IncompatibleEnvironmentError,
    ExportWindowError,
    IntegrityError,
    ManifestError,
    MetricsError,
    PytreeNodeError,
    ReadOnlyCacheError,
    ReleaseNotFoundError,
    SignatureNotFoundError,
    SliceError,
    SliceTimeoutError,
    SpecError,
    SymbolicShapeError,
    TargetCaptureError,
    TargetError,
    UnsupportedComputationError,
    UnsupportedJaxError,
    UsageError,
)
from aot.jax_support import check_installed_jax

# Before anything imports JAX: a release outside the tested range fails here, in one
# line that says which release is installed and what to do, not in a load later.
check_installed_jax()

#: Started at ``import aot`` when its variable is set: the metrics endpoint and its
#: ``/ready``, so that a readiness probe gets 503 (not a refused port) until the first
#: load. By name, as the lazy names below: the core imports no floor above it.
_AT_IMPORT = ("AOT_METRICS_PORT", "aot.cache.serving.metrics", "serve_metrics_from_env")


def _start_at_import() -> None:
    variable, module, function = _AT_IMPORT
    if not os.environ.get(variable, "").strip():
        return
    try:
        getattr(importlib.import_module(module), function)()
    except AotError as exc:
        # Not an import error: the first aot.load tries again and raises it (a command in
        # the same container, with the port already served, just warns).
        logging.getLogger(__name__).warning("%s=%s: no metrics endpoint: %s", variable, os.environ[variable], exc)


_start_at_import()

if TYPE_CHECKING:
    from aot.cache.cache import Cache
    from aot.cache.serving.load import load
    from aot.cache.serving.metrics import serve_metrics
    from aot.cache.timeouts import Timeouts
    from aot.computation import MeshComputation, PmapComputation
    from aot.executable import MeshExecutable, PmapExecutable
    from aot.lowering import lower, lower_pmap
    from aot.specs import spec
    from aot.targets import DeviceTarget, parse_target

__version__ = "0.1.0"

_LAZY = {
    "Cache": "aot.cache.cache",
    "load": "aot.cache.serving.load",
    "MeshComputation": "aot.computation",
    "PmapComputation": "aot.computation",
    "MeshExecutable": "aot.executable",
    "PmapExecutable": "aot.executable",
    "lower": "aot.lowering",
    "lower_pmap": "aot.lowering",
    "spec": "aot.specs",
    "DeviceTarget": "aot.targets",
    "parse_target": "aot.targets",
    "Timeouts": "aot.cache.timeouts",
    "serve_metrics": "aot.cache.serving.metrics",
}


#: Sub-packages of the cache reachable as attributes of ``aot`` (``aot.jax_cache.install``).
_MODULES = {"jax_cache": "aot.cache.jax_cache"}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        found = importlib.import_module(_MODULES[name])
        globals()[name] = found
        return found
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'aot' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_MODULES))


__all__ = [
    "AotError",
    "ArtifactNotFoundError",
    "AvalMismatchError",
    "BlobLocationError",
    "Cache",
    "CacheError",
    "CorruptArtifactError",
    "DeviceBusyError",
    "DeviceUnavailableError",
    "DeviceTargetError",
    "DistributedJobError",
    "GpuCompilerMissingError",
    "IncompatibleEnvironmentError",
    "ExportWindowError",
    "IntegrityError",
    "ManifestError",
    "MetricsError",
    "MeshComputation",
    "DeviceTarget",
    "MeshExecutable",
    "PmapComputation",
    "PmapExecutable",
    "PytreeNodeError",
    "ReadOnlyCacheError",
    "ReleaseNotFoundError",
    "SignatureNotFoundError",
    "SliceError",
    "SliceTimeoutError",
    "SpecError",
    "SymbolicShapeError",
    "TargetCaptureError",
    "TargetError",
    "Timeouts",
    "UnsupportedComputationError",
    "UnsupportedJaxError",
    "UsageError",
    "load",
    "lower",
    "lower_pmap",
    "parse_target",
    "serve_metrics",
    "spec",
]
