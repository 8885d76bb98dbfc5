"""What the rest of jax-aot asks about the running JAX release, answered in one place.

Code outside aot/jaxcompat never probes JAX (no ``getattr``/``hasattr`` on a JAX module,
tests/aot/jaxcompat/test_canary.py fails on one) and never compares release strings
itself: whether a stored artifact comes from this release is :func:`same_release`, what
``jax.export`` calls is :func:`calling_convention_window`, the names JAX's own monitoring
events use are here too. Importing this module imports no JAX (``import aot`` and the
commands that need no device stay free of it); each function imports what it reads.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CACHE_HITS", "CACHE_MISSES", "COMPILE_REQUESTS", "RETRIEVAL_TIME", "TIME_SAVED",
    "calling_convention", "calling_convention_window", "config_value", "same_release", "this_release",
]

# The names of JAX's compilation-cache monitoring events (jax/_src/compiler.py,
# jax/_src/compilation_cache.py), the same on every supported release (0.9.0 through
# 0.12.x); jax-aot records them for its own loads so that dashboards see one series.
COMPILE_REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
CACHE_HITS = "/jax/compilation_cache/cache_hits"
CACHE_MISSES = "/jax/compilation_cache/cache_misses"
TIME_SAVED = "/jax/compilation_cache/compile_time_saved_sec"
RETRIEVAL_TIME = "/jax/compilation_cache/cache_retrieval_time_sec"


def this_release() -> str:
    """The version of the JAX this process runs (``jax.__version__``)."""
    import jax

    return str(jax.__version__)


def same_release(version: str | None) -> bool:
    """Whether ``version`` (the JAX release a manifest or an environment records) is the
    release this process runs. An unknown version (None, empty) is not: the caller treats
    it as its own release's data only where it says so."""
    return bool(version) and version == this_release()


def calling_convention_window() -> tuple[int, int] | None:
    """(minimum, maximum) ``jax.export`` calling convention versions this release
    calls; None when this ``jax.export`` does not say."""
    import jax

    low = getattr(jax.export, "minimum_supported_calling_convention_version", None)
    high = getattr(jax.export, "maximum_supported_calling_convention_version", None)
    if not isinstance(low, int) or not isinstance(high, int):
        return None
    return low, high


def calling_convention(exported: Any) -> int | None:
    """The calling convention version of a deserialized ``jax.export.Exported``; None
    when it does not record one."""
    version = getattr(exported, "calling_convention_version", None)
    return version if isinstance(version, int) else None


def config_value(name: str, default: Any = None) -> Any:
    """The value of JAX's configuration option ``name`` (``jax_platforms``,
    ``jax_num_cpu_devices``), ``default`` on a release without it."""
    import jax

    return getattr(jax.config, name, default)
