"""Building artifacts from compiled executables, and rehydrating them: all the code
that depends on JAX internals (``pxla``, ``stages``), in one file to review on a JAX
upgrade. The on-disk format itself is :mod:`aot.artifact`.
"""

from __future__ import annotations

import datetime as _dt
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import jax
import numpy as np
from jax._src import core, stages
from jax._src.interpreters import pxla

from aot import treedef as treedefs
from aot.artifact import (
    EXECUTABLE,
    PORTABLE_HLO,
    Artifact,
    BlobRef,
    Manifest,
    _dtype,
    check_environment,
)
from aot.errors import (
    AotError,
    CorruptArtifactError,
    IncompatibleEnvironmentError,
    SymbolicShapeError,
)
from aot.executable import ArgAval, ExecutableInfo, MeshExecutable, arg_paths, executable_class
from aot.fingerprint import (
    Fingerprint,
    canonical_json,
    combined_key,
    environment_fingerprint,
    sha256_hex,
)
from aot.shardings import (
    aval_from_json,
    aval_to_json,
    device_list,
    live_devices,
    sharding_from_json,
    sharding_to_json,
)
from aot.symbolic import format_dim, is_symbolic_dim

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- building


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
    xla_executable = exe.compiled._executable.xla_executable
    return bytes(xla_executable.client.serialize_executable(xla_executable))


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
    unloaded = exe.compiled._executable._unloaded_executable
    manifest = Manifest(
        name=info.name,
        kind=info.kind,
        key=info.key,
        signature=info.signature,
        program=info.program_fingerprint,
        environment=info.environment_fingerprint,
        in_tree=treedefs.to_json(info.in_tree),
        out_tree=treedefs.to_json(info.out_tree),
        args=tuple(
            {
                "path": a.path,
                "shape": list(a.shape),
                "dtype": np.dtype(a.dtype).name,
                "donated": a.donated,
                "kept": a.kept,
            }
            for a in info.args
        ),
        in_avals=tuple(aval_to_json(a) for a in unloaded.input_avals),
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
    )
    return Artifact(manifest, blobs)


def _safe(call: Any) -> Any:
    try:
        return call()
    except Exception:  # noqa: BLE001 - analyses are optional on some backends
        return None


# ---------------------------------------------------------------- loading


def executable_info(manifest: Manifest, *, flat_outputs: bool = False) -> ExecutableInfo:
    """The call metadata of a manifest, resolved against this process's devices.

    With ``flat_outputs``, the outputs are a flat tuple of arrays, so that an output
    pytree node whose class cannot be imported here does not prevent loading.
    """
    try:
        return _executable_info(manifest, flat_outputs)
    except AotError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        # The key covers the fingerprints, not these fields: an unsigned manifest can
        # carry anything here.
        raise CorruptArtifactError(
            f"manifest of {manifest.name!r} ({manifest.key[:12]}) has a malformed field: "
            f"{exc!r}; run `aot verify` and recompile the entry"
        ) from None


