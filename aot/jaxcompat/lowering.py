"""Tracing configuration while lowering (``jax._src.config``), and reading a traced
program's jaxpr on every release.

JAX offers the ``jax_traceback_in_locations_limit`` flag publicly only as a global
setting; its context manager, which sets it for one trace and thread, is private.
"""

from __future__ import annotations

from collections.abc import Iterable
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


def all_equations(closed_jaxpr: Any) -> Iterable[Any]:
    """Every equation of a traced program (``jax.stages.Traced.jaxpr``), those of the
    sub-jaxprs in equation parameters (a ``cond``'s branches, a ``scan``'s body, a
    nested ``jit``) included."""
    yield from _equations(closed_jaxpr.jaxpr)


def closed_over_constants(closed_jaxpr: Any) -> tuple[Any, ...]:
    """The constants a traced program closes over."""
    return tuple(getattr(closed_jaxpr, "consts", ()))


def _equations(jaxpr: Any) -> Iterable[Any]:
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in _subjaxprs(eqn.params):
            yield from _equations(sub)


def _subjaxprs(params: dict[str, Any]) -> Iterable[Any]:
    # Not jax.core.subjaxprs: JAX 0.9.x's takes a whole jaxpr (and is deprecated), 0.10
    # removed it; the parameters of an equation are walked here on every release.
    # Release difference "ClosedJaxpr": up to 0.10 a sub-jaxpr is a ClosedJaxpr (its
    # equations on .jaxpr) or a Jaxpr; 0.11 merged the two (.jaxpr is the jaxpr itself).
    for value in params.values():
        items = value if isinstance(value, (tuple, list)) else (value,)
        for item in items:
            inner = getattr(item, "jaxpr", None)
            if inner is not None and hasattr(inner, "eqns"):
                yield inner
            elif hasattr(item, "eqns"):
                yield item
