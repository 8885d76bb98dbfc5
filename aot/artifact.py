"""The artifact: a JSON manifest plus content-addressed blobs. No pickle anywhere.

Blobs, by role:
  ``executable``    XLA's own serialized executable (PJRT ``serialize_executable``)
  ``portable_hlo``  the ``jax.export`` serialization (StableHLO + avals + shardings)
  ``constants``     the closed-over arrays JAX hoisted into arguments (:mod:`aot.constants`)

Both are opaque bytes covered by their sha256 in the manifest; the manifest itself can
carry an HMAC-SHA256 over its canonical JSON (see :mod:`aot.signing`).

This module is the pure data format: it imports no JAX internals, so gc, verify,
bundles and push/pull never load them. Building an artifact from a compiled
executable lives in :mod:`aot.build`, rehydrating one in :mod:`aot.rehydrate`.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aot.constants import CONSTANTS, PART as CONSTANTS_PART, Constant, problems as constants_problems
from aot.dtype_names import short_dtype
from aot.errors import CorruptArtifactError, IncompatibleEnvironmentError
from aot.fingerprint import (
    Fingerprint,
    canonical_json,
    combined_key,
    environment_fingerprint,
    sha256_hex,
)
from aot.statics import StaticArg, statics_from_json, with_statics

if TYPE_CHECKING:
    from aot.fingerprint import PartDifference

log = logging.getLogger(__name__)

# The on-disk format. Bump on any change a reader of the previous version would
# misread, and say what changed:
#   1 (2026-12-02): first format: manifest JSON + executable and portable_hlo blobs.
#   2 (2026-12-02): two changes, both readers' concern:
#      - symbolic (shape-polymorphic) entries: a "symbolic" object
#        ({"constraints": [...]}), argument and output shapes whose symbolic
#        dimensions are expression strings ("b", "2*b"), and no executable blob
#        (portable_hlo only);
#      - pytree nodes carry their type path and a digest of their auxiliary data and
#        store the data only when it round-trips (tagged JSON values:
#        {"$": "tuple", ...}); dtypes int2/int4/uint2/uint4, float8_*,
#        float4_e2m1fn, key<impl>; args record "weak_type".
#      Version-1 manifests (none of these) are still read and keep their version.
#   3 (2026-12-04): static arguments are part of an entry's identity: a "statics" list
#      ({"index", "name", "repr"} per static, aot.statics), written only when the
#      entry has statics; the signature ends with them ("f32[8], act='relu'") and the
#      program fingerprint has a "statics" part. A reader of version 2 would refuse
#      such a signature as altered. Version-1/2 manifests read as "no statics".
#   4 (2026-12-04): host callbacks of allow-listed libraries (aot.callbacks): a
#      "host_callbacks" list ({"primitive", "function": "module:qualname", "closure",
#      "in_tree", "results"} per callback index), written only when the program calls
#      back, covered by the program fingerprint's "host_callbacks" part. A reader of
#      version 3 would load such an executable without its callbacks.
#      Version-1/2/3 manifests read as "no host callbacks".
#   5 (2026-12-07): closed-over constants hoisted into arguments (JAX >= 0.11): a
#      "constants" list ({"dtype", "shape", "offset", "size", "sharding"} per leading
#      argument of the executable) and a "constants" blob (their raw bytes), pinned by
#      the program fingerprint's "constants" part. A reader of version 4 would call
#      the executable without them. Version-1..4 manifests read as "no constants".
FORMAT_VERSION = 5
READABLE_FORMAT_VERSIONS = (1, 2, 3, 4, 5)


def lowest_format_version(
    *, statics: Sequence[Any] = (), host_callbacks: Sequence[Any] = (), constants: Sequence[Any] = ()
) -> int:
    """The oldest format that carries a new manifest's fields. Written instead of the
    newest, it lets replicas still on an older jax-aot serve every entry they can read
    (a rolling upgrade in either order); only an entry that needs a newer field is
    refused by them, as an incompatible environment."""
    if constants:
        return 5
    if host_callbacks:
        return 4
    if statics:
        return 3
    return 2  # every manifest written since format 2 has its pytree encoding and weak types

EXECUTABLE = "executable"
PORTABLE_HLO = "portable_hlo"
ROLES = (EXECUTABLE, PORTABLE_HLO, CONSTANTS)
# A symbolic entry's sharding that was not given at lowering time (chosen by XLA when
# the entry is compiled for a concrete shape).
UNSPECIFIED_SHARDING = {"type": "unspecified"}


@dataclass(frozen=True, slots=True)
class BlobRef:
    """A blob as a manifest names it: the sha256 of its bytes and their size."""

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
    jax_version: str = field(default_factory=lambda: _versions()[0])
    jaxlib_version: str = field(default_factory=lambda: _versions()[1])
    compile_seconds: float = 0.0
    created_at: str = ""
    cost_analysis: Mapping[str, float] | None = None
    memory_analysis: Mapping[str, int] | None = None
    format_version: int = 0  # 0: the lowest format that carries the fields (set at init)
    # Optional (absent in manifests written before it existed): positional parameter
    # names, so that errors of loaded executables say "nothing", not "args[3]"; then
    # the names of the parameters after them that may be passed either way, so that a
    # keyword call maps onto the compiled form (still a list of names: no format change).
    arg_names: tuple[str, ...] = ()
    # Present only for a symbolic entry (format 2): {"constraints": ["b <= 64", ...]}.
    symbolic: Mapping[str, Any] | None = None
    # The static arguments' values (format 3; absent: none), covered by the key's
    # "statics" part and shown at the end of the signature.
    statics: tuple[StaticArg, ...] = ()
    # The host callbacks of the program, bound by name (format 4; absent: none),
    # covered by the key's "host_callbacks" part.
    host_callbacks: tuple[dict[str, Any], ...] = ()
    # A GPU entry's autotuning (absent elsewhere, and in manifests written before it):
    # "tuned sha256:..." (the GPU's captured results), "defaults" (XLA's default configs),
    # "measured" (compiled on the GPU). Informational: the gate reads it (--require-tuned).
    autotune: str | None = None
    # The constants JAX hoisted into the executable's leading arguments (format 5;
    # absent: none), their bytes in the "constants" blob (aot.constants).
    constants: tuple[Constant, ...] = ()
    hmac: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.format_version == 0:
            lowest = lowest_format_version(
                statics=self.statics, host_callbacks=self.host_callbacks, constants=self.constants
            )
            object.__setattr__(self, "format_version", lowest)

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
        if self.symbolic is not None:
            data["symbolic"] = dict(self.symbolic)
        if self.statics:
            data["statics"] = [s.to_dict() for s in self.statics]
        if self.host_callbacks:
            data["host_callbacks"] = [dict(b) for b in self.host_callbacks]
        if self.autotune is not None:
            data["autotune"] = self.autotune
        if self.constants:
            data["constants"] = [c.to_dict() for c in self.constants]
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
        if version not in READABLE_FORMAT_VERSIONS or type(version) is not int:
            raise IncompatibleEnvironmentError(
                f"artifact format version {version!r} != {FORMAT_VERSION} (this jax-aot "
                f"reads formats {', '.join(map(str, READABLE_FORMAT_VERSIONS))}); recompile the entry with this jax-aot "
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
                symbolic=_symbolic_or_none(data.get("symbolic")),
                statics=statics_from_json(data.get("statics")),
                host_callbacks=tuple(dict(b) for b in data.get("host_callbacks", ())),
                autotune=_string_or_none(data.get("autotune")),
                constants=tuple(Constant.from_dict(c) for c in data.get("constants", ())),
                # As written: a version-1 manifest stays version 1 (its HMAC covers it).
                format_version=int(version),
                hmac=_string_or_none(data.get("hmac")),
            )
            _check_symbolic(manifest)
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
            signature = ", ".join(manifest_aval_text(a) for a in manifest.args)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptArtifactError(f"manifest has a malformed argument: {exc!r}") from None
        recorded = manifest.program.as_dict().get("in_avals")
        if signature != recorded or with_statics(signature, manifest.statics) != manifest.signature:
            raise CorruptArtifactError(
                f"manifest of {manifest.name!r}: argument avals ({signature}) do not match "
                f"its program fingerprint ({recorded}); the manifest was altered"
            )
        # The statics select the entry a call is served: they must be the ones the key covers.
        statics_part = manifest.program.as_dict().get("statics")
        expected = canonical_json([s.to_dict() for s in manifest.statics]) if manifest.statics else None
        if statics_part != expected:
            raise CorruptArtifactError(
                f"manifest of {manifest.name!r}: statics ({with_statics('', manifest.statics) or 'none'}) "
                "do not match its program fingerprint; the manifest was altered"
            )
        callbacks_part = manifest.program.as_dict().get("host_callbacks")
        expected = canonical_json(list(manifest.host_callbacks)) if manifest.host_callbacks else None
        if callbacks_part != expected:
            raise CorruptArtifactError(
                f"manifest of {manifest.name!r}: host callbacks do not match its program "
                "fingerprint; the manifest was altered"
            )
        return manifest

    @property
    def raw_size(self) -> int:
        return sum(ref.size for ref in self.blobs.values())

    @property
    def is_symbolic(self) -> bool:
        """A shape-polymorphic entry: portable HLO only, compiled per concrete shape."""
        return self.symbolic is not None

    @property
    def symbolic_constraints(self) -> tuple[str, ...]:
        return tuple(self.symbolic.get("constraints", ())) if self.symbolic is not None else ()


@dataclass(frozen=True)
class Artifact:
    """A manifest and its blobs (``digest -> bytes``).

    ``verified``: blobs whose digest the reader has already checked (a content store
    hashes every blob it returns); :meth:`blob` does not hash those same bytes objects
    again (a second pass over a large executable), and hashes anything else,
    including bytes swapped in afterwards.
    """

    manifest: Manifest
    blobs: Mapping[str, bytes]
    verified: Mapping[str, bytes] = field(default_factory=dict, repr=False, compare=False)

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
        if self.verified.get(ref.digest) is not data:
            verify_digest(data, ref.digest, what=f"{role} blob of {self.manifest.name!r}")
        if len(data) != ref.size:
            raise CorruptArtifactError(
                f"artifact {self.manifest.name!r} ({self.manifest.key[:12]}): the manifest says "
                f"its {role} blob has {ref.size} bytes, it has {len(data)}; the manifest was "
                "altered. Run `aot verify` and recompile the entry"
            )
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


def _symbolic_or_none(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"constraints"}:
        raise TypeError(f"expected a symbolic object {{'constraints': [...]}}, got {str(value)[:60]!r}")
    constraints = value.get("constraints", [])
    if not isinstance(constraints, list) or not all(
        isinstance(c, str) and 0 < len(c) <= 200 and re.fullmatch(r"[A-Za-z0-9_+\-*(), <>=]+", c)
        for c in constraints
    ):
        raise ValueError(f"malformed symbolic constraints {str(constraints)[:60]!r}")
    return {"constraints": list(constraints)}


def _check_symbolic(manifest: Manifest) -> None:
    """A symbolic manifest has dimension texts and portable HLO only; a concrete one
    has integer dimensions and an executable."""
    shapes = [a["shape"] for a in manifest.args] + [a["shape"] for a in manifest.out_avals]
    texts = [d for shape in shapes for d in shape if isinstance(d, str)]
    if manifest.symbolic is None:
        if texts:
            raise ValueError(f"symbolic dimension {texts[0][:40]!r} in a concrete manifest")
        if EXECUTABLE not in manifest.blobs:
            raise ValueError("a concrete manifest without an executable blob")
        return
    from aot.symbolic import check_dim_text  # symbolic shapes only: not on the serving path

    for text in texts:
        check_dim_text(text)
    if EXECUTABLE in manifest.blobs or PORTABLE_HLO not in manifest.blobs:
        raise ValueError("a symbolic manifest must have a portable_hlo blob and no executable")


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


# ---------------------------------------------------------------- environment


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


def manifest_aval_text(aval: Mapping[str, Any]) -> str:
    """``{"shape": [8, 128], "dtype": "float32"}`` -> ``"f32[8,128]"`` (``~`` when weakly
    typed), as :func:`aot.specs.format_aval` writes it; JAX is imported only for a
    dtype aot.specs does not know or a symbolic dimension."""
    shape, dtype, weak = aval["shape"], aval["dtype"], bool(aval.get("weak_type", False))
    try:  # every dtype aot.specs knows, typed keys included: `aot show` imports no JAX
        short = short_dtype(dtype) if isinstance(dtype, str) else None
    except ValueError:
        short = None  # JAX's parse says what is wrong with it
    if short is not None and all(type(d) is int for d in shape):
        return f"{'~' if weak else ''}{short}[{','.join(str(d) for d in shape)}]"
    from aot.specs import format_aval  # imports JAX

    return format_aval(shape, parse_manifest_dtype(dtype), weak)


def _versions() -> tuple[str, str]:
    """This process's jax and jaxlib versions (imports JAX: a manifest is being built)."""
    import jax
    import jaxlib

    return jax.__version__, jaxlib.__version__


