"""MeshComputation and PmapComputation: lowered, fingerprinted, compilable programs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import jax
from jax.tree_util import PyTreeDef

from aot import platforms, treedef as treedefs
from aot.callbacks import bind as bind_callbacks
from aot.constants import PART as CONSTANTS_PART, lowered_part
from aot.errors import SymbolicShapeError, UnsupportedComputationError
from aot.executable import ArgAval, ExecutableInfo, MeshExecutable, arg_paths, executable_class
from aot.fingerprint import (
    Fingerprint,
    canonical_json,
    combined_key,
    environment_fingerprint,
    program_fingerprint,
    sha256_hex,
)
from aot.jaxcompat.callbacks import lowered_callbacks
from aot.jaxcompat.build import (
    built_unloaded_executable,
    compile_args,
    compile_uncached,
    lowered_devices,
    lowering_constants,
    unloaded_executable,
)
from aot.jaxcompat.shape_poly import INCONCLUSIVE_DIMENSION
from aot.platforms.tuning import Tuning
from aot.shardings import sharding_to_json
from aot.specs import format_aval
from aot.statics import StaticArg, with_statics
from aot.symbolic import constraints_of, is_symbolic_dim, is_symbolic_shape
from aot.targets import DeviceTarget

log = logging.getLogger(__name__)


class MeshComputation:
    """A function lowered with ``jax.jit`` against explicit avals (optionally on a mesh)."""

    kind = "jit"

    def __init__(
        self,
        name: str,
        lowered: jax.stages.Lowered,
        *,
        arg_names: Sequence[str],
        export: Callable[..., bytes],  # (in_shardings, out_shardings, *, mesh_context=True)
        options: dict[str, Any],
        statics: Sequence[StaticArg] = (),
        target: DeviceTarget | None = None,
    ) -> None:
        self.name = name
        # The accelerator compiled for when it is not this host's (aot.targets).
        self.target = target
        # The static arguments' values (aot.statics): part of the signature and the key.
        self.statics = tuple(statics)
        self.lowered = lowered
        # What a GPU compile was tuned with (aot.platforms.cuda.compile_tuned), set by compile().
        self.tuning: Tuning | None = None
        self.arg_names = tuple(arg_names)
        self._export = export
        self._options = options
        self._compile_args = compile_args(lowered)
        # Closed-over arrays JAX hoisted into leading arguments (aot.constants): the
        # compile arguments list them before the function's own.
        self.constants = lowering_constants(lowered)
        # The fingerprints are computed lazily, but must describe the configuration
        # the program was lowered under (x64, XLA flags), not the one current when
        # they are first read.
        self._x64 = bool(getattr(jax.config, "jax_enable_x64"))
        self._environment = environment_fingerprint(devices=target.devices() if target is not None else None)

    # -- structure
    @property
    def in_tree(self) -> PyTreeDef:
        return self.lowered.in_tree

    @property
    def out_tree(self) -> PyTreeDef:
        return self.lowered.out_tree

    @cached_property
    def _args_info(self) -> list[Any]:
        return jax.tree_util.tree_leaves(
            self.lowered.args_info, is_leaf=lambda x: isinstance(x, jax.stages.ArgInfo)
        )

    @property
    def in_avals(self) -> tuple[jax.ShapeDtypeStruct, ...]:
        """Global avals of every flat input, dead ones included (weak types kept: a
        Python scalar argument is a weakly typed input, as under jax.jit)."""
        return tuple(
            jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=_weak(a)) for a in self._args_info
        )

    @property
    def out_avals(self) -> tuple[jax.ShapeDtypeStruct, ...]:
        return tuple(
            jax.ShapeDtypeStruct(a.shape, a.dtype) for a in self._compile_args["global_out_avals"]
        )

    def per_input(self, name: str) -> list[Any]:
        """A compile argument's per-input list without the hoisted constants' entries."""
        return list(self._compile_args[name])[len(self.constants):]

    @property
    def donated(self) -> tuple[bool, ...]:
        return tuple(bool(a.donated) for a in self._args_info)

    @property
    def kept(self) -> frozenset[int]:
        """Indices of the flat inputs the program uses (jit drops the others)."""
        skip = len(self.constants)
        return frozenset(int(i) - skip for i in self._compile_args["kept_var_idx"] if int(i) >= skip)

    @property
    def in_shardings(self) -> tuple[Any, ...]:
        """Shardings of the kept inputs as lowered (may be unspecified before compile)."""
        return tuple(self.per_input("in_shardings"))

    @property
    def out_shardings(self) -> tuple[Any, ...]:
        return tuple(self._compile_args["out_shardings"])

    @property
    def devices(self) -> tuple[Any, ...]:
        return lowered_devices(self.lowered)

    @property
    def avals_signature(self) -> str:
        """The input avals alone (the program fingerprint's ``in_avals`` part)."""
        return ", ".join(format_aval(a.shape, a.dtype, a.weak_type) for a in self.in_avals)

    @property
    def signature(self) -> str:
        """The input avals, then the statics: ``f32[8,784], act='relu'``."""
        return with_statics(self.avals_signature, self.statics)

    def as_text(self, *, debug_info: bool = False) -> str:
        """The StableHLO module as text."""
        return self.lowered.as_text(debug_info=debug_info)

    # -- fingerprints
    @cached_property
    def program_fingerprint(self) -> Fingerprint:
        def shardings(items: Sequence[Any], avals: Sequence[Any]) -> str:
            return canonical_json(
                [_sharding_data(s, len(a.shape)) for s, a in zip(items, avals)]
            )

        kept_avals = self.per_input("global_in_avals")
        parts = {
            # The name is part of the program's identity: one program stored under two
            # names is two entries (their blobs are still stored once).
            "name": self.name,
            "kind": self.kind,
            "stablehlo": "sha256:" + sha256_hex(self.as_text(debug_info=False)),
            "in_tree": treedefs.structure_key(self.in_tree),
            "out_tree": treedefs.structure_key(self.out_tree),
            "in_avals": self.avals_signature,
            "in_shardings": shardings(self.in_shardings, kept_avals),
            "out_shardings": shardings(self.out_shardings, self._compile_args["global_out_avals"]),
            "donated": canonical_json([i for i, d in enumerate(self.donated) if d]),
            "kept_args": canonical_json(sorted(self.kept)),
            "devices": canonical_json([int(d.id) for d in self.devices]),
            "compile_options": canonical_json(self._options.get("compiler_options") or {}),
            "x64": str(self._x64).lower(),
        }
        if self.symbolic:
            # Constraints change what the program may assume (and which shapes it
            # serves); concrete programs keep exactly the parts they always had.
            parts["symbolic_constraints"] = canonical_json(list(self.symbolic_constraints))
        if self.host_callbacks:
            # The executable names its callbacks by index only: what they are bound to
            # is part of the program (aot.callbacks); programs without keep their parts.
            parts["host_callbacks"] = canonical_json(list(self.host_callbacks))
        if self.statics:
            # Two statics are two entries even when they lower to one program; entries
            # without statics keep exactly the parts (and keys) they always had.
            parts["statics"] = canonical_json([s.to_dict() for s in self.statics])
        if self.constants:
            # The StableHLO no longer holds the values JAX hoisted: their digest does.
            try:
                parts[CONSTANTS_PART] = lowered_part(
                    self.constants, [a.dtype for a in self._compile_args["global_in_avals"][: len(self.constants)]]
                )
            except TypeError as exc:
                raise UnsupportedComputationError(
                    f"{self.name}: closes over an array that cannot be stored ({exc}); pass "
                    "it as an argument instead"
                ) from None
        return program_fingerprint(parts)

    @property
    def environment_fingerprint(self) -> Fingerprint:
        return self._environment

    @property
    def fingerprint(self) -> str:
        """The artifact key: program and environment together."""
        return combined_key(self.program_fingerprint, self.environment_fingerprint)

    key = fingerprint

    # -- compiling
    def portable_hlo(self, executable: MeshExecutable | None = None) -> bytes | None:
        """The program serialized with ``jax.export`` (portable StableHLO, flat avals),
        or None when ``jax.export`` cannot serialize it (int2/uint2 inputs, for one):
        the artifact then holds the executable alone and cannot be recompiled elsewhere.

        The lowering the compile used is exported as it is (one trace, one lowering:
        :mod:`aot.jaxcompat.export`), with the shardings as lowered and, for those left
        to the compiler, ``executable``'s (when given). When that route
        is not available, the program is traced again by ``jax.export`` with the final
        input and output shardings of ``executable`` (compiled first when not given).
        """
        if self.symbolic:
            return self._symbolic_portable_hlo()
        if self.host_callbacks:
            log.info(
                "%s: calls back into %s on the host, which jax.export does not serialize; "
                "storing the executable without a portable HLO",
                self.name, ", ".join(sorted({b["function"] for b in self.host_callbacks})),
            )
            return None
        # A lowering with hoisted constants takes them as arguments: jax.export's own
        # trace embeds them instead, so the portable HLO takes only the function's.
        exported = None if self.constants else export_from_lowering(self.name, self.lowered, executable)
        if exported is not None:
            return exported
        executable = executable or self.compile()
        kept = iter(executable.info.in_shardings)
        in_shardings = [next(kept) if a.kept else None for a in executable.info.args]
        try:
            return self._export(in_shardings, executable.info.out_shardings)
        except UnsupportedComputationError:
            raise
        except Exception as exc:  # noqa: BLE001 - jax.export refuses what it cannot serialize
            log.warning(
                "%s: jax.export cannot serialize this program (%s: %s); storing the executable "
                "without a portable HLO (it cannot be recompiled for another environment)",
                self.name, type(exc).__name__, exc,
            )
            return None

    def compile(self) -> MeshExecutable:
        if self.symbolic:
            raise self._symbolic_compile_error()
        start = time.perf_counter()
        compiled = self._compile_with(lambda options: self.lowered.compile(options) if options else self.lowered.compile())
        return self._executable(compiled, time.perf_counter() - start)

    def _compile_with(self, compile_fn: Callable[[dict[str, Any] | None], Any]) -> Any:
        """``compile_fn(compiler options)``; on a GPU with the captured autotune results
        of its target (aot.platforms.cuda), and which it got recorded in ``autotune``."""
        room = platforms.of_devices(self.devices)
        options = self._options.get("compiler_options")
        if room is None:  # a platform without a room (ROCm): compiled as it is
            self.tuning = None
            return compile_fn(options)
        compiled, self.tuning = room.compile_step(self.devices, options, compile_fn, self.name)
        return compiled

    @property
    def autotune(self) -> str | None:
        """The stored spelling of :attr:`tuning` (an entry's manifest holds it)."""
        return self.tuning.text if self.tuning is not None else None

    def compile_fresh(self) -> MeshExecutable:
        """Compiles again, bypassing JAX's in-memory executable cache: an executable
        XLA can still serialize (one that ``jax.jit`` ran cannot always be)."""
        start = time.perf_counter()
        compiled = self._compile_with(lambda options: compile_uncached(self.lowered, options))
        executable = self._executable(compiled, time.perf_counter() - start)
        log.info("compiled a fresh copy of %s in %.2fs", self.name, executable.info.compile_seconds)
        return executable

    def _executable(self, compiled: jax.stages.Compiled, seconds: float) -> MeshExecutable:
        unloaded = unloaded_executable(compiled)
        if unloaded is not None and unloaded.host_callbacks and self.kind == "jit":
            self.host_callbacks  # noqa: B018 - raises for a callback that cannot be bound
        elif unloaded is None or unloaded.host_callbacks:
            raise UnsupportedComputationError(
                f"{self.name}: the compiled program calls back into Python on the host, "
                "which cannot be served from an artifact; remove jax.debug.print / "
                "pure_callback / io_callback from the function"
            )
        log.info("compiled %s (%s) in %.2fs", self.name, self.signature, seconds)
        info = executable_info(self, compiled, seconds)
        executable = executable_class(self.kind)(compiled, info)
        executable.computation = self
        executable.target = self.target
        return executable

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, ({self.signature}))"

    @cached_property
    def host_callbacks(self) -> tuple[dict[str, Any], ...]:
        """The host callbacks the program calls, bound by name (aot.callbacks), in the
        order of their index; raises UnsupportedComputationError for one that cannot be."""
        return bind_callbacks(self.name, lowered_callbacks(self.lowered))

    # -- symbolic (shape-polymorphic) programs
    @cached_property
    def symbolic(self) -> bool:
        """True when an input has a symbolic dimension: stored as portable HLO only,
        compiled per concrete shape when served (``aot.load``)."""
        return any(is_symbolic_shape(a.shape) for a in self.in_avals)

    @cached_property
    def symbolic_constraints(self) -> tuple[str, ...]:
        """The constraints of the inputs' symbolic scope (``("b <= 512",)``)."""
        for aval in self.in_avals:
            for dim in aval.shape:
                if is_symbolic_dim(dim):
                    return constraints_of(dim.scope)
        return ()

    def _symbolic_compile_error(self) -> SymbolicShapeError:
        return SymbolicShapeError(
            f"{self.name} ({self.signature}) has symbolic dimensions, and XLA compiles "
            "only concrete shapes. Store it (cache.put(computation) or aot compile): the "
            "cache keeps its shape-polymorphic portable HLO, and aot.load(name) compiles "
            "it for each concrete shape it is called with; or lower it with concrete specs"
        )

    def _symbolic_portable_hlo(self) -> bytes:
        """The shape-polymorphic ``jax.export`` bytes, with the shardings as lowered
        (given ones kept; unspecified ones left to the compile for a concrete shape)."""
        lowered = iter(self.in_shardings)
        kept = self.kept
        in_shardings = [
            _given(next(lowered)) if i in kept else None for i in range(len(self.in_avals))
        ]
        out_shardings = [_given(s) for s in self.out_shardings]
        try:
            try:
                # Outside the mesh context when the program allows it: exported under
                # jax.set_mesh with Explicit axes, JAX puts a sharding constraint on
                # the shape assertions' constants, and no concrete shape can then be
                # compiled ("Error refining shapes"; JAX 0.10.2).
                return self._export(in_shardings, out_shardings, mesh_context=False)
            except Exception:  # noqa: BLE001 - the program needs the mesh context
                return self._export(in_shardings, out_shardings)
        except INCONCLUSIVE_DIMENSION as exc:
            raise SymbolicShapeError(
                f"{self.name} ({self.signature}): jax.export cannot export it for symbolic "
                f"shapes: {str(exc).splitlines()[0]}"
            ) from exc


