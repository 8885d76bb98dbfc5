"""Building artifacts from compiled executables, and rehydrating them: all the code
that depends on JAX internals (``pxla``, ``stages``), in one file to review on a JAX
upgrade. The on-disk format itself is :mod:`aot.artifact`.
"""

from __future__ import annotations

import datetime as _dt
import logging
import threading
import time
from dataclasses import replace
from typing import Any

import jax
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
    PytreeNodeError,
    UnsupportedComputationError,
)
from aot.executable import ArgAval, ExecutableInfo, MeshExecutable, executable_class
from aot.fingerprint import Fingerprint, environment_fingerprint, sha256_hex
from aot.specs import dtype_to_str
from aot.shardings import (
    aval_from_json,
    aval_to_json,
    device_list,
    live_devices,
    sharding_from_json,
    sharding_to_json,
)

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


def _serialize(compiled: Any) -> bytes:
    xla_executable = compiled._executable.xla_executable
    return bytes(xla_executable.client.serialize_executable(xla_executable))


def serialize_executable(exe: MeshExecutable) -> bytes:
    """XLA's bytes of ``exe``.

    XLA's CPU backend cannot serialize an executable once it has run a program with a
    sort ("'LessThan' is not serializable"), and ``Lowered.compile()`` hands out JAX's
    in-memory executable, which ``jax.jit`` may already have run. Such an executable
    is compiled once more, bypassing JAX's in-memory cache, and that fresh, never run
    copy of the same program is what gets stored (the caller keeps its executable).
    """
    try:
        return _serialize(exe.compiled)
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
            return _serialize(fresh.compiled)
        except Exception as again:  # noqa: BLE001
            raise UnsupportedComputationError(
                f"{exe.name}: XLA cannot serialize this program: {again}"
            ) from again