def parse_manifest_dtype(name: Any) -> Any:
    """The dtype a manifest names: corruption when it is not a name, an incompatible
    environment when this jax does not have it."""
    if not isinstance(name, str):
        raise CorruptArtifactError(f"manifest has a malformed dtype {str(name)[:40]!r}")
    from aot.specs import parse_dtype  # imports JAX: only when a dtype is parsed

    try:
        return parse_dtype(name)
    except Exception:  # noqa: BLE001
        # Written by a jax that has this dtype (float8_e8m0fnu, int2, ...): this one
        # cannot run it, which is not damage.
        raise IncompatibleEnvironmentError(
            f"manifest names dtype {name[:40]!r}, which this jax ({_versions()[0]}) does not "
            "have; serve it with the jax that compiled it, or recompile it here",
            (f"dtype {name[:40]!r} unknown to jax {_versions()[0]}",),
        ) from None




# ---------------------------------------------------------------- cross-checks
#
# The key covers the program and environment fingerprints, not the fields XLA and the
# dispatcher act on (device ids, shardings, donation, trees, ...). An unsigned manifest
# is only as trustworthy as the index it sits in, so every such field that a
# fingerprint part pins is compared with that part here, before XLA sees a byte.
# docs/reliability.md has the table of every field: covered, cross-checked, harmless.


