"""Building artifacts from compiled executables, and rehydrating them: all the code
that depends on JAX internals (``pxla``, ``stages``), in one file to review on a JAX
upgrade. The on-disk format itself is :mod:`aot.artifact`.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import jax
import numpy as np
from jax._src import core, op_shardings, stages
from jax._src.interpreters import pxla
from jax._src.lib import hlo as _hlo
from jax._src.lib import xla_client as xc

from aot import treedef as treedefs
from aot.artifact import (
    EXECUTABLE,
    PORTABLE_HLO,
    UNSPECIFIED_SHARDING,
    Artifact,
    BlobRef,
    Manifest,
    _dtype,
    check_environment,
    check_manifest,
    environment_differences,
    manifest_problems,
    sharding_device_ids,
)
from aot.errors import (
    AotError,
    CorruptArtifactError,
    IncompatibleEnvironmentError,
    PytreeNodeError,
    SymbolicShapeError,
    UnsupportedComputationError,
)
from aot.executable import ArgAval, ExecutableInfo, MeshExecutable, arg_paths, executable_class
from aot.fingerprint import (
    Fingerprint,
    canonical_json,
    combined_key,
    environment_fingerprint,
    sha256_hex,
)
from aot.records import Record
from aot.specs import dtype_to_str, format_aval
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


_lapack_needles: tuple[bytes, ...] | None = None


def _lapack_targets() -> tuple[bytes, ...]:
    """What an executable that calls a LAPACK kernel of jaxlib names: ``lapack_``
    (``lapack_sgetrf_ffi``, ...) or one of jaxlib's other names for such kernels
    (``tridiagonal_solve_perturbed_ffi``), from jaxlib's own registrations."""
    global _lapack_needles
    if _lapack_needles is None:
        needles = {b"lapack_"}
        try:
            from jax._src.lib import lapack

            for targets in lapack.registrations().values():
                needles.update(
                    name.encode() for name, *_ in targets if not name.startswith("lapack_")
                )
        except Exception as exc:  # noqa: BLE001 - a jaxlib without them: the prefix alone
            log.debug("jaxlib's LAPACK registrations unavailable: %s", exc)
        _lapack_needles = tuple(sorted(needles))
    return _lapack_needles


def ensure_custom_call_targets(platform: str, exe_bytes: bytes | None = None) -> None:
    """Registers JAX's own custom-call targets for ``platform`` before an executable
    runs, as ``jax.export`` does before calling an exported program: XLA CPU programs
    using jnp.linalg call LAPACK kernels that JAX initialises lazily while lowering,
    and a serving process that never lowered anything would crash (SIGSEGV) on them.

    On CPU, initialising LAPACK imports ``scipy.linalg`` (about 0.2 s, most of the
    time to load a small executable), so it is done only for an executable whose
    serialized bytes name one of jaxlib's LAPACK targets (XLA resolves custom calls by
    those names; ``exe_bytes=None``: always). A JAX upgrade that stopped storing the names in
    plain bytes would show in tests/aot/test_rehydrate.py's fresh-process linalg test
    and the conformance suite's ``lapack`` group."""
    if platform in _custom_calls_ready:
        return
    if platform == "cpu" and exe_bytes is not None and not any(
        needle in exe_bytes for needle in _lapack_targets()
    ):
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


