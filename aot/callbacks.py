"""Host callbacks bound by name: the pure callbacks of allow-listed libraries.

A compiled program may call back into Python (``jax.pure_callback``); its serialized
executable names each callback by an index only. A callback whose function belongs to
a library of :data:`aot.libraries.LIBRARY_PACKAGES` (Equinox's runtime checks,
``eqx.error_if``, which diffrax, optimistix and lineax use with their default
``throw=True``) is stored as a *binding*: the function's ``module:qualname``, the data
its closure holds (strings, numbers, lists: never code), its argument structure and
result avals. A serving process imports that library function, rebuilds it over the
stored data and binds it to the same index, so a failing check raises at serve time as
it does under ``jax.jit``. The model's own functions are never bound: a callback into
model code, an ``io_callback`` or a ``jax.debug`` callback is refused at lowering time.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from aot import treedef as treedefs
from aot.errors import CorruptArtifactError, UnsupportedComputationError
from aot.jaxcompat.callbacks import LoweredCallback
from aot.libraries import LIBRARY_PACKAGES, import_library

log = logging.getLogger(__name__)

#: Closure variables a bound function keeps but a served call cannot observe: stored
#: empty. Equinox's ``raises`` keeps the tracing stack for ``equinox.filter_jit``'s
#: error report, which no served call runs under; storing it would put the model's
#: file paths and line numbers into the program fingerprint.
UNOBSERVED = {("equinox._errors", "_error.<locals>.raises"): ("stack",)}

_EQX_HINT = (
    " Equinox's runtime checks (eqx.error_if; diffrax/optimistix/lineax throw=True) are "
    "served when equinox imports in the serving process; otherwise set EQX_ON_ERROR=nan "
    "before importing equinox (a failed check then returns NaN, a pure operation)."
)


def callback_name(function: Any) -> str:
    return f"{getattr(function, '__module__', '?')}:{getattr(function, '__qualname__', '?')}"


def refusal(name: str, primitive: str, function: Any, why: str) -> UnsupportedComputationError:
    """The error for a host callback that cannot be served, naming the primitive and
    the function it calls."""
    hint = _EQX_HINT if str(getattr(function, "__module__", "")).startswith("equinox") else (
        " Remove it (or guard it behind a flag) before compiling ahead of time."
    )
    return UnsupportedComputationError(
        f"{name}: uses primitive {primitive!r} (jax.{primitive}) calling {callback_name(function)}, which "
        f"calls back into the Python host; {why}.{hint}"
    )


def bindable(function: Any) -> str | None:
    """None when ``function`` can be bound by name; else why it cannot."""
    if not isinstance(function, types.FunctionType):
        return f"{type(function).__name__} objects are not bound by name (a plain function is)"
    module = str(function.__module__ or "")
    if module.partition(".")[0] not in LIBRARY_PACKAGES:
        return (
            f"module {module!r} is not an allow-listed library ({', '.join(sorted(LIBRARY_PACKAGES))}) "
            "and the serving process never imports the model's code"
        )
    skip = UNOBSERVED.get((module, function.__qualname__), ())
    for var, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
        if var in skip:
            continue
        try:
            _encode(cell.cell_contents)
        except TypeError as exc:
            return f"its closure variable {var!r} holds {exc}, not data"
    return None


def bind(name: str, callbacks: Sequence[LoweredCallback]) -> tuple[dict[str, Any], ...]:
    """The manifest's description of each host callback, in index order; raises
    :class:`UnsupportedComputationError` for one that cannot be bound."""
    out = []
    for cb in callbacks:
        if cb.function is None:
            raise UnsupportedComputationError(
                f"{name}: the compiled program calls back into Python on the host "
                f"({cb.description}), which cannot be served from an artifact; remove "
                "jax.debug.print / io_callback from the function"
            )
        why = bindable(cb.function)
        if why is not None:
            raise refusal(name, "pure_callback", cb.function, why)
        fn = cb.function
        skip = UNOBSERVED.get((fn.__module__, fn.__qualname__), ())
        closure = {
            var: _encode(type(cell.cell_contents)() if var in skip else cell.cell_contents)
            for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ())
        }
        out.append({
            "primitive": "pure_callback",
            "function": callback_name(fn),
            "closure": closure,
            "in_tree": treedefs.to_json(cb.in_tree),
            "results": [
                {"shape": [int(d) for d in a.shape], "dtype": np.dtype(a.dtype).name}
                for a in cb.result_avals
            ],
        })
    return tuple(out)


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return {"$": "bytes", "hex": value.hex()}
    if isinstance(value, (list, tuple)):
        return {"$": type(value).__name__, "items": [_encode(v) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"$": "dict", "items": {k: _encode(v) for k, v in value.items()}}
    raise TypeError(f"a {type(value).__module__}.{type(value).__qualname__}")


def _decode(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    tag = data.get("$")
    items: Any = data.get("items")  # a list or a dict, by tag
    if tag == "bytes":
        return bytes.fromhex(str(data["hex"]))
    if tag in ("list", "tuple"):
        return (list if tag == "list" else tuple)(_decode(v) for v in items)
    if tag == "dict":
        return {str(k): _decode(v) for k, v in items.items()}
    raise ValueError(f"unknown closure value tag {tag!r}")


def _function_codes(value: Any, depth: int) -> Any:
    """The code objects of ``value``: a function, or a class or a wrapper object
    (``functools.wraps``, ``jax.custom_jvp``, ``equinox.filter_custom_jvp``) holding
    functions, up to ``depth`` levels of wrapping."""
    value = getattr(value, "__func__", value)
    code = getattr(value, "__code__", None)
    if isinstance(code, types.CodeType):
        yield code
    if depth == 0 or isinstance(value, types.ModuleType):
        return
    inner = [getattr(value, "__wrapped__", None)]
    if isinstance(value, types.FunctionType):  # a wrapper's closure holds the function
        inner += [c.cell_contents for c in value.__closure__ or () if _cell_callable(c)]
    else:
        try:
            inner += list(vars(value).values())
        except TypeError:  # no __dict__
            pass
    for item in inner:
        if item is not None:
            yield from _function_codes(item, depth - 1)


def _cell_callable(cell: Any) -> bool:
    try:
        return callable(cell.cell_contents)
    except ValueError:  # an empty cell
        return False


def _codes(module: types.ModuleType) -> Any:
    """Every code object defined in ``module``'s file, reachable from its namespace."""
    filename = getattr(module, "__file__", None)
    roots = [
        code for value in list(vars(module).values())
        for code in _function_codes(value, 4) if code.co_filename == filename
    ]
    seen: set[int] = set()
    while roots:
        code = roots.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        yield code
        roots.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def resolve(name: str, binding: dict[str, Any]) -> Callable[..., Any]:
    """The host callback a stored binding names, rebuilt from the library's own code
    over the stored closure data; raises :class:`UnsupportedComputationError` when
    this process cannot (the library is not importable or has changed)."""
    module_name, _, qualname = str(binding["function"]).partition(":")
    if module_name.partition(".")[0] not in LIBRARY_PACKAGES:
        raise CorruptArtifactError(
            f"{name}: host callback {binding['function']!r} is not in an allow-listed "
            "library; the manifest was altered"
        )
    module = import_library(module_name)
    if module is None:
        raise UnsupportedComputationError(
            f"{name}: its host callback {binding['function']} needs {module_name}, which "
            f"does not import in this process; install {module_name.partition('.')[0]} "
            "beside jax-aot where the entry is served"
        )
    closure = {str(k): _decode(v) for k, v in dict(binding["closure"]).items()}
    code = next((c for c in _codes(module) if c.co_qualname == qualname), None)
    if code is None or tuple(code.co_freevars) != tuple(closure):
        raise UnsupportedComputationError(
            f"{name}: its host callback {binding['function']} is not defined in this "
            f"process's {module_name} (or captures other variables): the library's "
            "version differs from the one the entry was compiled with; recompile the entry"
        )
    function = types.FunctionType(
        code, vars(module), code.co_name, None,
        tuple(types.CellType(closure[v]) for v in code.co_freevars),
    )
    in_tree = treedefs.from_json(binding["in_tree"])
    results = [(tuple(int(d) for d in r["shape"]), np.dtype(r["dtype"])) for r in binding["results"]]
    return _host_callback(function, in_tree, results)


