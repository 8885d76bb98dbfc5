"""HMAC-SHA256 signatures over manifests (which carry every blob digest)."""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import replace

from aot.artifact import Manifest
from aot.errors import IntegrityError

SIGNING_KEY_ENV = "AOT_SIGNING_KEY"


def key_from(value: str | bytes | None) -> bytes | None:
    """``None`` -> ``$AOT_SIGNING_KEY`` (or no key); strings are UTF-8 encoded."""
    if value is None:
        value = os.environ.get(SIGNING_KEY_ENV) or None
    if value is None:
        return None
    key = value.encode() if isinstance(value, str) else bytes(value)
    if not key:
        raise IntegrityError("the signing key is empty; set a non-empty key or none at all")
    return key


def sign(manifest: Manifest, key: bytes) -> Manifest:
    digest = hmac.new(key, manifest.signed_payload(), hashlib.sha256).hexdigest()
    return replace(manifest, hmac=digest)


def verify(manifest: Manifest, key: bytes | None, *, require: bool = False) -> None:
    """Refuses unsigned (with a key or ``require``) and tampered manifests."""
    label = f"artifact {manifest.name!r} ({manifest.key[:12]})"
    if manifest.hmac is None:
        if key is not None or require:
            raise IntegrityError(
                f"{label} is not signed, and this cache requires signed artifacts; "
                "recompile it with the signing key set (AOT_SIGNING_KEY) or load without one"
            )
        return
    if key is None:
        return
    expected = hmac.new(key, manifest.signed_payload(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, manifest.hmac):
        raise IntegrityError(
            f"{label}: its signature does not verify with this key: the manifest was "
            "altered or signed with another key. It will not be loaded; recompile it "
            "with the right key"
        )


def identity_problems(
    manifest: Manifest, *, key: str, name: str, signature: str, program_fp: str, env_fp: str,
) -> list[str]:
    """Where an index row's identity columns (what selects an entry: its key, name,
    input signature, program and environment fingerprints) disagree with its manifest.

    The manifest is what a signature covers; the columns are what a query, a ref and
    ``aot ls`` select by. A row renamed or re-signatured in the database (``UPDATE
    artifacts SET name=...``) keeps its signed manifest, so it is caught here."""
    found: list[str] = []
    for what, column, stored in (
        ("key", key, manifest.key),
        ("name", name, manifest.name),
        ("signature", signature, manifest.signature),
        ("program fingerprint", program_fp, manifest.program.digest),
        ("environment fingerprint", env_fp, manifest.environment.digest),
    ):
        if column != stored:
            found.append(f"the index row's {what} is {column!r} but its manifest says {stored!r}")
    return found


def check_identity(
    manifest: Manifest, *, key: str, name: str, signature: str, program_fp: str, env_fp: str,
) -> None:
    """Raises :class:`IntegrityError` when :func:`identity_problems` finds any."""
    found = identity_problems(
        manifest, key=key, name=name, signature=signature, program_fp=program_fp, env_fp=env_fp,
    )
    if found:
        raise IntegrityError(
            f"artifact {manifest.name!r} ({manifest.key[:12]}): {'; '.join(found)}. The row was "
            "altered after it was stored (renamed or re-signatured); it is not served. Run `aot "
            "verify` with the signing key, then delete it (aot rm) and recompile (aot warmup)"
        )