def _executable_info(manifest: Manifest, flat_outputs: bool) -> ExecutableInfo:
    devices = live_devices()
    args = tuple(
        ArgAval(
            str(a["path"]),
            tuple(int(d) for d in a["shape"]),
            _dtype(a["dtype"]),
            bool(a["donated"]),
            bool(a["kept"]),
        )
        for a in manifest.args
    )
    out_shardings = tuple(sharding_from_json(s, devices) for s in manifest.out_shardings)
    out_avals = tuple(
        jax.ShapeDtypeStruct(tuple(a["shape"]), _dtype(a["dtype"]), sharding=s)
        for a, s in zip(manifest.out_avals, out_shardings)
    )
    info = ExecutableInfo(
        name=manifest.name,
        kind=manifest.kind,
        in_tree=treedefs.from_json(manifest.in_tree),
        out_tree=(
            jax.tree_util.tree_structure(tuple(range(len(manifest.out_avals))))
            if flat_outputs
            else treedefs.from_json(manifest.out_tree)
        ),
        args=args,
        out_avals=out_avals,
        in_shardings=tuple(sharding_from_json(s, devices) for s in manifest.in_shardings),
        out_shardings=out_shardings,
        device_ids=manifest.device_ids,
        program_fingerprint=manifest.program,
        environment_fingerprint=manifest.environment,
        compile_seconds=manifest.compile_seconds,
        arg_names=manifest.arg_names,
    )
    counts = {
        "in_tree leaves vs args": (info.in_tree.num_leaves, len(args)),
        "kept args vs in_shardings": (sum(a.kept for a in args), len(info.in_shardings)),
        "kept args vs in_avals": (sum(a.kept for a in args), len(manifest.in_avals)),
        "out_tree leaves vs out_avals": (info.out_tree.num_leaves, len(out_avals)),
        "out_avals vs out_shardings": (len(manifest.out_avals), len(out_shardings)),
    }
    for what, (left, right) in counts.items():
        if left != right:
            raise ValueError(f"{what}: {left} != {right}")
    if not manifest.device_ids:
        raise ValueError("no device ids")
    return info


def load_executable(
    artifact: Artifact,
    *,
    check_env: bool = True,
    current: Fingerprint | None = None,
    flat_outputs: bool = False,
) -> MeshExecutable:
    """Rehydrates a stored executable: digest first, then environment, then XLA."""
    manifest = artifact.manifest
    if manifest.is_symbolic:
        raise SymbolicShapeError(
            f"{manifest.name} ({manifest.signature}, {manifest.key[:12]}) is a symbolic "
            "entry: it holds portable HLO and no executable. Serve it with "
            "aot.load(name), which compiles it for each concrete shape it is called with"
        )
    exe_bytes = artifact.blob(EXECUTABLE)  # verifies the digest before anything else
    if check_env:
        check_environment(manifest, current)
    info = executable_info(manifest, flat_outputs=flat_outputs)
    devices = live_devices()
    dlist = device_list(manifest.device_ids, devices)  # names a missing device id
    backend = devices[manifest.device_ids[0]].client
    start = time.perf_counter()
    try:
        xla_executable = backend.deserialize_executable(exe_bytes, dlist)
    except Exception as exc:  # noqa: BLE001 - XLA reports as RuntimeError/XlaRuntimeError
        raise IncompatibleEnvironmentError(
            f"XLA could not load the executable of {manifest.name!r} ({manifest.key[:12]}): "
            f"{exc}. Recompile it from its portable HLO.",
            (f"deserialize: {exc}",),
        ) from exc
    kept_shardings = info.in_shardings
    in_avals = [aval_from_json(a, s) for a, s in zip(manifest.in_avals, kept_shardings)]
    out_avals = [
        aval_from_json(a, s) for a, s in zip(manifest.out_avals, info.out_shardings)
    ]
    unloaded = pxla.UnloadedMeshExecutable(
        xla_executable=xla_executable,
        device_list=dlist,
        backend=backend,
        input_avals=in_avals,
        input_shardings=list(kept_shardings),
        output_avals=out_avals,
        output_shardings=list(info.out_shardings),
        committed=manifest.committed,
        name=manifest.xla_name,
        unordered_effects=[],
        ordered_effects=[],
        keepalive=[],
        host_callbacks=[],
        kept_var_idx={i for i, a in enumerate(info.args) if a.kept},
        mut=None,
        xla_in_layouts=[None] * len(in_avals),
        dispatch_in_layouts=[None] * len(in_avals),
        xla_out_layouts=[None] * len(out_avals),
        all_args_info=None,
        pgle_profiler=None,
    )
    args_info = info.in_tree.unflatten(
        [stages.ArgInfo(core.ShapedArray(a.shape, a.dtype), a.donated) for a in info.args]
    )
    compiled = stages.Compiled(unloaded.load(), [], args_info, info.out_tree, no_kwargs=False)
    log.debug(
        "loaded %s (%s) in %.1f ms", manifest.name, manifest.signature,
        (time.perf_counter() - start) * 1e3,
    )
    return executable_class(manifest.kind)(compiled, info)


