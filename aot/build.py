"""Building artifacts: a compiled executable (or a symbolic computation) and its
portable HLO into a manifest and blobs. The on-disk format is :mod:`aot.artifact`;
what JAX keeps private about a compiled program is read through
:mod:`aot.jaxcompat.build`.
"""

from __future__ import annotations

import datetime as _dt
import logging
from typing import Any

import jax

from aot import treedef as treedefs
from aot.artifact import EXECUTABLE, PORTABLE_HLO, UNSPECIFIED_SHARDING, Artifact, BlobRef, Manifest
from aot.errors import UnsupportedComputationError
from aot.executable import ArgAval, MeshExecutable, arg_paths
from aot.fingerprint import combined_key, sha256_hex
from aot.constants import CONSTANTS, Constant, pack
from aot.jaxcompat.build import built_unloaded_executable, compile_args, hoisted_constants, serialize_compiled
from aot.shardings import aval_to_json, sharding_to_json
from aot.specs import dtype_to_str

log = logging.getLogger(__name__)


def _json_memory_analysis(stats: Any) -> dict[str, int] | None:
    if stats is None:
        return None
    out = {}
    for name in dir(stats):
        if name.endswith("_in_bytes") or name.endswith("_size"):
            value = getattr(stats, name, None)
            if isinstance(value, int):
                out[name] = value
    return out or None


def _json_cost_analysis(cost: Any) -> dict[str, float] | None:
    if isinstance(cost, list):  # older jax returned one dict per program
        cost = cost[0] if cost else None
    if not cost:
        return None
    return {str(k): float(v) for k, v in cost.items() if isinstance(v, (int, float))}


def serialize_executable(exe: MeshExecutable) -> bytes:
    """XLA's bytes of ``exe``.

    XLA's CPU backend cannot serialize an executable once it has run a program with a
    sort ("'LessThan' is not serializable"), and ``Lowered.compile()`` hands out JAX's
    in-memory executable, which ``jax.jit`` may already have run. Such an executable
    is compiled once more, bypassing JAX's in-memory cache, and that fresh, never run
    copy of the same program is what gets stored (the caller keeps its executable).
    """
    try:
        return serialize_compiled(exe.compiled)
    except Exception as exc:  # noqa: BLE001 - XlaRuntimeError (UNIMPLEMENTED) and friends
        computation = exe.computation
        if computation is None:
            raise UnsupportedComputationError(
                f"{exe.name}: XLA cannot serialize this executable ({exc}); store the "
                "computation (cache.put(computation)) or an executable that has not run yet"
            ) from exc
        log.info("%s: %s; compiling a fresh copy to store", exe.name, exc)
        fresh = computation.compile_fresh()
        try:
            return serialize_compiled(fresh.compiled)
        except Exception as again:  # noqa: BLE001
            raise UnsupportedComputationError(
                f"{exe.name}: XLA cannot serialize this program: {again}"
            ) from again


def build_artifact(exe: MeshExecutable, portable_hlo: bytes | None) -> Artifact:
    """Serializes a compiled executable (and its portable HLO) into an artifact."""
    info = exe.info
    blobs: dict[str, bytes] = {}
    refs: dict[str, BlobRef] = {}
    for role, data in ((EXECUTABLE, serialize_executable(exe)), (PORTABLE_HLO, portable_hlo)):
        if data is None:
            continue
        digest = sha256_hex(data)
        blobs[digest] = data
        refs[role] = BlobRef(digest, len(data))
    kept_args = [a for a in info.args if a.kept]
    unloaded = built_unloaded_executable(exe.compiled)
    skip = len(info.constants)  # hoisted constants lead the executable's inputs
    constants = _constants(exe, blobs, refs)
    manifest = Manifest(
        name=info.name,
        kind=info.kind,
        key=info.key,
        signature=info.signature,
        program=info.program_fingerprint,
        environment=info.environment_fingerprint,
        in_tree=treedefs.to_json(info.in_tree),
        out_tree=treedefs.to_json(info.out_tree),
        args=tuple(_arg_json(a) for a in info.args),
        in_avals=tuple(aval_to_json(a) for a in unloaded.input_avals[skip:]),
        in_shardings=tuple(
            sharding_to_json(s, len(a.shape)) for s, a in zip(info.in_shardings, kept_args)
        ),
        out_avals=tuple(aval_to_json(a) for a in unloaded.output_avals),
        out_shardings=tuple(
            sharding_to_json(s, len(a.shape)) for s, a in zip(info.out_shardings, info.out_avals)
        ),
        device_ids=info.device_ids,
        committed=bool(unloaded.committed),
        xla_name=str(unloaded.name),
        blobs=refs,
        compile_seconds=round(info.compile_seconds, 6),
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        cost_analysis=_json_cost_analysis(_safe(exe.cost_analysis)),
        memory_analysis=_json_memory_analysis(_safe(exe.memory_analysis)),
        arg_names=tuple(info.arg_names),
        statics=tuple(info.statics),
        host_callbacks=tuple(info.host_callbacks),
        autotune=info.autotune,
        constants=constants,
    )
    return Artifact(manifest, blobs)


