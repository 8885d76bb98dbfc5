"""The portable export of a program already lowered for its compile, with no second
trace and no second lowering (``jax._src.export._export._export_lowered``).

``jax.export.export(f)(*specs)`` traces ``f`` again and lowers it again; the only
public way to an ``Exported``. JAX's own ``export`` ends in the private
``_export_lowered(lowered, jaxpr, fun_name)``, which reads a ``stages.Lowered``:
its ``pxla.MeshComputation`` (module, compile arguments, platforms, devices), its
flat input avals and its trees. This module hands it the lowering the compile used,
through a copy of its module:

- without source locations (``strip-debuginfo``): the portable HLO must not depend
  on where it was lowered from (the same program under two names shares one blob);
- without donation attributes (``tf.aliasing_output``, ``jax.buffer_donor``), which
  ``jax.export`` never writes (a recompile donates through ``donate_argnums``);
- with flat input and output trees (the manifest records the pytrees), as the
  flat public export had.

The compile's module object is never modified (JAX's in-memory caches hold it).
Everything else (safety checks of the module, shardings as lowered, effects,
devices) is ``_export_lowered``'s own.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import jax

try:
    from jax._src.export import _export
    from jax._src.interpreters import mlir, pxla
    from jax._src.lib.mlir import ir, passmanager
except ImportError as exc:  # a JAX without the private route: export_lowered says so
    _ROUTE_IMPORT_ERROR: ImportError | None = exc
else:
    _ROUTE_IMPORT_ERROR = None

#: Argument attributes of a compile lowering that a portable export does not carry.
_DONATION_ATTRIBUTES = frozenset({"tf.aliasing_output", "jax.buffer_donor"})

#: Custom calls (Pallas kernels) that JAX lowers differently for an export (forward
#: compatible, ``LoweringParameters.for_export``): a module holding one is exported
#: through the public ``jax.export``, which lowers it so.
_EXPORT_SPECIFIC_TARGETS = (b"tpu_custom_call", b"mosaic_gpu", b"triton")


class ExportRouteUnavailable(Exception):
    """This program is exported through the public ``jax.export`` instead."""


def _portable_copy(module: Any) -> Any:
    """A copy of ``module`` without locations or donation."""
    bytecode = mlir.module_to_bytecode(module)
    if any(target in bytecode for target in _EXPORT_SPECIFIC_TARGETS):
        raise ExportRouteUnavailable("the module calls a kernel lowered differently for export")
    # In the module's own context (a new one costs as much as the rest of the copy);
    # _export_lowered moves the result into a context of its own.
    with module.context, ir.Location.unknown(module.context):
        copy = ir.Module.parse(bytecode)
        passmanager.PassManager.parse("builtin.module(strip-debuginfo)").run(copy.operation)
        main = ir.SymbolTable(copy.operation)["main"]
        arg_attrs: Any = getattr(main, "arg_attrs", None)  # an ArrayAttr of DictAttrs
        if arg_attrs is not None:
            rewritten = []
            changed = False
            for attrs in arg_attrs:
                entries = {a.name: a.attr for a in ir.DictAttr(attrs)}  # type: ignore[attr-defined]  # iterable; not in the stubs
                kept = {k: v for k, v in entries.items() if k not in _DONATION_ATTRIBUTES}
                changed = changed or len(kept) != len(entries)
                rewritten.append(ir.DictAttr.get(kept))
            if changed:
                setattr(main, "arg_attrs", ir.ArrayAttr.get(rewritten))  # a FuncOp's; not in OpView's stubs
    return copy


def _completed(lowered_shardings: Any, compiled: Sequence[Any] | None) -> Any:
    """The lowering's shardings, each one left unspecified replaced by the compiled
    executable's (what the compiler chose, as the public export was given)."""
    if compiled is None:
        return lowered_shardings
    compiled = tuple(compiled)
    if len(compiled) != len(lowered_shardings):
        raise ExportRouteUnavailable("the executable's shardings do not match the lowering's")
    return tuple(
        given if isinstance(given, jax.sharding.Sharding) else chosen
        for given, chosen in zip(lowered_shardings, compiled)
    )


def _high_types(lowered: Any) -> bool:
    """Whether ``lowered`` has "high" (unreduced) input or output types, which JAX
    0.12.1+ exports in place of the flat avals (release difference "Lowered._in_types";
    0.9-0.12.0 keep other data there, never read by the export)."""
    for types in (getattr(lowered, "_in_types", None), getattr(lowered, "_out_types", None)):
        if isinstance(types, tuple) and len(types) == 2 and isinstance(types[0], jax.tree_util.PyTreeDef):
            if any(getattr(aval, "is_high", False) for aval in types[1]):
                return True
    return False


def export_lowered(
    lowered: Any,
    in_shardings: Sequence[Any] | None = None,
    out_shardings: Sequence[Any] | None = None,
    fun_name: str = "flat_fn",
) -> Any:
    """A ``jax.export.Exported`` with flat inputs and outputs of ``lowered`` (a
    ``jax.stages.Lowered`` of ``jax.jit``, concrete shapes), from its own lowering.

    ``in_shardings`` (of the kept inputs) and ``out_shardings``: the compiled
    executable's, recorded for what the lowering left to the compiler.

    Raises what ``_export_lowered`` raises for a program it cannot export, and
    ``ImportError``/``AttributeError``/``TypeError`` when JAX's internals moved (the
    caller then exports through the public ``jax.export``).
    """
    if _ROUTE_IMPORT_ERROR is not None:
        raise _ROUTE_IMPORT_ERROR
    lowering = lowered._lowering
    if not isinstance(lowering, pxla.MeshComputation):
        raise ExportRouteUnavailable(f"only a jit lowering can be exported, not {type(lowering).__name__}")
    portable = pxla.MeshComputation(
        lowering._name,
        _portable_copy(lowering.stablehlo()),
        lowering.const_args,
        lowering._donated_invars,
        lowering._platforms,
        lowering._compiler_options_kvs,
        lowering._device_list,
        **{
            **lowering.compile_args,
            "in_shardings": _completed(lowering.compile_args["in_shardings"], in_shardings),
            "out_shardings": _completed(lowering.compile_args["out_shardings"], out_shardings),
        },
    )
    if _high_types(lowered):
        raise ExportRouteUnavailable("the program has unreduced (high) input or output types")
    flat_avals = tuple(jax.tree_util.tree_leaves(lowered.in_avals))
    out_count = lowered.out_tree.num_leaves
    view = SimpleNamespace(
        _lowering=portable,
        in_avals=(flat_avals, {}),
        in_tree=jax.tree_util.tree_structure((tuple(range(len(flat_avals))), {})),
        out_tree=jax.tree_util.tree_structure(tuple(range(out_count))),
        compile_args=lowering.compile_args,
        # Release difference "Lowered._in_types": JAX 0.12.1+'s _export_lowered reads
        # the lowered's "high" types (tree, avals) for unreduced shardings; None means
        # none, and a program that has some took the public route above. Earlier
        # releases never read them.
        _in_types=None,
        _out_types=None,
    )
    return _export._export_lowered(view, None, fun_name)  # type: ignore[arg-type]