def dispatch_function(name: str, cache_miss: Any) -> Any:
    """JAX's C++ dispatch function (the ``PjitFunction`` behind ``jax.jit`` and
    ``Compiled``) with no Python function of its own: a call whose signature (pytree,
    shapes, dtypes, weak types, shardings, committedness) it has not cached goes to
    ``cache_miss(*args, **kwargs)``, which returns ``(outputs, fastpath data or None,
    False)``, as :func:`first_call` does; a cached signature runs in C++."""
    from jax._src import tree_util
    from jax._src.lib import _jax

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
    check_manifest(manifest)  # fields outside the key, against the fingerprints
    info = executable_info(manifest, flat_outputs=flat_outputs)
    devices = live_devices()
    dlist = device_list(manifest.device_ids, devices)  # names a missing device id
    backend = devices[manifest.device_ids[0]].client
    ensure_custom_call_targets(devices[manifest.device_ids[0]].platform, exe_bytes)
    start = time.perf_counter()
    xla_executable = _deserialize(manifest, backend, exe_bytes, dlist)
    check_executable(manifest, info, xla_executable)
    kept_shardings = info.in_shardings
    try:
        in_avals = [aval_from_json(a, s) for a, s in zip(manifest.in_avals, kept_shardings)]
        out_avals = [
            aval_from_json(a, s) for a, s in zip(manifest.out_avals, info.out_shardings)
        ]
    except (ValueError, TypeError) as exc:  # jax refuses an aval for its sharding
        raise CorruptArtifactError(
            f"manifest of {manifest.name!r} ({manifest.key[:12]}) has an aval its sharding "
            f"cannot hold: {exc}; run `aot verify` and recompile the entry"
        ) from None
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
    this environment's fingerprint. The manifest may be why the stored executable was
    refused, so only what the fingerprints and the portable HLO vouch for is taken
    from it (:func:`_trusted_inputs`).
    """
    manifest = artifact.manifest
    hlo = artifact.blob(PORTABLE_HLO)
    try:
        exported = jax.export.deserialize(bytearray(hlo))
    except Exception as exc:  # noqa: BLE001 - flatbuffer and version errors vary
        raise CorruptArtifactError(
            f"the portable HLO of {manifest.name!r} ({manifest.key[:12]}) cannot be read: "
            f"{exc}; recompile the entry from its code (aot warmup / aot compile)"
        ) from None
    trusted = _trusted_inputs(manifest, exported)
    devices = live_devices()
    in_shardings = {i: sharding_from_json(s, devices) for i, s in trusted.in_shardings.items()}
    specs = [
        jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=in_shardings.get(i), weak_type=a.weak_type)
        for i, a in enumerate(trusted.args)
    ]
    options: dict[str, Any] = {}
    if any(s is not None for s in trusted.out_shardings):
        # Outputs whose sharding was asked for at lowering time get it again (jit: None
        # leaves the others to the compiler), so the new manifest agrees with the
        # program fingerprint that pins them.
        options["out_shardings"] = tuple(
            sharding_from_json(s, devices) if s is not None else None for s in trusted.out_shardings
        )
    start = time.perf_counter()
    # jax.export does not record donation; without this the recompiled executable
    # would silently stop donating (and keep twice the memory alive).
    donated = tuple(i for i, a in enumerate(trusted.args) if a.donated)
    jitted = jax.jit(exported.call, donate_argnums=donated, **options)
    compiled = jitted.trace(*specs).lower().compile()
    seconds = time.perf_counter() - start
    unloaded = compiled._executable._unloaded_executable
    kept = set(unloaded.kept_var_idx)
    info = ExecutableInfo(
        name=trusted.name,
        kind=trusted.kind,
        # Stand-ins for nodes this process cannot rebuild: the stored JSON replaces
        # these structures below.
        in_tree=treedefs.from_json(manifest.in_tree, standins=True),
        out_tree=treedefs.from_json(manifest.out_tree, standins=True),
        args=tuple(a._replace(kept=i in kept) for i, a in enumerate(trusted.args)),
        out_avals=tuple(
            jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
            for a, s in zip(unloaded.output_avals, unloaded.output_shardings)
        ),
        in_shardings=tuple(unloaded.input_shardings),
        out_shardings=tuple(unloaded.output_shardings),
        device_ids=tuple(int(d.id) for d in unloaded.device_list),
        program_fingerprint=manifest.program,
        environment_fingerprint=environment_fingerprint(),
        compile_seconds=seconds,
        arg_names=manifest.arg_names,
    )
    exe = executable_class(trusted.kind)(compiled, info)
    log.info("recompiled %s (%s) from portable HLO in %.2fs", trusted.name, manifest.signature, seconds)
    rebuilt = build_artifact(exe, hlo)
    # Passing the input shardings commits the recompiled program's outputs; a program
    # on one device that asked for no sharding keeps the stored choice (either value
    # is possible there, and it decides whether its outputs may move).
    committed = rebuilt.manifest.committed
    if len(trusted.device_ids) == 1 and not trusted.pinned:
        committed = bool(manifest.committed)
    # The stored pytree JSON, verbatim: the program fingerprint hashes it, a
    # namedtuple rebuilt from its fields would be written under another type name, and
    # a node this process cannot rebuild is a stand-in here (its auxiliary data lost).
    return Artifact(
        replace(
            rebuilt.manifest, in_tree=manifest.in_tree, out_tree=manifest.out_tree,
            committed=committed, hmac=None,
        ),
        rebuilt.blobs,
    )


# ---------------------------------------------------------------- symbolic shapes


_UNSPECIFIED = UNSPECIFIED_SHARDING


def _symbolic_aval_json(aval: Any) -> dict[str, Any]:
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
            "dtype": dtype_to_str(aval.dtype),
            "donated": donated,
            "kept": i in kept,
            **({"weak_type": True} if getattr(aval, "weak_type", False) else {}),
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
        specs.append(jax.ShapeDtypeStruct(
            tuple(int(d) for d in shape), _dtype(a["dtype"]), sharding=sharding,
            weak_type=bool(a.get("weak_type", False)),
        ))
    donated = tuple(i for i, a in enumerate(manifest.args) if a["donated"])
    start = time.perf_counter()
    compiled = jax.jit(exported.call, donate_argnums=donated).trace(*specs).lower().compile()
    seconds = time.perf_counter() - start
    unloaded = compiled._executable._unloaded_executable
    kept = set(unloaded.kept_var_idx)
    args = tuple(
        ArgAval(str(a["path"]), tuple(s.shape), s.dtype, bool(a["donated"]), i in kept, bool(s.weak_type))
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
        in_tree=treedefs.from_json(manifest.in_tree, standins=True),
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


# ---------------------------------------------------------------- cross-checks with XLA
#
# What only the deserialized executable or the portable HLO can confirm: the
# per-device parameter and result shapes and dtypes, and the shardings XLA compiled
# for. The pure checks against the fingerprints are aot.artifact.manifest_problems.
# These use the XLA client and public jax.sharding only (no pxla), so `aot verify`
# runs them too.


class _TrustedInputs(Record):
    """What a recompilation takes from a manifest, each field vouched for by the
    program fingerprint or the portable HLO. (A :class:`~aot.records.Record`: this
    module is imported by every serving process, which never recompiles.)"""

    __slots__ = ("name", "kind", "args", "device_ids", "in_shardings", "out_shardings", "pinned")
    name: str
    kind: str
    args: tuple[ArgAval, ...]
    device_ids: tuple[int, ...]
    in_shardings: dict[int, dict[str, Any]]  # argument index -> sharding JSON
    out_shardings: tuple[dict[str, Any] | None, ...]  # None: not asked for
    pinned: bool  # some sharding was asked for at lowering time

    def __init__(
        self, name: str, kind: str, args: tuple[ArgAval, ...], device_ids: tuple[int, ...],
        in_shardings: dict[int, dict[str, Any]], out_shardings: tuple[dict[str, Any] | None, ...],
        pinned: bool,
    ) -> None:
        self._set(name, kind, args, device_ids, in_shardings, out_shardings, pinned)


def _trusted_inputs(manifest: Manifest, exported: Any) -> _TrustedInputs:
    program = manifest.program.as_dict()
    label = f"{manifest.name!r} ({manifest.key[:12]})"
    untrusted = [
        p for p in manifest_problems(manifest) if p.startswith(("in_tree", "out_tree"))
    ]
    if untrusted:
        raise CorruptArtifactError(
            f"{label} cannot be recompiled from its portable HLO: {'; '.join(untrusted)} "
            "(the pytree structure is stored only in the manifest); recompile it from its "
            "code (aot warmup / aot compile)"
        )
    args_avals = [(tuple(int(d) for d in a["shape"]), _dtype(a["dtype"])) for a in manifest.args]
    exported_avals, _ = _hlo_avals(manifest, exported)
    if args_avals != exported_avals:
        raise CorruptArtifactError(
            f"the portable HLO of {label} takes {_avals_text(exported_avals)}, but the program "
            f"takes {_avals_text(args_avals)}: the blob belongs to another program; "
            "recompile it from its code (aot warmup / aot compile)"
        )
    donated = set(_json_list(program, "donated", []))
    kept = set(_json_list(program, "kept_args", range(len(manifest.args))))
    ids = tuple(_json_list(program, "devices", manifest.device_ids))
    if len(ids) != exported.nr_devices:
        raise CorruptArtifactError(
            f"the portable HLO of {label} was exported for {exported.nr_devices} devices, "
            f"the program runs on {len(ids)}; recompile it from its code"
        )
    # Weak types are vouched for: Manifest.from_dict checked the arguments' avals,
    # "~" included, against the program fingerprint's in_avals part.
    args = tuple(
        ArgAval(
            str(a.get("path", f"args[{i}]")), shape, dtype, i in donated, i in kept,
            bool(a.get("weak_type", False)),
        )
        for i, (a, (shape, dtype)) in enumerate(zip(manifest.args, args_avals))
    )
    pinned_in = dict(zip(sorted(kept), _json_list(program, "in_shardings", [])))
    stored_in = dict(zip([i for i, a in enumerate(manifest.args) if a.get("kept") is True], manifest.in_shardings))
    in_shardings: dict[int, dict[str, Any]] = {}
    for i in sorted(kept):
        pinned = pinned_in.get(i)
        if isinstance(pinned, dict):
            in_shardings[i] = pinned
            continue
        stored = stored_in.get(i)
        hlo = exported.in_shardings_hlo[i] if i < len(exported.in_shardings_hlo) else None
        if stored is not None and _same_placement(stored, ids, hlo, len(args[i].shape)):
            in_shardings[i] = stored  # the common case: keeps a NamedSharding a NamedSharding
        else:
            in_shardings[i] = _sharding_for(ids, hlo)
    pinned_out = _json_list(program, "out_shardings", [])
    out_shardings = tuple(
        s if isinstance(s, dict) else None
        for s in (list(pinned_out) + [None] * len(exported.out_avals))[: len(exported.out_avals)]
    )
    return _TrustedInputs(
        name=program.get("name", manifest.name),
        kind=program.get("kind", manifest.kind),
        args=args,
        device_ids=ids,
        in_shardings=in_shardings,
        out_shardings=out_shardings,
        pinned=any(isinstance(s, dict) for s in [*pinned_in.values(), *pinned_out]),
    )


def _json_list(parts: dict[str, str], name: str, default: Any) -> list[Any]:
    try:
        value = json.loads(parts[name])
    except (KeyError, ValueError):
        return list(default)
    return value if isinstance(value, list) else list(default)


def _sharding_for(ids: tuple[int, ...], hlo: Any) -> dict[str, Any]:
    if len(ids) == 1:
        return {"type": "single", "device": ids[0], "memory_kind": None}
    return {
        "type": "gspmd", "device_ids": list(ids), "memory_kind": None,
        "hlo": str(hlo) if hlo is not None else "{replicated}",
    }


def _same_placement(stored: dict[str, Any], ids: tuple[int, ...], hlo: Any, ndim: int) -> bool:
    """True when a stored sharding puts a value on ``ids`` as ``hlo`` (the portable
    HLO's sharding) does."""
    try:
        if sharding_device_ids(stored, ndim) != list(ids):
            return False
        if stored.get("memory_kind") not in (None, "device"):
            return False  # only a sharding pinned at lowering time moves an input
        if hlo is None or len(ids) == 1:
            return True
        sharding = sharding_from_json(stored, live_devices())
        return op_shardings.are_hlo_shardings_equal(sharding._to_xla_hlo_sharding(ndim), hlo)
    except (AotError, ValueError, KeyError, TypeError):
        return False


def _avals_text(avals: Any) -> str:
    return ", ".join(format_aval(shape, dtype) for shape, dtype in avals) or "nothing"


def check_executable(manifest: Manifest, info: ExecutableInfo, xla_executable: Any) -> None:
    """Raises :class:`CorruptArtifactError` when the deserialized executable does not
    take or return what the manifest says (see :func:`executable_problems`)."""
    problems = executable_problems(manifest, info, xla_executable)
    if problems:
        raise CorruptArtifactError(
            f"manifest of {manifest.name!r} ({manifest.key[:12]}) does not describe its "
            f"executable: {'; '.join(problems)}. The index row was altered or the executable "
            "blob belongs to another program; it is not run. Run `aot verify` (it quarantines "
            "the entry) and recompile it (the loader does so from its portable HLO)"
        )


def executable_problems(manifest: Manifest, info: ExecutableInfo, xla_executable: Any) -> list[str]:
    """Where the executable's parameters and results (per-device shapes and dtypes,
    shardings, output memory kinds) differ from the manifest."""
    problems: list[str] = []
    kept = [a for a in info.args if a.kept]
    signature = _entry_signature(xla_executable)
    if signature is not None:
        params, results = signature
        if len(params) == 1 and isinstance(params[0], list) and len(kept) != 1:
            params = params[0]  # arguments passed as one tuple
        results = results if isinstance(results, list) else [results]
        if len(results) == 1 and isinstance(results[0], list) and len(info.out_avals) != 1:
            results = results[0]
        if len(params) != len(kept):
            problems.append(f"the executable takes {len(params)} arguments, the manifest keeps {len(kept)}")
        else:
            for i, (got, arg, sharding) in enumerate(zip(params, kept, info.in_shardings)):
                problems += _shape_problem(f"argument {arg.path!r}", got, arg.shape, arg.dtype, sharding)
        if len(results) != len(info.out_avals):
            problems.append(
                f"the executable returns {len(results)} values, the manifest has {len(info.out_avals)} out_avals"
            )
        else:
            for i, (got, aval, sharding) in enumerate(zip(results, info.out_avals, info.out_shardings)):
                problems += _shape_problem(f"out_avals[{i}]", got, tuple(aval.shape), aval.dtype, sharding)
    if len(info.device_ids) > 1:
        problems += _sharding_problems(
            "in_shardings", _op_shardings(xla_executable.get_parameter_shardings, len(kept)),
            info.in_shardings, [a.shape for a in kept],
        )
        problems += _sharding_problems(
            "out_shardings", _op_shardings(xla_executable.get_output_shardings, len(info.out_avals)),
            info.out_shardings, [tuple(a.shape) for a in info.out_avals],
        )
    try:
        memory_kinds = list(xla_executable.get_output_memory_kinds()[0])
    except Exception:  # noqa: BLE001 - not every backend reports memory kinds
        memory_kinds = []
    if len(memory_kinds) == len(info.out_shardings):
        for i, (kind, stored) in enumerate(zip(memory_kinds, manifest.out_shardings)):
            claimed = stored.get("memory_kind")
            if claimed is not None and kind is not None and claimed != kind:
                problems.append(f"out_shardings[{i}] memory_kind {claimed!r} != the executable's {kind!r}")
    return problems


def _shape_problem(what: str, got: Any, shape: tuple[int, ...], dtype: Any, sharding: Any) -> list[str]:
    if isinstance(got, list):
        return [f"{what}: the executable has a tuple there"]
    try:
        local = _local_shape(tuple(shape), sharding)
    except Exception as exc:  # noqa: BLE001 - jax refuses the sharding for this shape
        return [f"{what}: the manifest's shape {list(shape)} does not fit its sharding ({exc})"]
    try:
        expected = _physical_shape(local, dtype)
    except Exception:  # noqa: BLE001 - a dtype XLA has no array shape for: nothing to compare
        return []
    if got == expected:
        return []
    return [f"{what} is {expected} per device in the manifest, {got} in the executable"]


def _physical_shape(shape: tuple[int, ...], dtype: Any) -> str:
    """How XLA shows an array of ``dtype`` (``s4[2,3]`` for int4): a typed-key array
    is its key data, ``key<fry>[4]`` is ``u32[4,2]``."""
    aval = core.physical_aval(core.ShapedArray(tuple(shape), dtype))
    return _strip_layout(str(xc.Shape.array_shape(np.dtype(aval.dtype), tuple(aval.shape))))


def _local_shape(shape: tuple[int, ...], sharding: Any) -> tuple[int, ...]:
    """The shape of one device's part, as XLA lays it out (padded when uneven)."""
    if sharding is None:
        return shape
    try:
        return tuple(sharding.shard_shape(shape))
    except ValueError:  # uneven: XLA pads each tile to ceil(dim / tiles)
        hlo = sharding._to_xla_hlo_sharding(len(shape))
        tiles = list(hlo.tile_assignment_dimensions())[: len(shape)]
        if hlo.is_replicated() or len(tiles) != len(shape):
            raise
        return tuple(-(-d // t) for d, t in zip(shape, tiles))


def _sharding_problems(what: str, compiled: list[Any] | None, stored: Any, shapes: list[tuple[int, ...]]) -> list[str]:
    if compiled is None:
        return []
    if len(compiled) != len(stored):
        return [f"the executable has {len(compiled)} {what}, the manifest {len(stored)}"]
    problems = []
    for i, (op, sharding, shape) in enumerate(zip(compiled, stored, shapes)):
        try:
            got = xc.HloSharding.from_proto(op)
            if got.is_manual() or 0 in shape:
                continue
            want = sharding._to_xla_hlo_sharding(len(shape))
        except Exception as exc:  # noqa: BLE001 - a sharding jax cannot express for this rank
            problems.append(f"{what}[{i}] cannot be compared with the executable's: {exc}")
            continue
        if not op_shardings.are_hlo_shardings_equal(got, want):
            problems.append(f"{what}[{i}] is {want} in the manifest, {got} in the executable")
    return problems


def _op_shardings(getter: Any, count: int) -> list[Any] | None:
    try:
        shardings = getter()
    except Exception:  # noqa: BLE001 - not every backend reports shardings
        return None
    if not shardings:
        return None
    shardings = list(shardings)
    # XLA puts one sharding on the root tuple when all outputs share it.
    if len(shardings) == 1 and count > 1:
        shardings *= count
    return shardings


# What the module's text need not show: only its first line (the entry computation's
# layout) is read, and XLA prints that line whatever these say. Each one left on grows
# the text of every instruction (2.5x the text and the time with all of them on).
_UNPRINTED = (
    "print_metadata", "print_backend_config", "print_large_constants",
    "print_operand_shape", "print_result_shape", "print_operand_names", "print_ids",
    "print_extra_attributes", "print_control_dependencies", "print_percent",
    "print_program_shape", "include_layout_in_shapes",
)


def _print_options() -> Any:
    options_class = getattr(_hlo, "HloPrintOptions", None)
    if options_class is None:
        return None
    options = options_class.short_parsable()
    for name in _UNPRINTED:
        if hasattr(options, name):
            setattr(options, name, False)
    return options


def _entry_signature(xla_executable: Any) -> tuple[list[Any], Any] | None:
    """The entry computation's parameter and result shapes (per device), from the
    first line of the HLO module's text; None where XLA does not tell.

    jaxlib (0.10) has no cheaper way to them: ``get_parameter_layouts`` gives layouts
    without shapes, ``HloComputation`` neither shapes nor which one is the entry, and
    the module's proto costs more to serialize than its text. So the whole module is
    printed, with every option that does not change its first line switched off."""
    try:
        modules = xla_executable.hlo_modules()
        if len(modules) != 1:
            return None
        options = _print_options()
        text = modules[0].to_string(options) if options is not None else modules[0].to_string()
    except Exception:  # noqa: BLE001 - an executable without an HLO module to show
        return None
    header = _without_comments(text.split("\n", 1)[0])  # long tuples carry /*index=N*/
    start = header.find("entry_computation_layout={")
    if start < 0:
        return None
    try:
        parser = _ShapeParser(header, start + len("entry_computation_layout={"))
        params = parser.shape()
        parser.expect("->")
        result = parser.shape()
    except ValueError:
        return None
    if not isinstance(params, list):
        return None
    return params, result


def _without_comments(line: str) -> str:
    """``line`` without its ``/*...*/`` comments, as a non-greedy ``re.sub`` would
    remove them, without compiling a pattern in every serving process."""
    parts, pos = [], 0
    while (start := line.find("/*", pos)) >= 0 and (end := line.find("*/", start + 2)) >= 0:
        parts.append(line[pos:start])
        pos = end + 2
    parts.append(line[pos:])
    return "".join(parts)


class _ShapeParser:
    """Reads HLO shapes: ``f32[2,2]{1,0}`` -> ``"f32[2,2]"``, ``(a, b)`` -> a list."""

    def __init__(self, text: str, pos: int) -> None:
        self.text = text
        self.pos = pos

    def expect(self, token: str) -> None:
        if not self.text.startswith(token, self.pos):
            raise ValueError(f"expected {token!r} at {self.pos}")
        self.pos += len(token)

    def shape(self) -> Any:
        text = self.text
        if text.startswith("(", self.pos):
            self.pos += 1
            items = []
            while not text.startswith(")", self.pos):
                items.append(self.shape())
                if text.startswith(", ", self.pos):
                    self.pos += 2
                elif not text.startswith(")", self.pos):
                    raise ValueError(f"expected ',' or ')' at {self.pos}")
            self.pos += 1
            return items
        end = text.find("]", self.pos)
        if end < 0 or "[" not in text[self.pos : end]:
            raise ValueError(f"expected an array shape at {self.pos}")
        shape = text[self.pos : end + 1]
        self.pos = end + 1
        if text.startswith("{", self.pos):  # the layout: skip it, braces balanced
            depth = 0
            while self.pos < len(text):
                depth += {"{": 1, "}": -1}.get(text[self.pos], 0)
                self.pos += 1
                if depth == 0:
                    break
        return shape


def _strip_layout(shape: str) -> str:
    return shape.split("{", 1)[0]


def _deserialize(manifest: Manifest, backend: Any, exe_bytes: bytes, dlist: Any) -> Any:
    try:
        return backend.deserialize_executable(exe_bytes, dlist)
    except Exception as exc:  # noqa: BLE001 - XLA reports as RuntimeError/XlaRuntimeError
        raise IncompatibleEnvironmentError(
            f"XLA could not load the executable of {manifest.name!r} ({manifest.key[:12]}): "
            f"{exc}. Recompile it from its portable HLO.",
            (f"deserialize: {exc}",),
        ) from exc


def stored_artifact_problems(artifact: Artifact, current: Fingerprint | None = None) -> list[str]:
    """Everything :func:`load_executable` would refuse in a stored artifact, for
    ``aot verify``: the manifest against its fingerprints, against the portable HLO
    when present, and (for this environment only: other executables cannot be
    deserialized here) against the deserialized executable. Blob digests are the
    caller's job."""
    manifest = artifact.manifest
    problems = manifest_problems(manifest)
    for role, ref in manifest.blobs.items():
        data = artifact.blobs.get(ref.digest)
        if data is not None and len(data) != ref.size:
            problems.append(f"blobs.{role}.size {ref.size} != the blob's {len(data)} bytes")
    if problems:
        return problems
    hlo_ref = manifest.blobs.get(PORTABLE_HLO)
    if hlo_ref is not None and hlo_ref.digest in artifact.blobs:
        problems += portable_hlo_problems(manifest, artifact.blobs[hlo_ref.digest])
    exe_ref = manifest.blobs.get(EXECUTABLE)
    if problems or exe_ref is None or exe_ref.digest not in artifact.blobs:
        return problems
    if environment_differences(manifest, current):
        return problems
    try:
        info = executable_info(manifest)
        devices = live_devices()
        dlist = device_list(manifest.device_ids, devices)
        xla_executable = _deserialize(
            manifest, devices[manifest.device_ids[0]].client, artifact.blobs[exe_ref.digest], dlist
        )
    except AotError as exc:
        return [str(exc)]
    return executable_problems(manifest, info, xla_executable)


def portable_hlo_problems(manifest: Manifest, hlo: bytes) -> list[str]:
    """Where the manifest's argument and output avals or device count differ from the
    portable HLO's (``jax.export``: public API, no XLA needed)."""
    from aot.symbolic import check_dim_text

    try:
        exported = jax.export.deserialize(bytearray(hlo))
    except Exception as exc:  # noqa: BLE001
        return [f"the portable HLO cannot be read: {exc}"]
    problems: list[str] = []
    hlo_in, hlo_out = _hlo_avals(manifest, exported)
    pairs = (
        ("args", [(a.get("shape"), a.get("dtype")) for a in manifest.args], hlo_in),
        ("out_avals", [(a.get("shape"), a.get("dtype")) for a in manifest.out_avals], hlo_out),
    )
    for what, stored, avals in pairs:
        try:
            # Dimensions as text: a symbolic entry's are expressions ("b", "2*b").
            mine = [(tuple(check_dim_text(d) if isinstance(d, str) else int(d) for d in shape), _dtype(dtype))
                    for shape, dtype in stored]
        except (AotError, TypeError, ValueError) as exc:
            problems.append(f"{what} cannot be read: {exc}")
            continue
        theirs = avals
        if mine != theirs:
            problems.append(f"{what} ({_avals_text(mine)}) != the portable HLO's ({_avals_text(theirs)})")
    if exported.nr_devices != len(manifest.device_ids):
        problems.append(
            f"device_ids name {len(manifest.device_ids)} devices, the portable HLO was "
            f"exported for {exported.nr_devices}"
        )
    return problems


def _hlo_avals(manifest: Manifest, exported: Any) -> tuple[list[Any], list[Any]]:
    """The portable HLO's input and output avals as ``(dims, dtype)``: symbolic
    dimensions as their text (``"b"``), or, for a concrete entry compiled from a
    symbolic one (which keeps the symbolic portable HLO), evaluated for the entry's
    argument shapes. Shapes that do not bind stay symbolic, so they compare unequal."""
    from aot.symbolic import bind, format_dim, is_symbolic_dim

    def as_text(avals: Any) -> list[Any]:
        return [
            (tuple(format_dim(d) if is_symbolic_dim(d) else int(d) for d in a.shape), a.dtype)
            for a in avals
        ]

    ins, outs = as_text(exported.in_avals), as_text(exported.out_avals)
    if manifest.is_symbolic or not any(isinstance(d, str) for dims, _ in ins for d in dims):
        return ins, outs
    try:
        shapes = [tuple(int(d) for d in a["shape"]) for a in manifest.args]
    except (KeyError, TypeError, ValueError):
        return ins, outs  # unreadable: the caller says so
    binding = bind([dims for dims, _ in ins], shapes)
    if not binding.ok:
        return ins, outs
    from jax._src.export import shape_poly

    evaluator = shape_poly.ShapeEvaluator(binding.values or {})

    def concrete(avals: Any) -> list[Any]:
        return [
            (tuple(int(evaluator.evaluate(d)) if is_symbolic_dim(d) else int(d) for d in a.shape), a.dtype)
            for a in avals
        ]

    try:
        return concrete(exported.in_avals), concrete(exported.out_avals)
    except Exception:  # noqa: BLE001 - an expression jax cannot evaluate here
        return ins, outs