def recompile(artifact: Artifact) -> Artifact:
    """Compiles the stored portable HLO for this environment: no model code needed.

    The new artifact keeps the program fingerprint (it is the same program) and gets
    this environment's fingerprint.
    """
    manifest = artifact.manifest
    exported = jax.export.deserialize(bytearray(artifact.blob(PORTABLE_HLO)))
    info = executable_info(manifest)
    kept_iter = iter(info.in_shardings)
    specs = [
        jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=next(kept_iter) if a.kept else None)
        for a in info.args
    ]
    start = time.perf_counter()
    # jax.export does not record donation; without this the recompiled executable
    # would silently stop donating (and keep twice the memory alive).
    donated = tuple(i for i, a in enumerate(info.args) if a.donated)
    compiled = jax.jit(exported.call, donate_argnums=donated).trace(*specs).lower().compile()
    seconds = time.perf_counter() - start
    environment = environment_fingerprint()
    unloaded = compiled._executable._unloaded_executable
    kept = set(unloaded.kept_var_idx)
    new_info = replace(
        info,
        args=tuple(replace(a, kept=i in kept) for i, a in enumerate(info.args)),
        environment_fingerprint=environment,
        in_shardings=tuple(unloaded.input_shardings),
        out_shardings=tuple(unloaded.output_shardings),
        compile_seconds=seconds,
    )
    exe = executable_class(manifest.kind)(compiled, new_info)
    log.info("recompiled %s (%s) from portable HLO in %.2fs", manifest.name, manifest.signature, seconds)
    rebuilt = build_artifact(exe, artifact.blob(PORTABLE_HLO))
    return rebuilt


# ---------------------------------------------------------------- symbolic shapes


_UNSPECIFIED = {"type": "unspecified"}


def _symbolic_aval_json(aval: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "shape": [format_dim(d) if is_symbolic_dim(d) else int(d) for d in aval.shape],
        "dtype": np.dtype(aval.dtype).name,
    }
    if getattr(aval, "weak_type", False):
        out["weak_type"] = True
    return out


def _given_sharding_json(sharding: Any, ndim: int) -> dict[str, Any]:
    if isinstance(sharding, jax.sharding.Sharding):
        return sharding_to_json(sharding, ndim)
    return dict(_UNSPECIFIED)


def build_symbolic_artifact(computation: Any) -> Artifact:
    """A symbolic (shape-polymorphic) computation as an artifact: its ``jax.export``
    bytes and a manifest whose shapes keep their dimension expressions. There is no
    executable: :func:`compile_symbolic` makes one per concrete shape."""
    hlo = computation.portable_hlo()
    digest = sha256_hex(hlo)
    compile_args = computation.lowered._lowering.compile_args
    kept = computation.kept
    paths = arg_paths(computation.in_tree, computation.arg_names)
    args = tuple(
        {
            "path": path,
            "shape": _symbolic_aval_json(aval)["shape"],
            "dtype": np.dtype(aval.dtype).name,
            "donated": donated,
            "kept": i in kept,
        }
        for i, (path, aval, donated) in enumerate(zip(paths, computation.in_avals, computation.donated))
    )
    kept_avals = list(compile_args["global_in_avals"])
    out_avals = list(compile_args["global_out_avals"])
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
        committed=bool(compile_args.get("committed", False)),
        xla_name=xla_name,
        blobs={PORTABLE_HLO: BlobRef(digest, len(hlo))},
        compile_seconds=0.0,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        arg_names=tuple(computation.arg_names),
        symbolic={"constraints": list(computation.symbolic_constraints)},
    )
    return Artifact(manifest, {digest: hlo})


