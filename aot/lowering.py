"""lower() and lower_pmap(): trace a function against explicit avals."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from aot.callbacks import bindable
from aot.callbacks import refusal as callback_refusal
from aot.computation import MeshComputation, PmapComputation
from aot.device import default_devices
from aot.errors import SpecError, SymbolicShapeError, UnsupportedComputationError
from aot.jaxcompat.callbacks import pure_callback_function
from aot.jaxcompat.lowering import all_equations, closed_over_constants, jit_settings, no_traceback_locations
from aot.jaxcompat.shape_poly import INCONCLUSIVE_DIMENSION
from aot.specs import format_aval, parse_partition_spec, spec
from aot.statics import StaticArg, sort_statics
from aot.symbolic import is_symbolic_shape, unify_scopes
from aot.targets import DeviceTarget, parse_target

log = logging.getLogger(__name__)

# Primitives that call back into the Python host process: an artifact loaded without
# the model's code has nothing to call.
_HOST_CALLBACK_PRIMITIVES = {
    "debug_callback": "jax.debug.callback / jax.debug.print",
    "debug_print": "jax.debug.print",
    "pure_callback": "jax.pure_callback",
    "io_callback": "jax.experimental.io_callback",
    "callback": "a host callback",
    "outside_call": "a host callback",
}


_Computation = TypeVar("_Computation", bound=MeshComputation)  # or PmapComputation

def default_name(fn: Callable[..., Any]) -> str:
    target = inspect.unwrap(fn) if callable(fn) else fn
    while isinstance(target, functools.partial):  # else every partial is "functools.partial"
        target = inspect.unwrap(target.func)
    module = getattr(target, "__module__", None) or "__main__"
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if qualname is None:
        qualname = type(target).__name__
    return f"{module}.{qualname}"


def _as_tuple(value: int | Iterable[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(value)


def _as_name_tuple(value: str | Iterable[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def _positional_names(fn: Callable[..., Any], count: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return [f"args[{i}]" for i in range(count)]
    names: list[str] = []
    for i in range(count):
        if i < len(params) and params[i].kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            names.append(params[i].name)
        else:
            names.append(f"args[{i}]")
    # The parameters after them that a caller may pass by position or by keyword: a
    # loaded entry maps such a call onto the form it was compiled with, as jax.jit does.
    for param in params[count:]:
        if param.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            break
        names.append(param.name)
    return names


def _infer_static(
    fn: Callable[..., Any], nums: set[int], names: set[str]
) -> tuple[set[int], set[str]]:
    """Completes static positions from names and names from positions, as jax.jit does.

    Without this, ``static_argnames="n"`` with ``n`` passed by position (or
    ``static_argnums=1`` with it passed by keyword) would trace ``n`` as an input.
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return nums, names
    positional = [
        name for name, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    nums = nums | {positional.index(n) for n in names if n in positional}
    names = names | {
        positional[i] for i in nums
        if i < len(positional) and params[positional[i]].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    }
    return nums, names


def _record_statics(
    name: str, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any],
    static_nums: set[int], static_names: set[str],
) -> tuple[StaticArg, ...]:
    """The static arguments' values, by position and name as jax.jit binds them."""
    try:
        params = inspect.signature(fn).parameters
        positional = [
            n for n, p in params.items()
            if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        positional = []
    out = [
        StaticArg.of(i, positional[i] if i < len(positional) else None, args[i], where=name)
        for i in sorted(static_nums) if i < len(args)
    ]
    out += [
        StaticArg.of(positional.index(k) if k in positional else None, k, kwargs[k], where=name)
        for k in sorted(static_names) if k in kwargs
    ]
    return sort_statics(out)


def _resolve_sharding(item: Any, mesh: Mesh | None) -> Any:
    if item is None or isinstance(item, Sharding):
        return item
    if isinstance(item, str):
        item = parse_partition_spec(item)
    if isinstance(item, PartitionSpec):
        if mesh is None:
            raise SpecError(
                f"sharding {item} is a PartitionSpec but no mesh was given; pass mesh="
            )
        return NamedSharding(mesh, item)
    raise SpecError(
        f"cannot use {item!r} as a sharding; expected a PartitionSpec, a Sharding, "
        "a string like 'data,None', or None"
    )


def _resolve_shardings(tree: Any, mesh: Mesh | None) -> Any:
    if tree is None:
        return None
    return jax.tree_util.tree_map(
        lambda s: _resolve_sharding(s, mesh),
        tree,
        is_leaf=lambda x: isinstance(x, (str, PartitionSpec, Sharding)) or x is None,
    )


def _check_servable(name: str, jaxpr: Any, *, pmap: bool = False) -> None:
    """Refuses host callbacks (but those aot.callbacks binds, except under pmap),
    ordered effects and closed-over refs at lowering time."""
    for eqn in all_equations(jaxpr):
        what = _HOST_CALLBACK_PRIMITIVES.get(eqn.primitive.name)
        if eqn.primitive.name == "pure_callback":
            function = pure_callback_function(eqn.params)
            why = bindable(function)
            if pmap:
                why = "callbacks are not bound under aot.lower_pmap (use aot.lower with a mesh)"
            if why is None:
                continue  # a library's callback, bound by name (aot.callbacks)
            raise callback_refusal(name, "pure_callback", function, why)
        if what is not None:
            raise UnsupportedComputationError(
                f"{name}: uses primitive {eqn.primitive.name!r} ({what}), which calls back "
                "into the Python host; an artifact cannot be served without the model's "
                "code. Remove it (or guard it behind a flag) before compiling ahead of time."
            )
    for const in closed_over_constants(jaxpr):
        if "Ref" in type(const).__name__ or "MutableArray" in type(const).__name__:
            raise UnsupportedComputationError(
                f"{name}: closes over a mutable array ref ({type(const).__name__}); pass "
                "its value as an argument instead"
            )
    effects = [e for e in jaxpr.effects]
    if effects:
        raise UnsupportedComputationError(
            f"{name}: has side effects {sorted(map(str, effects))} that an artifact cannot "
            "replay; remove ordered effects and callbacks before compiling ahead of time"
        )


def _specs_for(args: Sequence[Any], static: set[int], mesh: Mesh | None) -> list[Any]:
    return [a if i in static else spec(a, mesh=mesh) for i, a in enumerate(args)]


def _target_device(target: DeviceTarget | None, mesh: Mesh | None) -> Any:
    """The device a program lowered for ``target`` without a mesh is placed on (the
    target's first, as ``jax.jit`` places uncommitted inputs on the default device), or
    None (no target, or a mesh, which must then be over the target's devices).

    The specs are not given that device as a sharding: lowering under it as the default
    device leaves the in-shardings unspecified, so the StableHLO, the shardings and the
    program fingerprint are exactly those of the same program lowered on the chip itself
    (explicit ``SingleDeviceSharding``s add ``sdy.sharding`` attributes: one program,
    two keys, issue 43)."""
    if target is None:
        return None
    devices = target.devices()
    if mesh is not None:
        ids = {int(d.id) for d in devices}
        if mesh.devices.flat[0].platform != devices[0].platform or not {int(d.id) for d in mesh.devices.flat} <= ids:
            raise SpecError(
                f"the mesh's devices ({mesh.devices.flat[0].platform}) are not the target {target.name}'s; "
                f"build it over the target: aot.parse_target({target.name!r}).mesh({{...}})"
            )
        return None
    return devices[0]


def _on_device(device: Any) -> Any:
    """``jax.default_device(device)``, or nothing to do for None."""
    return jax.default_device(device) if device is not None else _nullcontext()


def _warn_one_chip(name: str, target: DeviceTarget | None, devices: Sequence[Any]) -> None:
    """A multi-chip target compiled without a mesh runs on one of its chips: say so,
    and how to use them all (nothing else tells the user before the chips sit idle)."""
    if target is None or target.chip_count <= 1 or len(devices) != 1:
        return
    log.warning(
        "%s: target %s has %d chips but no mesh was given: the program will run on one chip "
        "(device 0); to use all %d, lower it over a mesh of the target "
        "(mesh=aot.parse_target(%r).mesh({'data': %d}) with in_shardings) or give the manifest "
        "entry mesh = \"data=%d\" and in_shardings",
        name, target.name, target.chip_count, target.chip_count, target.name,
        target.chip_count, target.chip_count,
    )


def _export_flat(
    jitted: Any,
    in_tree: Any,
    arg_specs: list[Any],
    kwarg_specs: dict[str, Any],
    static_nums: set[int],
    static_names: set[str],
    mesh: Mesh | None,
    in_shardings: Sequence[Any],
    out_shardings: Sequence[Any],
) -> bytes:
    """Exports the program with flat inputs and outputs.

    The manifest records the pytree structure itself, so the portable HLO needs no
    pytree registrations (jax.export cannot serialize namedtuples or custom nodes
    unless they are registered in both processes).
    """
    # static_nums also holds the positions of static parameters passed by keyword
    # (jax.jit needs both forms); only those within the positional arguments count here.
    dynamic_args = [i for i in range(len(arg_specs)) if i not in static_nums]
    static_args = {i: arg_specs[i] for i in static_nums if i < len(arg_specs)}
    dynamic_kwargs = [k for k in kwarg_specs if k not in static_names]
    static_kwargs = {k: kwarg_specs[k] for k in static_names if k in kwarg_specs}

    def flat_fn(*leaves: Any) -> tuple[Any, ...]:
        args, kwargs = jax.tree_util.tree_unflatten(in_tree, leaves)
        full = dict(static_args)
        full.update(zip(dynamic_args, args))
        out = jitted(*(full[i] for i in range(len(arg_specs))), **kwargs, **static_kwargs)
        return tuple(jax.tree_util.tree_leaves(out))

    leaves = jax.tree_util.tree_leaves(
        ([arg_specs[i] for i in dynamic_args], {k: kwarg_specs[k] for k in dynamic_kwargs})
    )
    specs = [
        jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        for leaf, sharding in zip(leaves, in_shardings)
    ]
    flat_jit = jax.jit(flat_fn, out_shardings=tuple(out_shardings))
    # No Python tracebacks in the locations: the portable HLO must not depend on where
    # it was exported from (the same program under two names shares one blob).
    with no_traceback_locations():
        with jax.set_mesh(mesh) if mesh is not None else _nullcontext():
            exported = jax.export.export(flat_jit)(*specs)
    return bytes(exported.serialize())


def lower(
    fn: Callable[..., Any],
    *args: Any,
    name: str | None = None,
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Sequence[str] = (),
    donate_argnums: int | Sequence[int] = (),
    mesh: Mesh | None = None,
    in_shardings: Any = None,
    out_shardings: Any = None,
    compiler_options: dict[str, Any] | None = None,
    target: str | DeviceTarget | None = None,
    **kwargs: Any,
) -> MeshComputation:
    """Traces and lowers ``fn`` with ``jax.jit`` against explicit avals.

    ``args`` and ``kwargs`` are spec strings (``"f32[8,128]"``), ``ShapeDtypeStruct``s,
    arrays or pytrees of them; static arguments are passed as their values.
    ``target`` (``"tpu:v5e:2x2"``, :mod:`aot.targets`) lowers for that accelerator
    instead of this host's devices: ``compile()`` then compiles without it, and the
    computation's environment is the target's.
    """
    device_target = parse_target(target) if target is not None else None
    if device_target is None:
        # This host's backend, started here rather than somewhere inside JAX's tracing:
        # quietly (libtpu's start-up noise) and, for a held chip, as DeviceBusyError.
        default_devices()
    name = name or default_name(fn)
    fn, static_argnums, static_argnames, donate_argnums, donate_argnames = _unwrap_jit(
        name, fn, static_argnums, static_argnames, donate_argnums
    )
    static_nums = {i if i >= 0 else len(args) + i for i in _as_tuple(static_argnums)}
    static_names = set(_as_name_tuple(static_argnames))
    static_nums, static_names = _infer_static(fn, static_nums, static_names)
    arg_specs = _specs_for(args, static_nums, mesh)
    kwarg_specs = {k: v if k in static_names else spec(v, mesh=mesh) for k, v in kwargs.items()}
    arg_specs, kwarg_specs = _unify_symbolic(name, arg_specs, kwarg_specs, static_nums, static_names)
    jitted = jax.jit(
        fn,
        static_argnums=tuple(sorted(static_nums)),
        static_argnames=tuple(sorted(static_names)),
        donate_argnums=_as_tuple(donate_argnums),
        donate_argnames=donate_argnames,
        in_shardings=_resolve_shardings(in_shardings, mesh),
        out_shardings=_resolve_shardings(out_shardings, mesh),
    )
    arg_names = [n for i, n in enumerate(_positional_names(fn, len(args))) if i not in static_nums]
    statics = _record_statics(name, fn, args, kwargs, static_nums, static_names)
    try:
        computation = _trace_and_lower(
            MeshComputation, name, jitted, arg_specs, kwarg_specs, static_nums, static_names,
            mesh, arg_names, {"compiler_options": compiler_options}, statics, device_target,
        )
    except (RuntimeError, SystemError) as exc:  # jaxlib 0.12's nanobind wraps JAX's RuntimeError in a SystemError
        failure = device_target.room.lowering_error(name, device_target.name, exc) if device_target is not None else None
        if failure is None:
            raise
        raise failure from None
    _warn_one_chip(name, device_target, computation.devices)
    return computation


def _unwrap_jit(
    name: str, fn: Callable[..., Any], static_argnums: int | Sequence[int],
    static_argnames: str | Sequence[str], donate_argnums: int | Sequence[int],
) -> tuple[Callable[..., Any], Any, Any, Any, tuple[str, ...]]:
    """A function already wrapped in ``jax.jit``: its own function, with the static and
    donated arguments the wrapper was given (a jit inside the lowering's jit would drop
    its donation: the served program would keep inputs that jax.jit deletes). Settings
    given to the lowering too must agree with the wrapper's."""
    found = jit_settings(fn)
    if found is None:
        return fn, static_argnums, static_argnames, donate_argnums, ()
    wrapped, settings = found
    given: dict[str, tuple[Any, ...]] = {
        "static_argnums": _as_tuple(static_argnums),
        "static_argnames": _as_name_tuple(static_argnames),
        "donate_argnums": _as_tuple(donate_argnums),
    }
    for option, value in given.items():
        if value and settings[option] and tuple(sorted(value)) != tuple(sorted(settings[option])):
            raise UnsupportedComputationError(
                f"{name}: {option}={list(value)} was given, but the function is already "
                f"wrapped in jax.jit with {option}={list(settings[option])}; give it once "
                "(pass the unwrapped function, or drop the argument here)"
            )
    return (
        wrapped,
        given["static_argnums"] or settings["static_argnums"],
        given["static_argnames"] or settings["static_argnames"],
        given["donate_argnums"] or settings["donate_argnums"],
        () if given["donate_argnums"] else settings["donate_argnames"],
    )


def _refuse_pmap_across_processes(name: str, devices: Sequence[Any] | None) -> None:
    """``jax.pmap`` in a multi-process job maps every device of the job (each process
    passes its own rows); the ``jit(pmap)`` a PmapComputation is traced from maps this
    process's devices only, so its collectives would silently reduce over one process
    (measured with jax 0.10.2 on 2 processes: a psum of 2 devices, not 4). Refused until
    it is served right; ``devices=jax.local_devices()`` (a pmap per process) is fine."""
    spans = (
        {int(d.process_index) for d in devices} if devices is not None
        else set(range(jax.process_count()))
    )
    if len(spans) > 1:
        raise UnsupportedComputationError(
            f"{name}: a pmap across the {len(spans)} processes of this job is not supported "
            "(its collectives would reduce over this process's devices only, unlike jax.pmap's). "
            "Lower it with aot.lower over a Mesh spanning the processes (jax.shard_map for the "
            "collectives), or pass devices=jax.local_devices() for a pmap within each process"
        )


def _check_pmap_devices(
    name: str, arg_specs: list[Any], static: set[int], in_axes: Any, devices: Sequence[Any] | None
) -> None:
    """A mapped axis longer than the devices there are fails deep in JAX; say it here.
    So does a pmap across the processes of a job, which would compute the wrong thing."""
    _refuse_pmap_across_processes(name, devices)
    available = len(devices) if devices is not None else jax.local_device_count()
    axes = in_axes if isinstance(in_axes, (list, tuple)) else [in_axes] * len(arg_specs)
    for i, (spec_tree, axis) in enumerate(zip(arg_specs, axes)):
        if i in static or not isinstance(axis, int):
            continue
        for leaf in jax.tree_util.tree_leaves(spec_tree):
            shape = getattr(leaf, "shape", ())
            if len(shape) > axis and shape[axis] > available:
                raise UnsupportedComputationError(
                    f"{name}: pmap maps axis {axis} of size {shape[axis]} (argument {i}, "
                    f"{leaf.dtype}{list(shape)}), but only {available} device(s) are available. Run on a host with {shape[axis]} devices (on CPU: "
                    f"XLA_FLAGS=--xla_force_host_platform_device_count={shape[axis]})"
                )


def lower_pmap(
    fn: Callable[..., Any],
    *args: Any,
    axis_name: str | None = None,
    in_axes: Any = 0,
    out_axes: Any = 0,
    static_broadcasted_argnums: int | Sequence[int] = (),
    donate_argnums: int | Sequence[int] = (),
    devices: Sequence[Any] | None = None,
    name: str | None = None,
    compiler_options: dict[str, Any] | None = None,
) -> PmapComputation:
    """Traces and lowers ``jax.pmap(fn)`` (wrapped in ``jax.jit``) against explicit avals."""
    default_devices()  # as lower() does
    name = name or default_name(fn)
    static = set(_as_tuple(static_broadcasted_argnums))
    pmapped = jax.pmap(
        fn,
        axis_name=axis_name,
        in_axes=in_axes,
        out_axes=out_axes,
        static_broadcasted_argnums=tuple(sorted(static)),
        donate_argnums=_as_tuple(donate_argnums),
        devices=devices,
    )
    # The outer jit must donate too: pmap's own donate_argnums is ignored under jit.
    jitted = jax.jit(
        pmapped,
        static_argnums=tuple(sorted(static)),
        donate_argnums=_as_tuple(donate_argnums),
    )
    arg_specs = _specs_for(args, static, None)
    _refuse_symbolic_pmap(name, arg_specs, static)
    _check_pmap_devices(name, arg_specs, static, in_axes, devices)
    arg_names = [n for i, n in enumerate(_positional_names(fn, len(args))) if i not in static]
    statics = _record_statics(name, fn, args, {}, static, set())
    return _trace_and_lower(
        PmapComputation, name, jitted, arg_specs, {}, static, set(), None, arg_names,
        {"compiler_options": compiler_options}, statics,
    )


def _trace_and_lower(
    cls: type[_Computation],
    name: str,
    jitted: Any,
    arg_specs: list[Any],
    kwarg_specs: dict[str, Any],
    static_nums: set[int],
    static_names: set[str],
    mesh: Mesh | None,
    arg_names: list[str],
    options: dict[str, Any],
    statics: tuple[StaticArg, ...] = (),
    target: DeviceTarget | None = None,
) -> _Computation:
    device = _target_device(target, mesh)
    context = jax.set_mesh(mesh) if mesh is not None else _nullcontext()
    with context, _on_device(device):
        try:
            traced = jitted.trace(*arg_specs, **kwarg_specs)
            _check_servable(name, traced.jaxpr, pmap=cls.kind == "pmap")
            lowered = traced.lower()
        except UnsupportedComputationError:
            raise
        except Exception as exc:
            symbolic_error = _symbolic_lowering_error(
                name, exc, _dynamic_leaves(arg_specs, kwarg_specs, static_nums, static_names)
            )
            if symbolic_error is None:
                raise
            raise symbolic_error from exc

    in_tree = lowered.in_tree

    def export(
        in_shardings: Sequence[Any], out_shardings: Sequence[Any], *, mesh_context: bool = True
    ) -> bytes:
        # Traced again by jax.export: on the target's device too, as lowered above.
        with _on_device(device):
            return _export_flat(
                jitted, in_tree, arg_specs, kwarg_specs, static_nums, static_names,
                mesh if mesh_context else None, in_shardings, out_shardings,
            )

    log.debug("lowered %s", name)
    return cls(name, lowered, arg_names=arg_names, export=export, options=options, statics=statics, target=target)


# ---------------------------------------------------------------- symbolic shapes


def _dynamic_leaves(
    arg_specs: Sequence[Any], kwarg_specs: dict[str, Any], static_nums: set[int],
    static_names: Iterable[str] = (),
) -> list[Any]:
    static_names = set(static_names)
    dynamic = (
        [a for i, a in enumerate(arg_specs) if i not in static_nums],
        {k: v for k, v in kwarg_specs.items() if k not in static_names},
    )
    return [leaf for leaf in jax.tree_util.tree_leaves(dynamic) if isinstance(leaf, jax.ShapeDtypeStruct)]


def _unify_symbolic(
    name: str,
    arg_specs: list[Any],
    kwarg_specs: dict[str, Any],
    static_nums: set[int],
    static_names: set[str],
) -> tuple[list[Any], dict[str, Any]]:
    """Puts every symbolic dimension of the inputs in one jax.export scope.

    Spec strings share one scope already; structs made with
    ``jax.export.symbolic_shape`` bring their own, which jax.export refuses to mix.
    """
    leaves = _dynamic_leaves(arg_specs, kwarg_specs, static_nums, static_names)
    if not any(is_symbolic_shape(leaf.shape) for leaf in leaves):
        return arg_specs, kwarg_specs
    unified = iter(unify_scopes(leaves, name=name))
    replace = {id(leaf): next(unified) for leaf in leaves}

    def swap(tree: Any) -> Any:
        return jax.tree_util.tree_map(
            lambda x: replace.get(id(x), x), tree,
            is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct),
        )

    new_args = [a if i in static_nums else swap(a) for i, a in enumerate(arg_specs)]
    new_kwargs = {k: v if k in static_names else swap(v) for k, v in kwarg_specs.items()}
    return new_args, new_kwargs


