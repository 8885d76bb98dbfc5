"""Resolving warmup items: import their Python functions, build specs, meshes and shardings.

Used by ``aot warmup``, ``aot compile`` and ``aot why``: a :class:`WarmupItem` (plain
data) becomes the function and the arguments :func:`aot.cache.compiling.compile_entry` takes.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aot.errors import AotError, ManifestError, SpecError, TargetError
from aot.cache.index.refs import RefOrigin
from aot.cache.warmup.manifest import AUTO_SHARDING, WarmupItem

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore
    from aot.cache.compiling import CompileResult

__all__ = [
    "Prepared",
    "compile_item",
    "compile_function",
    "function_item",
    "x64_hint",
    "x64_mode",
    "item_environment",
    "item_signature",
    "lower_item",
    "make_mesh",
    "place_statics",
    "prepare",
    "remembering_specs",
    "resolve_args",
    "resolve_function",
    "search_path",
]


@contextlib.contextmanager
def search_path(*folders: str | None) -> Iterator[None]:
    """Puts ``folders`` (and the working directory) first on ``sys.path`` for a while."""
    added = []
    for folder in (*folders, os.getcwd()):
        if folder and folder not in sys.path:
            sys.path.insert(0, folder)
            added.append(folder)
    try:
        yield
    finally:
        for folder in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)


def resolve_function(function: str, *, base_dir: str | None = None) -> Any:
    """``"package.module:attr.sub"`` -> the object; raises :class:`TargetError`."""
    module_name, sep, attr_path = function.partition(":")
    if not sep or not module_name or not attr_path:
        raise TargetError(
            f"function {function!r} is not MODULE:ATTRIBUTE (e.g. 'fixtures.models:mlp_forward')"
        )
    with search_path(base_dir):
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or module_name
            hint = (
                "run from the folder that contains it, or install it"
                if missing == module_name.split(".")[0] or missing == module_name
                else "it is imported by that module; install it"
            )
            close = _close(missing, _local_modules(base_dir)) if missing == module_name.split(".")[0] else ""
            raise TargetError(
                f"cannot import {module_name!r} for {function!r}: no module named {missing!r}{close}; {hint}"
            ) from None
        except AotError:
            raise
        except Exception as exc:  # noqa: BLE001 - the module's own import failed
            raise TargetError(
                f"importing {module_name!r} for {function!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise TargetError(
                f"{function!r}: module {module_name!r} has no attribute {attr_path!r}{_close(part, names)}"
            ) from None
    return obj


def _close(name: str, names: Iterable[str]) -> str:
    """`` (did you mean 'forward'?)`` when a name of ``names`` is close to ``name``."""
    import difflib

    # Each name once: the manifest's folder is often the working directory too.
    close = difflib.get_close_matches(name, list(dict.fromkeys(names)), n=3)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def _local_modules(base_dir: str | None) -> list[str]:
    """The modules and packages in the folders :func:`search_path` puts first."""
    names: list[str] = []
    for folder in (base_dir, os.getcwd()):
        try:
            entries = os.listdir(folder) if folder else []
        except OSError:
            continue
        for entry in entries:
            if entry.endswith(".py"):
                names.append(entry[:-3])
            elif os.path.isfile(os.path.join(folder, entry, "__init__.py")):  # type: ignore[arg-type]
                names.append(entry)
    return names


# ``@module:callable`` results remembered for the length of one warm-up: the callable
# of a function with many buckets (``jax.eval_shape`` of a model's init, a trace of its
# own) is called once, not once per bucket. Keyed by the callable, the folder it was
# imported from and the x64 mode it ran in.
_SPEC_MEMO: ContextVar[dict[tuple[Any, ...], Any] | None] = ContextVar("aot_spec_memo", default=None)


@contextlib.contextmanager
def remembering_specs() -> Iterator[None]:
    """Within this block each ``@module:callable`` spec is called once (per x64 mode)."""
    token = _SPEC_MEMO.set({})
    try:
        yield
    finally:
        _SPEC_MEMO.reset(token)


def _call_spec_callable(spec_callable: str, base_dir: str | None) -> Any:
    import jax

    memo = _SPEC_MEMO.get()
    key = (spec_callable, base_dir, bool(getattr(jax.config, "jax_enable_x64")))
    if memo is not None and key in memo:
        return memo[key]
    fn = resolve_function(spec_callable, base_dir=base_dir)
    if not callable(fn):
        raise TargetError(f"{'@' + spec_callable!r} is not callable; '@' names a function returning specs")
    try:
        tree = fn()
    except AotError:
        raise
    except Exception as exc:  # noqa: BLE001 - user code
        raise TargetError(f"calling {spec_callable!r} failed: {type(exc).__name__}: {exc}") from exc
    if memo is not None:
        memo[key] = tree
    return tree


def _resolve_spec(value: str, base_dir: str | None, mesh: Any) -> Any:
    from aot.specs import spec

    if value.startswith("@"):
        return spec(_call_spec_callable(value[1:], base_dir), mesh=mesh)
    return spec(value, mesh=mesh)


def resolve_args(
    args: Sequence[str] = (),
    kwargs: Iterable[tuple[str, str]] = (),
    args_from: str | None = None,
    *,
    base_dir: str | None = None,
    mesh: Any = None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Spec strings / ``@callable`` s -> ``(args, kwargs)`` of ``jax.ShapeDtypeStruct`` trees.

    ``args_from`` names a callable whose result comes first: a tuple is several
    positional arguments, anything else is one.
    """
    positional: list[Any] = []
    if args_from is not None:
        tree = _resolve_spec("@" + args_from.lstrip("@"), base_dir, mesh)
        positional.extend(tree if isinstance(tree, tuple) else (tree,))
    positional.extend(_resolve_spec(a, base_dir, mesh) for a in args)
    return tuple(positional), {k: _resolve_spec(v, base_dir, mesh) for k, v in kwargs}


