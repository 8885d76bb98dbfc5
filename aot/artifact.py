"""The artifact: a JSON manifest plus content-addressed blobs. No pickle anywhere.

Blobs, by role:
  ``executable``    XLA's own serialized executable (PJRT ``serialize_executable``)
  ``portable_hlo``  the ``jax.export`` serialization (StableHLO + avals + shardings)

Both are opaque bytes covered by their sha256 in the manifest; the manifest itself can
carry an HMAC-SHA256 over its canonical JSON (see :mod:`aot.signing`).

This module is the pure data format: it imports no JAX internals, so gc, verify,
bundles and push/pull never load them. Building an artifact from a compiled
executable and rehydrating one live in :mod:`aot.rehydrate`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jaxlib
from aot.errors import CorruptArtifactError, IncompatibleEnvironmentError
from aot.fingerprint import (
    Fingerprint,
    PartDifference,
    canonical_json,
    combined_key,
    environment_fingerprint,
    sha256_hex,
)
from aot.specs import format_aval, parse_dtype

log = logging.getLogger(__name__)

# The on-disk format. Bump on any change a reader of the previous version would
# misread, and say what changed:
#   1 (2026-12-02): first format: manifest JSON + executable and portable_hlo blobs.
#   2 (2026-12-02): pytree nodes carry a digest of their auxiliary data and store it
#      only when it round-trips (tagged JSON values: {"$": "tuple", ...}); dtypes
#      int2/int4/uint2/uint4, float8_*, float4_e2m1fn, key<impl>; args record
#      "weak_type". Version 1 manifests are still read.
FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (1, 2)

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
        if version not in READABLE_FORMAT_VERSIONS or type(version) is not int:
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
                format_version=version,
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
            signature = ", ".join(
                format_aval(a["shape"], _dtype(a["dtype"]), bool(a.get("weak_type", False)))
                for a in manifest.args
            )
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


def _dtype(name: Any) -> Any:
    if not isinstance(name, str):
        raise CorruptArtifactError(f"manifest has a malformed dtype {str(name)[:40]!r}")
    try:
        return parse_dtype(name)
    except Exception:  # noqa: BLE001
        # Written by a jax that has this dtype (float8_e8m0fnu, int2, ...): this one
        # cannot run it, which is not damage.
        raise IncompatibleEnvironmentError(
            f"manifest names dtype {name[:40]!r}, which this jax ({jax.__version__}) does not "
            "have; serve it with the jax that compiled it, or recompile it here",
            (f"dtype {name[:40]!r} unknown to jax {jax.__version__}",),
        ) from None