def manifest_problems(manifest: Manifest) -> list[str]:
    """What in ``manifest`` contradicts its own fingerprints (empty: consistent).

    Pure data checks, no JAX: :func:`aot.executable_checks.executable_problems` checks the
    fields only the deserialized executable can confirm (output avals, shardings).
    """
    problems: list[str] = []
    program = manifest.program.as_dict()
    environment = manifest.environment.as_dict()

    def differs(what: str, stored: Any, pinned: Any, part: str) -> None:
        problems.append(f"{what} {_short_json(stored)} != {_short_json(pinned)} in the {part}")

    for field_name, value in (("name", manifest.name), ("kind", manifest.kind)):
        if field_name in program and program[field_name] != value:
            differs(field_name, value, program[field_name], f"program fingerprint's {field_name!r} part")
    for field_name, part in (("jax_version", "jax"), ("jaxlib_version", "jaxlib")):
        value = getattr(manifest, field_name)
        if part in environment and environment[part] != value:
            differs(field_name, value, environment[part], f"environment fingerprint's {part!r} part")

    device_ids = list(manifest.device_ids)
    if not device_ids or len(set(device_ids)) != len(device_ids):
        problems.append(f"device_ids {device_ids} is empty or repeats a device")
    pinned_devices = json_part(program, "devices")
    if pinned_devices is not None and pinned_devices != device_ids:
        differs("device_ids", device_ids, pinned_devices, "program fingerprint's 'devices' part")

    donated = [i for i, a in enumerate(manifest.args) if a.get("donated") is True]
    kept = [i for i, a in enumerate(manifest.args) if a.get("kept") is True]
    pinned = json_part(program, "donated")
    if pinned is not None and pinned != donated:
        differs("donated args", donated, pinned, "program fingerprint's 'donated' part")
    # An executable recompiled from the portable HLO takes every argument (jax.export
    # keeps unused ones in its calling convention): kept may grow, never shrink. A
    # wrong count is caught against the executable's parameters.
    pinned = json_part(program, "kept_args")
    if isinstance(pinned, list) and not set(pinned) <= set(kept):
        differs("kept args", kept, pinned, "program fingerprint's 'kept_args' part (a subset)")
    for i, arg in enumerate(manifest.args):
        for flag in ("donated", "kept"):
            if not isinstance(arg.get(flag), bool):
                problems.append(f"args[{i}].{flag} is {arg.get(flag)!r}, not true or false")

    for field_name, tree in (("in_tree", manifest.in_tree), ("out_tree", manifest.out_tree)):
        try:
            digest = _tree_digest(manifest, tree)
        except CorruptArtifactError as exc:
            problems.append(f"{field_name} is malformed: {exc}")
            continue
        if field_name in program and program[field_name] != digest:
            differs(field_name, digest[:23] + "...", program[field_name][:23] + "...",
                    f"program fingerprint's {field_name!r} part")
    leaves = {name: _leaf_count(tree) for name, tree in (("in_tree", manifest.in_tree), ("out_tree", manifest.out_tree))}
    counts = {
        "in_tree leaves vs args": (leaves["in_tree"], len(manifest.args)),
        "out_tree leaves vs out_avals": (leaves["out_tree"], len(manifest.out_avals)),
        "kept args vs in_avals": (len(kept), len(manifest.in_avals)),
        "kept args vs in_shardings": (len(kept), len(manifest.in_shardings)),
        "out_avals vs out_shardings": (len(manifest.out_avals), len(manifest.out_shardings)),
    }
    for what, (left, right) in counts.items():
        if left is not None and left != right:
            problems.append(f"{what}: {left} != {right}")

    kept_args = [manifest.args[i] for i in kept]
    for i, (aval, arg) in enumerate(zip(manifest.in_avals, kept_args)):
        if _aval_key(aval) != _aval_key(arg):
            problems.append(
                f"in_avals[{i}] {_aval_text(aval)} != kept argument {arg.get('path')!r} "
                f"{_aval_text(arg)} (pinned by the program fingerprint)"
            )

    # The fingerprint pins the shardings the program was lowered with, by position
    # among the arguments it kept then; an executable recompiled from the portable HLO
    # keeps every argument, so positions are matched through the argument indices.
    pinned_kept = json_part(program, "kept_args")
    pinned_in = json_part(program, "in_shardings")
    pinned_by_arg = (
        dict(zip(pinned_kept, pinned_in))
        if isinstance(pinned_kept, list) and isinstance(pinned_in, list) else {}
    )
    for field_name, shardings, avals, pinned_list in (
        ("in_shardings", manifest.in_shardings, manifest.in_avals, [pinned_by_arg.get(a) for a in kept]),
        ("out_shardings", manifest.out_shardings, manifest.out_avals, json_part(program, "out_shardings")),
    ):
        for i, (sharding, aval) in enumerate(zip(shardings, avals)):
            where = f"{field_name}[{i}]"
            if manifest.is_symbolic and sharding == UNSPECIFIED_SHARDING:
                continue  # placed when compiled for a concrete shape
            try:
                ids = sharding_device_ids(sharding, _rank(aval))
            except (KeyError, TypeError, ValueError) as exc:
                problems.append(f"{where} is malformed: {exc}")
                continue
            if ids != device_ids:
                problems.append(
                    f"{where} places the value on devices {ids}, but the executable runs on "
                    f"device_ids {device_ids}"
                )
            pinned = pinned_list[i] if isinstance(pinned_list, list) and i < len(pinned_list) else None
            if isinstance(pinned, dict) and pinned != sharding:
                differs(where, sharding, pinned, f"program fingerprint's {field_name!r} part")
            elif (
                field_name == "in_shardings" and not isinstance(pinned, dict)
                and sharding.get("memory_kind") not in (None, "device")
            ):
                # Only a sharding given at lowering time puts an input in another memory.
                problems.append(
                    f"{where} memory_kind {sharding.get('memory_kind')!r} was not asked for at "
                    "lowering time (the program fingerprint pins no sharding for it)"
                )
            spec = aval.get("spec") if isinstance(aval, dict) else None
            if (
                spec is not None and sharding.get("type") == "named"
                and _trim(spec) != _trim(sharding.get("spec"))
            ):
                problems.append(f"{where} spec {sharding.get('spec')} != the aval's spec {spec}")

    if len(device_ids) > 1 and manifest.committed is not True:
        problems.append(
            f"committed is {manifest.committed!r}, but a program on {len(device_ids)} devices "
            "always commits its outputs"
        )
    if EXECUTABLE not in manifest.blobs and not manifest.is_symbolic:
        problems.append("no executable blob")
    blob = manifest.blobs.get(CONSTANTS)
    problems += constants_problems(
        manifest.constants, blob.size if blob else None, blob.digest if blob else None,
        program.get(CONSTANTS_PART), lambda name: parse_manifest_dtype(name).itemsize,
        lambda sharding, rank: _placement_problem(sharding, rank, device_ids),
    )
    for role, ref in manifest.blobs.items():
        if role not in ROLES:
            problems.append(f"unknown blob role {role!r}")
        if len(ref.digest) != 64 or any(c not in "0123456789abcdef" for c in ref.digest) or ref.size < 0:
            problems.append(f"{role} blob {ref.digest[:16]!r} ({ref.size} bytes) is not a sha256 digest and size")
    return problems