def make_mesh(axes: Sequence[tuple[str, int]], device_target: str | None = None) -> Any:
    """A ``jax.sharding.Mesh`` over the first ``prod(sizes)`` devices (of the device
    target, when given: :meth:`aot.targets.DeviceTarget.mesh`)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    if device_target is not None:
        from aot.targets import parse_target

        return parse_target(device_target).mesh(axes)

    sizes = [s for _, s in axes]
    count = int(np.prod(sizes))
    devices = jax.devices()
    if count > len(devices):
        raise SpecError(
            f"mesh {','.join(f'{n}={s}' for n, s in axes)} needs {count} devices; "
            f"this host has {len(devices)} ({devices[0].platform})"
        )
    grid = np.asarray(devices[:count], dtype=object).reshape(sizes)
    return Mesh(grid, tuple(n for n, _ in axes))


def _sharding_value(text: str) -> Any:
    from aot.specs import parse_partition_spec

    return None if text.strip().lower() == AUTO_SHARDING else parse_partition_spec(text)


@dataclass(frozen=True)
class Prepared:
    """An item resolved into what :func:`aot.cache.compiling.compile_entry` takes."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    options: dict[str, Any] = field(default_factory=dict)


def item_environment(cache: ArtifactStore, item: WarmupItem) -> Any:
    """The environment fingerprint ``item`` is compiled for: its device target's, or
    this host's (:attr:`ArtifactStore.environment`)."""
    if item.device_target is None:
        return cache.environment
    from aot.fingerprint import environment_fingerprint
    from aot.targets import parse_target

    return environment_fingerprint(devices=parse_target(item.device_target).devices())


def x64_mode(item: WarmupItem) -> contextlib.AbstractContextManager[Any]:
    """``jax.enable_x64(True)`` for an item with ``x64 = true``; else the process's mode."""
    if not item.x64:
        return contextlib.nullcontext()
    import jax

    return jax.enable_x64(True)


_WIDE_DTYPE = re.compile(r"(?<![A-Za-z0-9_])(f64|i64|u64|c128|float64|int64|uint64|complex128)\s*\[")


def x64_hint(item: WarmupItem, exc: SpecError) -> SpecError:
    """A spec error of an item that names a 64-bit dtype without ``x64`` (refused, never
    narrowed to 32 bits): the same error, saying how to opt in for this entry."""
    texts = [*item.args, *(v for _, v in item.kwargs)]
    if item.x64 or not any(_WIDE_DTYPE.search(t) for t in texts):
        return exc
    message = str(exc)
    if not (_WIDE_DTYPE.search(message) or "x64" in message or "64-bit" in message):
        return exc  # about something else
    if "x64" in str(exc) and "--x64" in str(exc):
        return exc
    return SpecError(
        f"{exc} (to compile this entry with 64-bit types, set x64 = true in its "
        "[[function]] table, or pass --x64 to aot compile)"
    )