def _host_callback(function: Callable[..., Any], in_tree: Any, results: list[Any]) -> Callable[..., Any]:
    """What ``jax.pure_callback`` runs on the host: the flat arguments as CPU arrays
    unflattened into the function's arguments, its flat results checked against the
    recorded avals (as jax._src.callback does)."""
    cpu = jax.local_devices(backend="cpu")[0]

    def call(*flat_args: Any) -> tuple[Any, ...]:
        args, kwargs = jax.tree_util.tree_unflatten(in_tree, jax.device_put(flat_args, cpu))
        with jax.default_device(cpu):
            try:
                out = [np.asarray(v) for v in jax.tree_util.tree_leaves(function(*args, **kwargs))]
            except BaseException:
                log.exception("jax.pure_callback failed")
                raise
        if len(out) != len(results):
            raise RuntimeError(
                f"Mismatched number of outputs from callback. Expected: {len(results)}, Actual: {len(out)}"
            )
        for i, (value, (shape, dtype)) in enumerate(zip(out, results)):
            if value.shape != shape or value.dtype != dtype:
                raise RuntimeError(
                    f"Incorrect output of return value #{i}: expected {dtype}{list(shape)}, "
                    f"got {value.dtype}{list(value.shape)}"
                )
        return tuple(out)

    return call
