"""Compiling stored portable HLO for this environment, with no model code: an entry
whose executable cannot be served here (:func:`recompile`), and a symbolic entry for
the concrete shapes it is called with (:func:`compile_symbolic`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import jax

from aot import treedef as treedefs
from aot.artifact import PORTABLE_HLO, Artifact, Manifest, manifest_problems, parse_manifest_dtype, sharding_device_ids
from aot.build import build_artifact
from aot.errors import AotError, CorruptArtifactError
from aot.executable import ArgAval, ExecutableInfo, executable_class
from aot.executable_checks import avals_text, hlo_avals
from aot.export_window import check_expiry, check_window, refusal
from aot.fingerprint import Fingerprint, canonical_json, environment_fingerprint
from aot.jaxcompat.build import built_unloaded_executable
from aot.jaxcompat.releases import same_release
from aot.jaxcompat.shardings import hlo_sharding, hlo_shardings_equal
from aot.shardings import live_devices, sharding_from_json, sharding_to_json

log = logging.getLogger(__name__)


def recompile(artifact: Artifact) -> Artifact:
    """Compiles the stored portable HLO for this environment: no model code needed.

    The new artifact keeps the program fingerprint (it is the same program) and gets
    this environment's fingerprint. The manifest may be why the stored executable was
    refused, so only what the fingerprints and the portable HLO vouch for is taken
    from it (:func:`trusted_inputs`).
    """
    manifest = artifact.manifest
    hlo = artifact.blob(PORTABLE_HLO)
    # JAX 0.11.1+'s refusals, said with the export's date and the refresh that fixes them.
    check_expiry(manifest.name, manifest.key, manifest.jax_version, hlo)
    try:
        exported = jax.export.deserialize(bytearray(hlo))
    except Exception as exc:  # noqa: BLE001 - flatbuffer and version errors vary
        raise refusal(manifest.name, manifest.key, manifest.jax_version, "read", exc) from None
    check_window(manifest.name, manifest.key, manifest.jax_version, exported)
    trusted = trusted_inputs(manifest, exported)
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
    # The compiler options are part of the program (its fingerprint's compile_options):
    # compiled without them, the executable would be another program under the same key.
    try:
        # Lowering reads the StableHLO module inside: the third part of the window.
        lowered = jitted.trace(*specs).lower()
    except Exception as exc:  # noqa: BLE001 - MLIR's errors vary
        if same_release(manifest.jax_version):
            raise
        raise refusal(manifest.name, manifest.key, manifest.jax_version, "lowered", exc) from exc
    compiled = lowered.compile(stored_compiler_options(manifest) or None)
    seconds = time.perf_counter() - start
    unloaded = built_unloaded_executable(compiled)
    kept = set(unloaded.kept_var_idx)
    info = ExecutableInfo(
        name=trusted.name,
        kind=trusted.kind,
        # Stand-ins for nodes this process cannot rebuild: the stored JSON replaces
        # these structures below.
        in_tree=treedefs.from_json(manifest.in_tree, standins=True),
        out_tree=treedefs.from_json(manifest.out_tree, standins=True),
        args=tuple(replace(a, kept=i in kept) for i, a in enumerate(trusted.args)),
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
        statics=manifest.statics,
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
    check_expiry(manifest.name, manifest.key, manifest.jax_version, hlo)
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
            tuple(int(d) for d in shape), parse_manifest_dtype(a["dtype"]), sharding=sharding,
            weak_type=bool(a.get("weak_type", False)),
        ))
    donated = tuple(i for i, a in enumerate(manifest.args) if a["donated"])
    start = time.perf_counter()
    jitted = jax.jit(exported.call, donate_argnums=donated)
    compiled = jitted.trace(*specs).lower().compile(stored_compiler_options(manifest) or None)
    seconds = time.perf_counter() - start
    unloaded = built_unloaded_executable(compiled)
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
        statics=manifest.statics,
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


@dataclass(frozen=True, slots=True)
class TrustedInputs:
    """What a recompilation takes from a manifest, each field vouched for by the
    program fingerprint or the portable HLO."""

    name: str
    kind: str
    args: tuple[ArgAval, ...]
    device_ids: tuple[int, ...]
    in_shardings: dict[int, dict[str, Any]]  # argument index -> sharding JSON
    out_shardings: tuple[dict[str, Any] | None, ...]  # None: not asked for
    pinned: bool  # some sharding was asked for at lowering time


def trusted_inputs(manifest: Manifest, exported: Any) -> TrustedInputs:
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
    args_avals = [(tuple(int(d) for d in a["shape"]), parse_manifest_dtype(a["dtype"])) for a in manifest.args]
    exported_avals, _ = hlo_avals(manifest, exported)
    if args_avals != exported_avals:
        raise CorruptArtifactError(
            f"the portable HLO of {label} takes {avals_text(exported_avals)}, but the program "
            f"takes {avals_text(args_avals)}: the blob belongs to another program; "
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
    return TrustedInputs(
        name=program.get("name", manifest.name),
        kind=program.get("kind", manifest.kind),
        args=args,
        device_ids=ids,
        in_shardings=in_shardings,
        out_shardings=out_shardings,
        pinned=any(isinstance(s, dict) for s in [*pinned_in.values(), *pinned_out]),
    )


def stored_compiler_options(manifest: Manifest) -> dict[str, Any]:
    """The XLA compiler options the entry was compiled with (``compiler_options=`` of
    :func:`aot.lower`), from its program fingerprint."""
    try:
        value = json.loads(manifest.program.as_dict().get("compile_options") or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


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
        return hlo_shardings_equal(hlo_sharding(sharding, ndim), hlo)
    except (AotError, ValueError, KeyError, TypeError):
        return False