def _positional_names(fn: Callable[..., Any], count: int) -> list[str]:
    import inspect

    try:
        params = [
            p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"args[{i}]" for i in range(count)]


def prepare(item: WarmupItem) -> Prepared:
    """Imports the function, resolves ``@callable`` specs, builds the mesh and shardings.

    Raises :class:`aot.ManifestError` when ``in_shardings`` does not give one entry per
    positional argument (a usage error, said before JAX sees it)."""
    if item.pmap is not None and item.device_target is not None:
        raise ManifestError(
            "pmap entries are compiled for this host's devices only, not for "
            "a device target; lower it with a mesh instead (mesh = \"i=N\")"
        )
    fn = resolve_function(item.function, base_dir=item.base_dir)
    if not callable(fn):
        raise TargetError(f"function {item.function!r} is a {type(fn).__name__}, not a function")
    mesh = make_mesh(item.mesh, item.device_target) if item.mesh is not None else None
    try:
        args, kwargs = resolve_args(item.args, item.kwargs, item.args_from, base_dir=item.base_dir, mesh=mesh)
    except SpecError as exc:
        raise x64_hint(item, exc) from None
    if item.in_shardings is not None and len(item.in_shardings) != len(args):
        names = ", ".join(_positional_names(fn, len(args)))
        problem = (
            f"{len(item.in_shardings)} in_shardings for {len(args)} positional argument"
            f"{'s' if len(args) != 1 else ''} ({names}); give one per positional argument "
            "('' for replicated, 'auto' to let the compiler choose)"
        )
        error = ManifestError(f"{item.label}: {problem}")
        error.problem = problem  # type: ignore[attr-defined]
        raise error
    options: dict[str, Any] = {"name": item.name}
    if item.device_target is not None:
        options["target"] = item.device_target
    if item.donate:
        options["donate_argnums"] = item.donate
    if item.pmap is not None:
        options["pmap"] = True
        options["axis_name"] = item.pmap
        return Prepared(fn, args, options)
    options.update(kwargs)
    if item.static:
        args, statics = place_statics(fn, args, dict(item.static))
        options.update(statics)
    if mesh is not None:
        options["mesh"] = mesh
    if item.in_shardings is not None:
        options["in_shardings"] = tuple(_sharding_value(s) for s in item.in_shardings)
    if item.out_shardings is not None:
        out = item.out_shardings
        options["out_shardings"] = (
            tuple(_sharding_value(s) for s in out) if isinstance(out, tuple) else _sharding_value(out)
        )
    return Prepared(fn, args, options)