def _placement_problem(sharding: Any, rank: int, device_ids: list[int]) -> str | None:
    try:
        ids = sharding_device_ids(sharding, rank)
    except (KeyError, TypeError, ValueError) as exc:
        return f"malformed ({exc})"
    return None if ids == device_ids else f"on devices {ids}, the executable runs on device_ids {device_ids}"


def _tree_digest(manifest: Manifest, tree: Any) -> str:
    """What the program fingerprint's ``in_tree`` / ``out_tree`` part holds for a stored
    structure: format 1 hashed the structure's JSON; format 2 its structure key (node
    types and auxiliary-data digests, not the auxiliary data stored beside them)."""
    if manifest.format_version < 2:
        return "sha256:" + sha256_hex(canonical_json(tree))
    from aot.treedef import structure_key_of_json  # imports JAX

    return structure_key_of_json(tree)


def check_manifest(manifest: Manifest) -> None:
    """Raises :class:`CorruptArtifactError` naming every field that contradicts the
    fingerprints (see :func:`manifest_problems`)."""
    problems = manifest_problems(manifest)
    if problems:
        raise CorruptArtifactError(
            f"manifest of {manifest.name!r} ({manifest.key[:12]}) contradicts its fingerprints: "
            + "; ".join(problems)
            + ". The index row was altered or damaged; it is not run. Run `aot verify` "
            "(it quarantines the entry) and recompile it (the loader does so from its "
            "portable HLO)"
        )


