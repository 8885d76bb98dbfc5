"""Rehydrating stored executables: a manifest resolved against this process's
devices (:func:`executable_info`), and XLA's bytes deserialized into a callable
:class:`~aot.executable.MeshExecutable` after every check (:func:`load_executable`).
Building artifacts is :mod:`aot.build`, recompiling them :mod:`aot.recompile`; the JAX
internals both need are in :mod:`aot.jaxcompat`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import jax

from aot import treedef as treedefs
from aot.ahead import take
from aot.constants import unpack
from aot.artifact import (
    CONSTANTS,
    EXECUTABLE,
    PORTABLE_HLO,
    Artifact,
    Manifest,
    check_environment,
    check_manifest,
    environment_differences,
    manifest_problems,
    parse_manifest_dtype,
)
from aot.errors import (
    AotError,
    CorruptArtifactError,
    DeviceUnavailableError,
    IncompatibleEnvironmentError,
    PytreeNodeError,
    SymbolicShapeError,
)
from aot.executable import ArgAval, ExecutableInfo, MeshExecutable, executable_class
from aot.executable_checks import check_executable, executable_problems, portable_hlo_problems
from aot.fingerprint import Fingerprint
from aot.jaxcompat.deserialize import ensure_custom_call_targets, load_compiled
from aot.libtpu_log import deserialize_quietly, quiet_cpu_load
from aot.shardings import aval_from_json, device_list, live_devices, sharding_from_json

log = logging.getLogger(__name__)


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
        jax.ShapeDtypeStruct(tuple(a["shape"]), parse_manifest_dtype(a["dtype"]), sharding=s)
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
        statics=manifest.statics,
        autotune=manifest.autotune,
        constants=tuple(
            jax.ShapeDtypeStruct(c.shape, parse_manifest_dtype(c.dtype), sharding=sharding_from_json(c.sharding, devices))
            for c in manifest.constants
        ),
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
            parse_manifest_dtype(a["dtype"]),
            bool(a["donated"]),
            bool(a["kept"]),
            bool(a.get("weak_type", False)),
        )
        for a in manifest.args
    )


def _deserialize(
    manifest: Manifest, backend: Any, exe_bytes: bytes, dlist: Any, callbacks: list[Any] | None = None
) -> Any:
    try:
        if manifest.host_callbacks:
            from aot.jaxcompat.callbacks import deserialize_with_callbacks  # host callbacks only

            if callbacks is None:  # verify: a cross-check, never run
                callbacks = [_never_called] * len(manifest.host_callbacks)
            if backend.platform != "cpu":
                return deserialize_with_callbacks(backend, exe_bytes, dlist, callbacks)
            with quiet_cpu_load():  # jaxlib 0.9's loader writes lines that are no error (libtpu_log)
                return deserialize_with_callbacks(backend, exe_bytes, dlist, callbacks)
        return deserialize_quietly(backend, exe_bytes, dlist)
    except Exception as exc:  # noqa: BLE001 - XLA reports as RuntimeError/XlaRuntimeError
        raise IncompatibleEnvironmentError(
            f"XLA could not load the executable of {manifest.name!r} ({manifest.key[:12]}): "
            f"{exc}. Recompile it from its portable HLO.",
            (f"deserialize: {exc}",),
        ) from exc


def _device_constants(manifest: Manifest, info: ExecutableInfo, blob: bytes | None) -> list[tuple[Any, Any]]:
    """The hoisted constants of a verified blob, put once on the devices and shardings
    the executable takes them on (every call passes these arrays: no per-call copy),
    each with its aval."""
    if blob is None:
        return []
    arrays = unpack(blob, manifest.constants, parse_manifest_dtype)
    return [
        (jax.device_put(array, aval.sharding), jax.core.ShapedArray(aval.shape, aval.dtype))
        for array, aval in zip(arrays, info.constants)
    ]


def _never_called(*args: Any) -> Any:
    raise RuntimeError("an executable loaded to be checked is not run")


def _bound_callbacks(manifest: Manifest) -> list[Any]:
    if not manifest.host_callbacks:
        return []  # and aot.callbacks is not imported: most programs have no host callback
    from aot.callbacks import resolve

    try:
        return [resolve(manifest.name, dict(b)) for b in manifest.host_callbacks]
    except AotError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptArtifactError(
            f"manifest of {manifest.name!r} ({manifest.key[:12]}) has a malformed host "
            f"callback: {exc!r}; run `aot verify` and recompile the entry"
        ) from None


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
    except PytreeNodeError as exc:
        # A node this process cannot import: the entry's, not a fault of what is stored.
        log.info("%s (%s): not cross-checked in this process: %s", manifest.name, manifest.key[:12], exc)
        return problems
    except DeviceUnavailableError:
        raise  # this process cannot open the device: nothing about the entry
    except AotError as exc:
        return [str(exc)]
    return executable_problems(manifest, info, xla_executable)


def load_executable(
    artifact: Artifact,
    *,
    check_env: bool = True,
    current: Fingerprint | None = None,
    flat_outputs: bool = False,
    manifest_checked: bool = False,
) -> MeshExecutable:
    """Rehydrates a stored executable: digest first, then environment, then XLA.

    ``manifest_checked``: the caller has run :func:`aot.artifact.manifest_problems` on
    this very manifest object and found nothing (``aot.load`` files a row so), so it
    is not run twice."""
    manifest = artifact.manifest
    if manifest.is_symbolic:
        raise SymbolicShapeError(
            f"{manifest.name} ({manifest.signature}, {manifest.key[:12]}) is a symbolic "
            "entry: it holds portable HLO and no executable. Serve it with "
            "aot.load(name), which compiles it for each concrete shape it is called with"
        )
    exe_bytes = artifact.blob(EXECUTABLE)  # verifies the digest before anything else
    constants_bytes = artifact.blob(CONSTANTS) if manifest.constants else None  # and this one
    if check_env:
        check_environment(manifest, current)
    if not manifest_checked:
        check_manifest(manifest)  # fields outside the key, against the fingerprints
    info = executable_info(manifest, flat_outputs=flat_outputs)
    devices = live_devices()
    dlist = device_list(manifest.device_ids, devices)  # names a missing device id
    backend = devices[manifest.device_ids[0]].client
    ensure_custom_call_targets(devices[manifest.device_ids[0]].platform, exe_bytes)
    start = time.perf_counter()
    callbacks = _bound_callbacks(manifest)
    # The same verified bytes onto the same devices, deserialized while the load got here.
    xla_executable = None if callbacks else take(manifest.blobs[EXECUTABLE].digest, manifest.device_ids, backend)
    if xla_executable is None:
        xla_executable = _deserialize(manifest, backend, exe_bytes, dlist, callbacks)
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
    compiled = load_compiled(
        xla_executable,
        devices=dlist,
        backend=backend,
        in_avals=in_avals,
        in_shardings=kept_shardings,
        out_avals=out_avals,
        out_shardings=info.out_shardings,
        committed=manifest.committed,
        name=manifest.xla_name,
        kept_var_idx={i for i, a in enumerate(info.args) if a.kept},
        args=info.args,
        in_tree=info.in_tree,
        out_tree=info.out_tree,
        host_callbacks=callbacks,
        constants=_device_constants(manifest, info, constants_bytes),
    )
    log.debug(
        "loaded %s (%s) in %.1f ms", manifest.name, manifest.signature,
        (time.perf_counter() - start) * 1e3,
    )
    return executable_class(manifest.kind)(compiled, info)