def place_statics(
    fn: Callable[..., Any], args: Sequence[Any], statics: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Puts static values (``--static NAME=JSON``, a manifest's ``static = {...}``) where
    ``fn`` takes them: ``args`` lists the dynamic positional arguments in order.

    A static parameter that comes before the last dynamic positional argument, or that
    is positional-only, is inserted at its position (``static_argnums``); the others
    are passed by keyword (``static_argnames``). Returns the new positional arguments
    and the options for :func:`aot.lower`: the values by keyword, ``static_argnums``
    and ``static_argnames``.
    """
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature: keywords, as written
        params = []
    unknown = [n for n in statics if n not in {p.name for p in params}]
    if params and unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        raise TargetError(
            f"static {', '.join(map(repr, unknown))} is not a parameter of {getattr(fn, '__qualname__', fn)} "
            f"(its parameters: {', '.join(p.name for p in params)})"
        )
    positional_kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    dynamic = list(args)
    placed: list[Any] = []
    nums: list[int] = []
    remaining = dict(statics)
    for param in params:
        if param.kind not in positional_kinds:
            break
        if param.name in remaining:
            needed = bool(dynamic) or param.kind is inspect.Parameter.POSITIONAL_ONLY
            if not needed:
                break  # nothing dynamic follows: by keyword
            nums.append(len(placed))
            placed.append(remaining.pop(param.name))
        elif dynamic:
            placed.append(dynamic.pop(0))
        else:
            break
    placed.extend(dynamic)
    options: dict[str, Any] = dict(remaining)
    if nums:
        options["static_argnums"] = tuple(nums)
    if remaining:
        options["static_argnames"] = tuple(remaining)
    return tuple(placed), options


def compile_item(cache: ArtifactStore, item: WarmupItem, *, origin: RefOrigin | None = None) -> CompileResult:
    """Lowers ``item``; loads it on a hit, compiles and stores it on a miss (under
    :func:`x64_mode`); sets its ref (``origin``: who sets it)."""
    from aot.cache.compiling import compile_entry

    with x64_mode(item):
        prepared = prepare(item)
        try:
            return compile_entry(cache, prepared.fn, *prepared.args, origin=origin, **prepared.options)
        except SpecError as exc:  # e.g. a 64-bit dtype refused while lowering
            raise x64_hint(item, exc) from None


def function_item(
    function: str,
    *,
    args: Sequence[str] = (),
    kwargs: Iterable[tuple[str, str]] = (),
    args_from: str | None = None,
    static: Iterable[tuple[str, Any]] = (),
    name: str | None = None,
    pmap: str | None = None,
    mesh: Sequence[tuple[str, int]] | None = None,
    in_shardings: Sequence[str] = (),
    out_shardings: Sequence[str] = (),
    donate: Sequence[int] = (),
    x64: bool = False,
    device_target: str | None = None,
) -> WarmupItem:
    """The warm-up item a command line describes (``aot compile``, ``aot why
    --function``): one function for one set of specs, as a manifest's entry would be.

    ``name`` defaults to the function with ``:`` replaced by ``.``; one ``out_shardings``
    applies to every output, several form a tuple. Raises :class:`aot.ManifestError`
    for inconsistent options (a usage error) before importing anything."""
    return WarmupItem(
        name=name or function.replace(":", "."),
        function=function,
        args=tuple(args),
        args_from=args_from,
        kwargs=tuple(kwargs),
        static=tuple(static),
        pmap=pmap,
        mesh=tuple(mesh) if mesh is not None else None,
        in_shardings=tuple(in_shardings) or None,
        out_shardings=(
            None if not out_shardings
            else out_shardings[0] if len(out_shardings) == 1 else tuple(out_shardings)
        ),
        donate=tuple(donate),
        x64=x64,
        device_target=device_target,
    )


def compile_function(
    cache: ArtifactStore, function: str, *, origin: RefOrigin | None = None, **options: Any,
) -> CompileResult:
    """``aot compile``: the item :func:`function_item` makes of ``options``, compiled
    as a warm-up compiles it."""
    item = function_item(function, **options)
    return compile_item(cache, item, origin=origin if origin is not None else RefOrigin("compile"))


def item_signature(item: WarmupItem) -> str:
    """The input signature ``item`` compiles to (``"f32[8,784], ..., act='relu'"``),
    without lowering (statics: the function is imported for their positions)."""
    from aot.statics import with_statics

    import jax

    from aot.specs import format_aval

    with x64_mode(item):
        mesh = make_mesh(item.mesh, item.device_target) if item.mesh is not None else None
        try:
            args, kwargs = resolve_args(
                item.args, item.kwargs, item.args_from, base_dir=item.base_dir, mesh=mesh
            )
        except SpecError as exc:
            raise x64_hint(item, exc) from None
        leaves = jax.tree_util.tree_leaves((args, [kwargs[k] for k in sorted(kwargs)]))
        avals = ", ".join(format_aval(leaf.shape, leaf.dtype, leaf.weak_type) for leaf in leaves)
    return with_statics(avals, _item_statics(item)) if item.static else avals


def _item_statics(item: WarmupItem) -> tuple[Any, ...]:
    """The statics an item's entry records (aot.statics): positions from the function."""
    import inspect

    from aot.statics import StaticArg, canonical_text, sort_statics

    try:
        params = inspect.signature(resolve_function(item.function, base_dir=item.base_dir)).parameters
        positional = [
            n for n, p in params.items()
            if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        positional = []
    return sort_statics(
        StaticArg(positional.index(k) if k in positional else None, k, canonical_text(v) or repr(v))
        for k, v in item.static
    )


def lower_item(item: WarmupItem) -> Any:
    """``item``'s function lowered as the warm-up lowers it (jit or pmap; in the
    caller's x64 mode): a :class:`~aot.computation.MeshComputation`."""
    from aot.lowering import lower, lower_pmap

    prepared = prepare(item)
    options = dict(prepared.options)
    pmap = options.pop("pmap", False)
    return (lower_pmap if pmap else lower)(prepared.fn, *prepared.args, **options)