_ROUTE_MISSING: list[str] = []  # why the one-lowering export is unavailable, once logged


def export_from_lowering(
    name: str, lowered: jax.stages.Lowered, executable: MeshExecutable | None = None
) -> bytes | None:
    """The ``jax.export`` bytes of ``lowered`` itself (no second trace), or None when
    this program (or this JAX) needs the public ``jax.export`` path. With
    ``executable``, the shardings the lowering left to the compiler are its."""
    from aot.jaxcompat.export import ExportRouteUnavailable, export_lowered

    try:
        shardings = (
            (executable.info.in_shardings, executable.info.out_shardings) if executable else (None, None)
        )
        return bytes(export_lowered(lowered, *shardings).serialize())
    except ExportRouteUnavailable as exc:
        log.debug("%s: exported through jax.export (%s)", name, exc)
    except (ImportError, AttributeError, TypeError) as exc:  # JAX's internals moved
        _route_missing(f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - the public path says what it cannot export
        log.debug("%s: exported through jax.export (%s: %s)", name, type(exc).__name__, exc)
    return None


def _route_missing(why: str) -> None:
    if not _ROUTE_MISSING:
        _ROUTE_MISSING.append(why)
        log.warning(
            "exporting portable HLO by tracing each program again (jax.export): the "
            "one-lowering route of aot.jaxcompat.export is unavailable with this JAX (%s)", why,
        )


def _given(sharding: Any) -> Any:
    """A sharding the user gave, or None for one left unspecified at lowering."""
    return sharding if isinstance(sharding, jax.sharding.Sharding) else None


def _weak(arg_info: Any) -> bool:
    return bool(getattr(getattr(arg_info, "_aval", None), "weak_type", False))


class PmapComputation(MeshComputation):
    """A function lowered with ``jax.pmap`` (as ``jax.jit(jax.pmap(f))``)."""

    kind = "pmap"


def _sharding_data(sharding: Any, ndim: int) -> Any:
    try:
        return sharding_to_json(sharding, ndim)
    except Exception:  # noqa: BLE001 - unspecified shardings before compile
        return repr(sharding)


def executable_info(
    computation: MeshComputation, compiled: jax.stages.Compiled, seconds: float
) -> ExecutableInfo:
    unloaded = built_unloaded_executable(compiled)
    skip = len(computation.constants)  # the hoisted constants lead every per-input list
    paths = arg_paths(computation.in_tree, computation.arg_names)
    kept = computation.kept
    args = tuple(
        ArgAval(path, tuple(a.shape), a.dtype, donated, i in kept, bool(a.weak_type))
        for i, (path, a, donated) in enumerate(
            zip(paths, computation.in_avals, computation.donated)
        )
    )
    out_avals = tuple(
        jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
        for a, s in zip(unloaded.output_avals, unloaded.output_shardings)
    )
    return ExecutableInfo(
        name=computation.name,
        kind=computation.kind,
        in_tree=computation.in_tree,
        out_tree=computation.out_tree,
        args=args,
        out_avals=out_avals,
        in_shardings=tuple(unloaded.input_shardings[skip:]),
        out_shardings=tuple(unloaded.output_shardings),
        device_ids=tuple(int(d.id) for d in unloaded.device_list),
        program_fingerprint=computation.program_fingerprint,
        environment_fingerprint=computation.environment_fingerprint,
        compile_seconds=seconds,
        arg_names=tuple(computation.arg_names),
        in_structure=computation.program_fingerprint.as_dict()["in_tree"],
        statics=computation.statics,
        host_callbacks=computation.host_callbacks,
        autotune=getattr(computation, "autotune", None),
        constants=tuple(
            jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
            for a, s in zip(unloaded.input_avals[:skip], unloaded.input_shardings[:skip])
        ),
    )