def compile_symbolic(artifact: Artifact, shapes: Sequence[Sequence[int]]) -> Artifact:
    """Compiles a symbolic entry's portable HLO for concrete input ``shapes``.

    No tracing of the model and no model code: the ``jax.export`` bytes are
    deserialized and ``exported.call`` is compiled for the concrete avals. The result
    is a concrete artifact of the same name (program fingerprint: the symbolic one's
    parts with the concrete signature, shardings and the symbolic program's digest),
    holding the executable and the same portable HLO.
    """
    manifest = artifact.manifest
    if not manifest.is_symbolic:
        raise ValueError(f"{manifest.name}: not a symbolic entry")
    hlo = artifact.blob(PORTABLE_HLO)
    exported = jax.export.deserialize(bytearray(hlo))
    devices = live_devices()
    shardings = iter(manifest.in_shardings)
    specs = []
    for a, shape in zip(manifest.args, shapes):
        sharding = None
        if a["kept"]:
            data = next(shardings)
            if data.get("type") != "unspecified":
                sharding = sharding_from_json(data, devices)
        specs.append(jax.ShapeDtypeStruct(tuple(int(d) for d in shape), _dtype(a["dtype"]), sharding=sharding))
    donated = tuple(i for i, a in enumerate(manifest.args) if a["donated"])
    start = time.perf_counter()
    compiled = jax.jit(exported.call, donate_argnums=donated).trace(*specs).lower().compile()
    seconds = time.perf_counter() - start
    unloaded = compiled._executable._unloaded_executable
    kept = set(unloaded.kept_var_idx)
    args = tuple(
        ArgAval(str(a["path"]), tuple(s.shape), np.dtype(s.dtype), bool(a["donated"]), i in kept)
        for i, (a, s) in enumerate(zip(manifest.args, specs))
    )
    signature = ", ".join(arg.describe() for arg in args)
    kept_args = [arg for arg in args if arg.kept]
    parts = manifest.program.as_dict()
    parts.pop("symbolic_constraints", None)
    parts.update(
        in_avals=signature,
        in_shardings=canonical_json(
            [sharding_to_json(s, len(a.shape)) for s, a in zip(unloaded.input_shardings, kept_args)]
        ),
        out_shardings=canonical_json(
            [sharding_to_json(s, len(a.shape)) for s, a in zip(unloaded.output_shardings, unloaded.output_avals)]
        ),
        kept_args=canonical_json(sorted(kept)),
        devices=canonical_json([int(d.id) for d in unloaded.device_list]),
        symbolic_program=manifest.program.digest,
    )
    info = ExecutableInfo(
        name=manifest.name,
        kind=manifest.kind,
        in_tree=treedefs.from_json(manifest.in_tree),
        out_tree=jax.tree_util.tree_structure(tuple(range(len(unloaded.output_avals)))),
        args=args,
        out_avals=tuple(
            jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
            for a, s in zip(unloaded.output_avals, unloaded.output_shardings)
        ),
        in_shardings=tuple(unloaded.input_shardings),
        out_shardings=tuple(unloaded.output_shardings),
        device_ids=tuple(int(d.id) for d in unloaded.device_list),
        program_fingerprint=Fingerprint.of(manifest.program.kind, parts),
        environment_fingerprint=environment_fingerprint(),
        compile_seconds=seconds,
        arg_names=manifest.arg_names,
    )
    executable = executable_class(manifest.kind)(compiled, info)
    built = build_artifact(executable, hlo)
    # The stored structures as written at lowering (not re-derived from treedefs).
    concrete = replace(built.manifest, in_tree=manifest.in_tree, out_tree=manifest.out_tree)
    log.info(
        "compiled %s (%s) from its symbolic portable HLO (%s) in %.2fs",
        manifest.name, signature, manifest.signature, seconds,
    )
    return Artifact(concrete, built.blobs)
