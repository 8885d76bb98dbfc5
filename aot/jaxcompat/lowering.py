"""Tracing configuration while lowering (``jax._src.config``).

JAX offers the ``jax_traceback_in_locations_limit`` flag publicly only as a global
setting; its context manager, which sets it for one trace and thread, is private.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from jax._src import config


def no_traceback_locations() -> AbstractContextManager[Any]:
    """Exports without Python tracebacks in the module's locations, so that the
    portable HLO does not depend on where it was exported from."""
    return config.traceback_in_locations_limit(0)


def jit_settings(fn: Any) -> tuple[Any, dict[str, tuple[Any, ...]]] | None:
    """``(wrapped function, settings)`` when ``fn`` is a ``jax.jit`` function, else None.

    ``settings`` holds the ``static_argnums``, ``static_argnames``, ``donate_argnums``
    and ``donate_argnames`` it was given. JAX keeps them only on the jitted function's
    private ``_jit_info``; lowering a jitted function inside another ``jax.jit`` drops
    the inner donation, so the lowering re-applies them itself.
    """
    info = getattr(fn, "_jit_info", None)
    wrapped = getattr(fn, "__wrapped__", None)
    if info is None or wrapped is None:
        return None
    return wrapped, {
        "static_argnums": tuple(info.static_argnums),
        "static_argnames": tuple(info.static_argnames),
        "donate_argnums": tuple(info.donate_argnums),
        "donate_argnames": tuple(info.donate_argnames),
    }