def _refuse_symbolic_pmap(name: str, arg_specs: Sequence[Any], static: set[int]) -> None:
    for leaf in _dynamic_leaves(arg_specs, {}, static):
        if is_symbolic_shape(leaf.shape):
            raise SymbolicShapeError(
                f"{name}: pmap cannot be lowered for symbolic shapes "
                f"({format_aval(leaf.shape, leaf.dtype, leaf.weak_type)}); use aot.lower with a mesh (jit "
                "with shardings or shard_map) for shape-polymorphic programs, or compile "
                "concrete pmap buckets"
            )


def _symbolic_lowering_error(
    name: str, exc: Exception, leaves: Sequence[Any]
) -> SymbolicShapeError | None:
    """A clear error for a program that cannot be shape-polymorphic, else None."""
    if not any(is_symbolic_shape(leaf.shape) for leaf in leaves):
        return None
    message = str(exc)
    if not (
        isinstance(exc, INCONCLUSIVE_DIMENSION)
        or "symbolic" in message.lower()
        or "DimExpr" in message
    ):
        return None
    reason = message.split("\nThis error arises")[0].strip().splitlines()[0]
    signature = ", ".join(format_aval(leaf.shape, leaf.dtype, leaf.weak_type) for leaf in leaves)
    return SymbolicShapeError(
        f"{name}: cannot be lowered for the symbolic shapes ({signature}): {reason}. "
        "The program needs a property of the symbolic dimensions that jax.export cannot "
        "prove for every value: declare it as a constraint (aot.spec(..., "
        "constraints=['b >= 4']) or jax.export.symbolic_shape(..., constraints=[...])), "
        "make that dimension concrete, or compile concrete shape buckets instead"
    )


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
