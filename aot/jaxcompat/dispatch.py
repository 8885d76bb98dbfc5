"""JAX's C++ dispatch path, for executables JAX did not trace.

Wraps ``jax._src.lib._jax.pjit`` (the ``PjitFunction`` behind ``jax.jit`` and
``Compiled``), ``pxla.JitGlobalCppCacheKeys``, ``pxla.cc_shard_arg``,
``tree_util.dispatch_registry``, the construction of ``stages.Compiled`` with
``no_kwargs`` and its private ``_executable.create_cpp_call``/``_params``/
``_cache_miss``, and ``jax._src.array.ArrayImpl`` (the concrete type of
``jax.Array``, which the per-call key tests for). Through these a loaded executable's
calls run in C++ as a ``jax.jit`` call does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax._src import stages, tree_util
from jax._src.interpreters import pxla
from jax._src.lib import _jax

from aot.jaxcompat.deserialize import arg_infos

try:
    from jax._src.array import ArrayImpl as ARRAY_TYPE  # the concrete type of jax.Array
except ImportError:  # pragma: no cover - another jax layout: every call takes call_key
    ARRAY_TYPE = None  # type: ignore[assignment,misc]


def flat_call(compiled: Any, args: Sequence[Any], out_tree: Any) -> Any:
    """``compiled`` as a function of its flat inputs (``args``: objects with
    ``shape``, ``dtype``, ``weak_type``, ``donated``) returning ``out_tree``: the same
    loaded executable, without the input structure JAX would compare by identity (a
    loaded structure may hold stand-ins, and the caller's was matched by digest
    already). It is JAX's C++ dispatch function itself (``Compiled._call``), built
    now rather than on the first call."""
    args_info: tuple[tuple[Any, ...], dict[str, Any]] = (tuple(arg_infos(args)), {})
    # The constants JAX hoisted into leading parameters (aot.constants) go with it
    # (``_params.const_args``, as jaxcompat.build.hoisted_constants reads them; that
    # module is not imported on the serving path).
    flat = stages.Compiled(compiled._executable, list(compiled._params.const_args), args_info, out_tree, no_kwargs=True)
    try:
        fn = flat._executable.create_cpp_call(flat._params)
    except Exception:  # noqa: BLE001 - an executable kind without a C++ path
        fn = None
    return fn if fn is not None else flat


def dispatch_function(name: str, cache_miss: Any) -> Any:
    """JAX's C++ dispatch function (the ``PjitFunction`` behind ``jax.jit`` and
    ``Compiled``) with no Python function of its own: a call whose signature (pytree,
    shapes, dtypes, weak types, shardings, committedness) it has not cached goes to
    ``cache_miss(*args, **kwargs)``, which returns ``(outputs, fastpath data or None,
    False)``, as :func:`first_call` does; a cached signature runs in C++."""
    return _jax.pjit(
        name, None, cache_miss, [], [], pxla.JitGlobalCppCacheKeys(),
        tree_util.dispatch_registry, pxla.cc_shard_arg,
    )


def first_call(fn: Any, leaves: Sequence[Any]) -> tuple[Any, Any, bool]:
    """Runs ``fn`` (from :func:`flat_call`) on flat inputs and returns what a
    :func:`dispatch_function` cache miss returns: with ``fn``'s fastpath data, so the
    next call of this signature runs in C++ (``None`` for an executable without a C++
    path: host callbacks, effects, outputs that are not plain arrays)."""
    miss = getattr(fn, "_cache_miss", None)
    if miss is None:
        return fn(*leaves), None, False
    return miss(*leaves)