def _constants(exe: MeshExecutable, blobs: dict[str, bytes], refs: dict[str, BlobRef]) -> tuple[Constant, ...]:
    """The hoisted constants of ``exe`` (aot.constants): their blob added to ``blobs``
    and ``refs``, their descriptions returned."""
    avals = exe.info.constants
    if not avals:
        return ()
    values = hoisted_constants(exe.compiled)
    try:
        data, layout = pack(values, [a.dtype for a in avals])
    except TypeError as exc:
        raise UnsupportedComputationError(
            f"{exe.name}: closes over an array that cannot be stored ({exc}); pass it as an argument instead"
        ) from None
    digest = sha256_hex(data)
    blobs[digest] = data
    refs[CONSTANTS] = BlobRef(digest, len(data))
    return tuple(
        Constant(dtype, shape, offset, size, sharding_to_json(a.sharding, len(shape)))
        for (dtype, shape, offset, size), a in zip(layout, avals)
    )


def _arg_json(a: ArgAval) -> dict[str, Any]:
    out: dict[str, Any] = {
        "path": a.path,
        "shape": list(a.shape),
        "dtype": dtype_to_str(a.dtype),
        "donated": a.donated,
        "kept": a.kept,
    }
    if a.weak_type:
        out["weak_type"] = True
    return out


def _safe(call: Any) -> Any:
    try:
        return call()
    except Exception:  # noqa: BLE001 - analyses are optional on some backends
        return None


def _symbolic_aval_json(aval: Any) -> dict[str, Any]:
    # Imported here: serving processes, which import this module, never build
    # symbolic artifacts.
    from aot.symbolic import format_dim, is_symbolic_dim

    out: dict[str, Any] = {
        "shape": [format_dim(d) if is_symbolic_dim(d) else int(d) for d in aval.shape],
        "dtype": dtype_to_str(aval.dtype),
    }
    if getattr(aval, "weak_type", False):
        out["weak_type"] = True
    return out


def _given_sharding_json(sharding: Any, ndim: int) -> dict[str, Any]:
    if isinstance(sharding, jax.sharding.Sharding):
        return sharding_to_json(sharding, ndim)
    return dict(UNSPECIFIED_SHARDING)


def build_symbolic_artifact(computation: Any) -> Artifact:
    """A symbolic (shape-polymorphic) computation as an artifact: its ``jax.export``
    bytes and a manifest whose shapes keep their dimension expressions. There is no
    executable: :func:`aot.recompile.compile_symbolic` makes one per concrete shape."""
    hlo = computation.portable_hlo()
    digest = sha256_hex(hlo)
    args_of_compile = compile_args(computation.lowered)
    kept = computation.kept
    paths = arg_paths(computation.in_tree, computation.arg_names)
    args = tuple(
        {
            "path": path,
            "shape": _symbolic_aval_json(aval)["shape"],
            "dtype": dtype_to_str(aval.dtype),
            "donated": donated,
            "kept": i in kept,
            **({"weak_type": True} if getattr(aval, "weak_type", False) else {}),
        }
        for i, (path, aval, donated) in enumerate(zip(paths, computation.in_avals, computation.donated))
    )
    kept_avals = computation.per_input("global_in_avals")
    out_avals = list(args_of_compile["global_out_avals"])
    program = computation.program_fingerprint
    environment = computation.environment_fingerprint
    try:
        xla_name = str(computation.lowered.compiler_ir().operation.attributes["sym_name"]).strip('"')
    except Exception:  # noqa: BLE001 - only a label
        xla_name = "jit_" + computation.name.rpartition(".")[2]
    manifest = Manifest(
        name=computation.name,
        kind=computation.kind,
        key=combined_key(program, environment),
        signature=computation.signature,
        program=program,
        environment=environment,
        in_tree=treedefs.to_json(computation.in_tree),
        out_tree=treedefs.to_json(computation.out_tree),
        args=args,
        in_avals=tuple(_symbolic_aval_json(a) for a in kept_avals),
        in_shardings=tuple(
            _given_sharding_json(s, len(a.shape)) for s, a in zip(computation.in_shardings, kept_avals)
        ),
        out_avals=tuple(_symbolic_aval_json(a) for a in out_avals),
        out_shardings=tuple(
            _given_sharding_json(s, len(a.shape)) for s, a in zip(computation.out_shardings, out_avals)
        ),
        device_ids=tuple(int(d.id) for d in computation.devices),
        committed=bool(args_of_compile.get("committed", False)),
        xla_name=xla_name,
        blobs={PORTABLE_HLO: BlobRef(digest, len(hlo))},
        compile_seconds=0.0,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        arg_names=tuple(computation.arg_names),
        symbolic={"constraints": list(computation.symbolic_constraints)},
        statics=tuple(computation.statics),
    )
    return Artifact(manifest, {digest: hlo})

