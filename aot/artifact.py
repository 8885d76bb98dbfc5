"""The artifact: a JSON manifest plus content-addressed blobs. No pickle anywhere.

Blobs, by role:
  ``executable``    XLA's own serialized executable (PJRT ``serialize_executable``)
  ``portable_hlo``  the ``jax.export`` serialization (StableHLO + avals + shardings)

Both are opaque bytes covered by their sha256 in the manifest; the manifest itself can
carry an HMAC-SHA256 over its canonical JSON (see :mod:`aot.signing`).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jax
import jaxlib
import numpy as np
from jax._src import core, stages
from jax._src.interpreters import pxla

from aot import treedef as treedefs
from aot.errors import AotError, CorruptArtifactError, IncompatibleEnvironmentError
from aot.executable import ArgAval, ExecutableInfo, MeshExecutable, executable_class
from aot.fingerprint import (
    Fingerprint,
    PartDifference,
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
from aot.specs import format_aval, parse_dtype

log = logging.getLogger(__name__)

# The on-disk format. Bump on any change a reader of the previous version would
# misread, and say what changed:
#   1 (2026-12-02): first format: manifest JSON + executable and portable_hlo blobs.
FORMAT_VERSION = 1

EXECUTABLE = "executable"
PORTABLE_HLO = "portable_hlo"
ROLES = (EXECUTABLE, PORTABLE_HLO)


@dataclass(frozen=True, slots=True)
class BlobRef:
    digest: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "size": self.size}


@dataclass(frozen=True, slots=True)
class Manifest:
    """Everything needed to call a stored executable with no tracing (JSON, no pickle)."""

    name: str
    kind: str
    key: str
    signature: str
    program: Fingerprint
    environment: Fingerprint
    in_tree: dict[str, Any]
    out_tree: dict[str, Any]
    args: tuple[dict[str, Any], ...]
    in_avals: tuple[dict[str, Any], ...]
    in_shardings: tuple[dict[str, Any], ...]
    out_avals: tuple[dict[str, Any], ...]
    out_shardings: tuple[dict[str, Any], ...]
    device_ids: tuple[int, ...]
    committed: bool
    xla_name: str
    blobs: Mapping[str, BlobRef]
    jax_version: str = jax.__version__
    jaxlib_version: str = jaxlib.__version__
    compile_seconds: float = 0.0
    created_at: str = ""
    cost_analysis: Mapping[str, float] | None = None
    memory_analysis: Mapping[str, int] | None = None
    format_version: int = FORMAT_VERSION
    # Optional (absent in manifests written before it existed): positional parameter
    # names, so that errors of loaded executables say "nothing", not "args[3]".
    arg_names: tuple[str, ...] = ()
    hmac: str | None = field(default=None, compare=False)

    # -- (de)serialization
    def to_dict(self, *, include_hmac: bool = True) -> dict[str, Any]:
        data = {
            "format_version": self.format_version,
            "name": self.name,
            "kind": self.kind,
            "key": self.key,
            "signature": self.signature,
            "program": self.program.to_dict(),
            "environment": self.environment.to_dict(),
            "in_tree": self.in_tree,
            "out_tree": self.out_tree,
            "args": list(self.args),
            "in_avals": list(self.in_avals),
            "in_shardings": list(self.in_shardings),
            "out_avals": list(self.out_avals),
            "out_shardings": list(self.out_shardings),
            "device_ids": list(self.device_ids),
            "committed": self.committed,
            "xla_name": self.xla_name,
            "blobs": {role: ref.to_dict() for role, ref in sorted(self.blobs.items())},
            "jax_version": self.jax_version,
            "jaxlib_version": self.jaxlib_version,
            "compile_seconds": self.compile_seconds,
            "created_at": self.created_at,
            "cost_analysis": dict(self.cost_analysis) if self.cost_analysis else None,
            "memory_analysis": dict(self.memory_analysis) if self.memory_analysis else None,
        }
        if self.arg_names:
            data["arg_names"] = list(self.arg_names)
        if include_hmac and self.hmac is not None:
            data["hmac"] = self.hmac
        return data

    def to_json(self) -> str:
        return canonical_json(self.to_dict())

    def signed_payload(self) -> bytes:
        """The canonical bytes an HMAC covers: everything but the HMAC itself."""
        return canonical_json(self.to_dict(include_hmac=False)).encode()

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # too deep: recursion
            raise CorruptArtifactError(f"manifest is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        if not isinstance(data, dict):
            raise CorruptArtifactError(f"manifest is not a JSON object: {str(data)[:80]!r}")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise IncompatibleEnvironmentError(
                f"artifact format version {version!r} != {FORMAT_VERSION} (this jax-aot "
                "reads only its own format); recompile the entry with this jax-aot "
                "(aot warmup / aot compile) or use the jax-aot that wrote it",
                (f"format_version {version!r} != {FORMAT_VERSION}",),
            )
        try:
            blobs = {
                str(role): BlobRef(str(ref["digest"]), int(ref["size"]))
                for role, ref in data["blobs"].items()
            }
            manifest = cls(
                name=str(data["name"]),
                kind=str(data["kind"]),
                key=str(data["key"]),
                signature=str(data["signature"]),
                program=Fingerprint.from_dict(data["program"]),
                environment=Fingerprint.from_dict(data["environment"]),
                in_tree=dict(data["in_tree"]),
                out_tree=dict(data["out_tree"]),
                args=tuple(dict(a) for a in data["args"]),
                in_avals=tuple(dict(a) for a in data["in_avals"]),
                in_shardings=tuple(dict(s) for s in data["in_shardings"]),
                out_avals=tuple(dict(a) for a in data["out_avals"]),
                out_shardings=tuple(dict(s) for s in data["out_shardings"]),
                device_ids=tuple(int(i) for i in data["device_ids"]),
                committed=bool(data["committed"]),
                xla_name=str(data["xla_name"]),
                blobs=blobs,
                jax_version=str(data["jax_version"]),
                jaxlib_version=str(data["jaxlib_version"]),
                compile_seconds=float(data.get("compile_seconds", 0.0)),
                created_at=str(data.get("created_at", "")),
                cost_analysis=_object_or_none(data.get("cost_analysis")),
                memory_analysis=_object_or_none(data.get("memory_analysis")),
                arg_names=tuple(str(n) for n in data.get("arg_names", ())),
                hmac=_string_or_none(data.get("hmac")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptArtifactError(f"manifest is missing or has a malformed field: {exc!r}") from None
        if manifest.kind not in ("jit", "pmap"):
            raise CorruptArtifactError(f"manifest kind {manifest.kind!r} is not 'jit' or 'pmap'")
        if combined_key(manifest.program, manifest.environment) != manifest.key:
            raise CorruptArtifactError(
                f"manifest of {manifest.name!r}: key {manifest.key[:16]} does not match its "
                "fingerprints; the manifest was altered"
            )
        # The argument avals the loader checks inputs against are not hashed into the
        # key themselves; the program fingerprint's in_avals part is. They must agree,
        # or a manifest edited to f32[16,8] would run a f32[8,16] program on it.
        try:
            signature = ", ".join(format_aval(a["shape"], _dtype(a["dtype"])) for a in manifest.args)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptArtifactError(f"manifest has a malformed argument: {exc!r}") from None
        recorded = manifest.program.as_dict().get("in_avals")
        if signature != recorded or signature != manifest.signature:
            raise CorruptArtifactError(
                f"manifest of {manifest.name!r}: argument avals ({signature}) do not match "
                f"its program fingerprint ({recorded}); the manifest was altered"
            )
        return manifest

    @property
    def raw_size(self) -> int:
        return sum(ref.size for ref in self.blobs.values())


@dataclass(frozen=True)
class Artifact:
    """A manifest and its blobs (``digest -> bytes``)."""

    manifest: Manifest
    blobs: Mapping[str, bytes]

    def blob(self, role: str) -> bytes:
        """The bytes of ``role``, verified against the manifest digest."""
        ref = self.manifest.blobs.get(role)
        if ref is None:
            raise CorruptArtifactError(f"artifact {self.manifest.name!r} has no {role} blob")
        data = self.blobs.get(ref.digest)
        if data is None:
            raise CorruptArtifactError(
                f"artifact {self.manifest.name!r} ({self.manifest.key[:12]}): {role} blob "
                f"{ref.digest[:16]} is missing; run `aot verify` and recompile the entry"
            )
        verify_digest(data, ref.digest, what=f"{role} blob of {self.manifest.name!r}")
        return data

    # -- a folder: manifest.json + <digest>.bin, for tests and hand-carried copies
    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for digest, data in self.blobs.items():
            (folder / f"{digest}.bin").write_bytes(data)
        (folder / "manifest.json").write_text(self.manifest.to_json())
        return folder

    @classmethod
    def open(cls, folder: str | Path) -> Artifact:
        folder = Path(folder)
        try:
            manifest = Manifest.from_json((folder / "manifest.json").read_bytes())
        except FileNotFoundError:
            raise CorruptArtifactError(f"{folder} has no manifest.json") from None
        blobs: dict[str, bytes] = {}
        for ref in manifest.blobs.values():
            path = folder / f"{ref.digest}.bin"
            if path.exists():
                blobs[ref.digest] = path.read_bytes()
        return cls(manifest, blobs)


def _object_or_none(value: Any) -> Any:
    if value is not None and not isinstance(value, dict):
        raise TypeError(f"expected an object or null, got {str(value)[:40]!r}")
    return value


def _string_or_none(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"expected a string or null, got {str(value)[:40]!r}")
    return value


def verify_digest(data: bytes, digest: str, *, what: str) -> None:
    actual = sha256_hex(data)
    if actual != digest:
        raise CorruptArtifactError(
            f"{what}: sha256 {actual[:16]}... != expected {digest[:16]}...; the bytes were "
            "altered or truncated and will not be executed. Run `aot verify` (it "
            "quarantines the entry) and recompile it."
        )


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


def environment_differences(
    manifest: Manifest, current: Fingerprint | None = None
) -> tuple[PartDifference, ...]:
    current = current or environment_fingerprint()
    return manifest.environment.diff(current)


def check_environment(manifest: Manifest, current: Fingerprint | None = None) -> None:
    diffs = environment_differences(manifest, current)
    if diffs:
        described = tuple(d.describe() for d in diffs)
        raise IncompatibleEnvironmentError(
            f"artifact {manifest.name!r} ({manifest.key[:12]}) was compiled for another "
            f"environment: {'; '.join(described)}. Recompile it here (aot.load without "
            "strict=True does so from the stored portable HLO) or run on a matching host.",
            described,
        )


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


def _dtype(name: Any) -> np.dtype:
    try:
        return parse_dtype(str(name))
    except Exception:  # noqa: BLE001
        raise CorruptArtifactError(f"manifest names an unknown dtype {name!r}") from None


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