def sharding_device_ids(sharding: Any, rank: int | None = None) -> list[int]:
    """The device ids a sharding (as stored in a manifest) places a value on, in
    order; ``ValueError`` if the description is malformed."""
    if not isinstance(sharding, dict):
        raise ValueError(f"expected an object, got {str(sharding)[:60]!r}")
    kind = sharding.get("type")
    if kind == "single":
        device = sharding["device"]
        if not isinstance(device, int) or isinstance(device, bool):
            raise ValueError(f"device {device!r} is not an integer")
        return [device]
    if kind == "named":
        mesh = sharding["mesh"]
        ids = _int_list(mesh["device_ids"], "mesh device_ids")
        shape = _int_list(mesh["shape"], "mesh shape")
        names = list(mesh["axis_names"])
        if math.prod(shape) != len(ids) or len(names) != len(shape):
            raise ValueError(f"mesh shape {shape} / axes {names} do not fit {len(ids)} devices")
        spec = list(sharding["spec"])
        if rank is not None and len(spec) > rank:
            raise ValueError(f"spec {spec} has more entries than the value's {rank} dimensions")
        for entry in spec:
            for axis in entry if isinstance(entry, list) else [entry]:
                if axis is not None and axis not in names:
                    raise ValueError(f"spec {spec} names axis {axis!r}, not one of {names}")
        return ids
    if kind == "gspmd":
        if not isinstance(sharding["hlo"], str):
            raise ValueError("hlo is not a string")
        return _int_list(sharding["device_ids"], "device_ids")
    raise ValueError(f"unknown sharding type {kind!r}")


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{what} {str(value)[:60]} is not a list of integers")
    return list(value)