def compile_uncached(lowered: stages.Lowered, compiler_options: dict[str, Any] | None) -> stages.Compiled:
    """``lowered.compile()`` without JAX's in-memory executable cache: a copy of the
    module (the cache is keyed by the module object) compiled as JAX would."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    lowering = lowered._lowering
    hlo = lowering.stablehlo()
    with hlo.context:
        module = ir.Module.parse(mlir.module_to_bytecode(hlo))
    options = tuple((compiler_options or {}).items())
    executable = pxla.UnloadedMeshExecutable.from_hlo(
        lowering._name, module, **lowering.compile_args,
        compiler_options_kvs=lowering._compiler_options_kvs + options,
        device_list=lowering._device_list,
    )
    return stages.Compiled(
        executable, lowering.const_args, lowered.args_info, lowered.out_tree, lowered._no_kwargs,
        lowered._in_types, lowered._out_types,
    )


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
        args=tuple(_arg_json(a) for a in info.args),
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
    args = manifest_args(manifest)
    out_shardings = tuple(sharding_from_json(s, devices) for s in manifest.out_shardings)
    out_avals = tuple(
        jax.ShapeDtypeStruct(tuple(a["shape"]), _dtype(a["dtype"]), sharding=s)
        for a, s in zip(manifest.out_avals, out_shardings)
    )
    in_structure = treedefs.structure_key_of_json(manifest.in_tree)
    recorded = manifest.program.as_dict().get("in_tree")
    if manifest.format_version >= 2 and recorded != in_structure:
        # The structure callers are matched against must be the one the program was
        # fingerprinted with (format 1 fingerprinted another encoding of it).
        raise CorruptArtifactError(
            f"manifest of {manifest.name!r} ({manifest.key[:12]}): its input structure does "
            "not match its program fingerprint; the manifest was altered"
        )
    out_json = None
    if flat_outputs:
        out_tree = jax.tree_util.tree_structure(tuple(range(len(manifest.out_avals))))
    else:
        try:
            out_tree = treedefs.from_json(manifest.out_tree)
        except PytreeNodeError:
            # Rebuilt per caller from its own input nodes (MeshExecutable.bind).
            out_tree = treedefs.from_json(manifest.out_tree, standins=True)
            out_json = manifest.out_tree
    info = ExecutableInfo(
        name=manifest.name,
        kind=manifest.kind,
        in_tree=treedefs.from_json(manifest.in_tree, standins=True),
        out_tree=out_tree,
        args=args,
        out_avals=out_avals,
        in_shardings=tuple(sharding_from_json(s, devices) for s in manifest.in_shardings),
        out_shardings=out_shardings,
        device_ids=manifest.device_ids,
        program_fingerprint=manifest.program,
        environment_fingerprint=manifest.environment,
        compile_seconds=manifest.compile_seconds,
        arg_names=manifest.arg_names,
        in_structure=in_structure,
        out_json=out_json,
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


def manifest_args(manifest: Manifest) -> tuple[ArgAval, ...]:
    """The flat inputs a manifest records (dtype names checked against this jax)."""
    return tuple(
        ArgAval(
            str(a["path"]),
            tuple(int(d) for d in a["shape"]),
            _dtype(a["dtype"]),
            bool(a["donated"]),
            bool(a["kept"]),
            bool(a.get("weak_type", False)),
        )
        for a in manifest.args
    )


_custom_calls_ready: set[str] = set()
_custom_calls_lock = threading.Lock()


def ensure_custom_call_targets(platform: str) -> None:
    """Registers JAX's own custom-call targets for ``platform`` before an executable
    runs, as ``jax.export`` does before calling an exported program: XLA CPU programs
    using jnp.linalg call LAPACK kernels that JAX initialises lazily while lowering,
    and a serving process that never lowered anything would crash (SIGSEGV) on them."""
    if platform in _custom_calls_ready:
        return
    with _custom_calls_lock:
        if platform in _custom_calls_ready:
            return
        try:
            from jax._src.lax import linalg

            if platform == "cpu":
                linalg.initialize_lapack()
            elif platform in ("cuda", "rocm", "gpu"):
                from jax._src.lib import gpu_solver

                gpu_solver.initialize_hybrid_kernels()
        except Exception as exc:  # noqa: BLE001 - a jaxlib without these kernels
            log.warning("could not initialise JAX's %s custom-call targets: %s", platform, exc)
        _custom_calls_ready.add(platform)


def flat_call(compiled: stages.Compiled, info: ExecutableInfo, out_tree: Any) -> Any:
    """``compiled`` as a function of its flat inputs returning ``out_tree``: the same
    loaded executable, without the input structure JAX would compare by identity (a
    loaded structure may hold stand-ins, and the caller's was matched by digest
    already). It is JAX's C++ dispatch function itself (``Compiled._call``), built
    now rather than on the first call."""
    args_info = (
        tuple(stages.ArgInfo(core.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type), a.donated) for a in info.args),
        {},
    )
    flat = stages.Compiled(compiled._executable, [], args_info, out_tree, no_kwargs=True)
    try:
        fn = flat._executable.create_cpp_call(flat._params)
    except Exception:  # noqa: BLE001 - an executable kind without a C++ path
        fn = None
    return fn if fn is not None else flat


def load_executable(
    artifact: Artifact,
    *,
    check_env: bool = True,
    current: Fingerprint | None = None,
    flat_outputs: bool = False,
) -> MeshExecutable:
    """Rehydrates a stored executable: digest first, then environment, then XLA."""
    manifest = artifact.manifest
    exe_bytes = artifact.blob(EXECUTABLE)  # verifies the digest before anything else
    if check_env:
        check_environment(manifest, current)
    info = executable_info(manifest, flat_outputs=flat_outputs)
    devices = live_devices()
    dlist = device_list(manifest.device_ids, devices)  # names a missing device id
    backend = devices[manifest.device_ids[0]].client
    ensure_custom_call_targets(devices[manifest.device_ids[0]].platform)
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
        [stages.ArgInfo(core.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type), a.donated) for a in info.args]
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
        jax.ShapeDtypeStruct(
            a.shape, a.dtype, sharding=next(kept_iter) if a.kept else None, weak_type=a.weak_type
        )
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
    # The structures as stored (a node this process cannot rebuild is a stand-in here,
    # which would lose its auxiliary data).
    return Artifact(
        replace(rebuilt.manifest, in_tree=manifest.in_tree, out_tree=manifest.out_tree, hmac=None),
        rebuilt.blobs,
    )