def json_part(parts: Mapping[str, str], name: str) -> Any:
    """A fingerprint part holding JSON, parsed (None when absent or not JSON)."""
    if name not in parts:
        return None
    try:
        return json.loads(parts[name])
    except ValueError:
        return None


def _leaf_count(tree: Any) -> int | None:
    """Leaves of a pytree structure as :mod:`aot.treedef` writes it (None: malformed)."""
    try:
        if tree.get("t") == "leaf":
            return 1
        if tree.get("t") == "none":
            return 0
        return sum(_leaf_count(child) for child in tree["c"])  # type: ignore[misc]
    except (AttributeError, KeyError, TypeError, RecursionError):
        return None


def _aval_key(aval: Any) -> tuple[Any, Any] | None:
    try:
        return tuple(int(d) for d in aval["shape"]), parse_manifest_dtype(aval["dtype"])
    except (KeyError, TypeError, ValueError, CorruptArtifactError, IncompatibleEnvironmentError):
        return None


def _aval_text(aval: Any) -> str:
    key = _aval_key(aval)
    if key is None:
        return repr(aval)[:60]
    from aot.specs import format_aval

    return format_aval(*key)


def _rank(aval: Any) -> int | None:
    try:
        return len(aval["shape"])
    except (KeyError, TypeError):
        return None


def _trim(spec: Any) -> Any:
    """A partition spec without trailing ``None`` entries (they mean the same)."""
    if not isinstance(spec, list):
        return spec
    out = list(spec)
    while out and out[-1] is None:
        out.pop()
    return out


def _short_json(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else canonical_json(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

