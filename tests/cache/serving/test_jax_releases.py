"""Another JAX release's entry with no exact one for this release: the fallback ladder
recompiles its portable HLO where ``jax.export``'s compatibility window allows it,
refuses it clearly (never as corruption) where it does not, and ``strict`` refuses it.

The entries here are this process's compiles relabelled as another release's (the
``foreign`` fixture); tests/cross_release runs a real second release in its own venv.
"""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import numpy as np
import pytest

import aot
from aot.artifact import PORTABLE_HLO, Artifact, BlobRef
from aot.cache.index.refs import RefOrigin
from aot.errors import CorruptArtifactError, ExportWindowError, IncompatibleEnvironmentError
from aot.jaxcompat.releases import calling_convention_window
from aot.fingerprint import combined_key

pytestmark = pytest.mark.version_suite  # cross-release: on every supported JAX release

#: Another release than this one (what a host of it records in its environment).
OTHER = "0.9.2" if jax.__version__ != "0.9.2" else "0.9.1"


def _only_as(cache, artifact):  # noqa: ANN001, ANN202
    """Stores ``artifact`` as the one entry of its name, declared by a warm-up there."""
    entry = cache.put_artifact(artifact)
    cache.set_refs([entry], RefOrigin(f"warm-up on a host of jax {OTHER}"))
    assert entry.env_fp != cache.environment.digest
    return entry


def _outside_window(artifact: Artifact) -> Artifact:
    """``artifact`` whose portable HLO uses a calling convention one below what this
    release calls: as an export of a release whose convention has left the window."""
    low, _ = calling_convention_window()
    ref = artifact.manifest.blobs[PORTABLE_HLO]
    exported = jax.export.deserialize(bytearray(artifact.blobs[ref.digest]))
    old = bytes(dataclasses.replace(exported, calling_convention_version=low - 1).serialize())
    digest = hashlib.sha256(old).hexdigest()
    blobs = {**artifact.manifest.blobs, PORTABLE_HLO: BlobRef(digest, len(old))}
    manifest = dataclasses.replace(artifact.manifest, blobs=blobs, hmac=None)
    manifest = dataclasses.replace(manifest, key=combined_key(manifest.program, manifest.environment))
    payload = {d: b for d, b in artifact.blobs.items() if d != ref.digest}
    return Artifact(manifest, {**payload, digest: old})


def test_another_releases_entry_is_recompiled_bit_identical(open_folder_cache, compiled, foreign, caplog) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    other = _only_as(cache, foreign(compiled.tiny, jax=OTHER, jaxlib=OTHER))
    with caplog.at_level("WARNING", logger="aot.cache.serving"):
        fn = aot.load(compiled.TINY_NAME, cache=cache)
        out = fn(*compiled.tiny_inputs)
    np.testing.assert_array_equal(np.asarray(out), compiled.tiny_expected)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert f"recompiled from portable HLO (jax {OTHER} != {jax.__version__}; jaxlib {OTHER}" in messages
    envs = {e.env_fp for e in cache.entries(compiled.TINY_NAME)}
    assert envs == {other.env_fp, cache.environment.digest}  # stored for this release beside it


def test_strict_refuses_another_releases_entry_naming_both(open_folder_cache, compiled, foreign) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    _only_as(cache, foreign(compiled.tiny, jax=OTHER, jaxlib=OTHER))
    with pytest.raises(aot.SignatureNotFoundError) as info:
        aot.load(compiled.TINY_NAME, cache=cache, strict=True)
    assert "can be served here with strict=True (it never compiles)" in str(info.value)
    assert f"compiled for another environment: jax {OTHER} != {jax.__version__}" in str(info.value)
    assert len(cache.entries(compiled.TINY_NAME)) == 1  # nothing compiled, nothing stored


def test_outside_the_window_is_refused_clearly_and_not_quarantined(open_folder_cache, compiled, foreign) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    low, high = calling_convention_window()
    stored = _only_as(cache, _outside_window(foreign(compiled.tiny, jax="0.4.30", jaxlib="0.4.30")))
    with pytest.raises(ExportWindowError) as info:
        aot.load(compiled.TINY_NAME, cache=cache)(*compiled.tiny_inputs)
    message = str(info.value)
    assert isinstance(info.value, IncompatibleEnvironmentError)
    assert not isinstance(info.value, CorruptArtifactError)
    assert f"calling convention {low - 1}, outside the window this release calls ({low}..{high})" in message
    assert f"exported by jax 0.4.30, served by jax {jax.__version__}" in message
    assert "aot warmup" in message
    [row] = cache.entries(compiled.TINY_NAME)
    assert row.key == stored.key and row.state == "ok"  # another release's hosts still serve it
    assert cache.verify().ok  # and `aot verify` here finds nothing wrong with it


def test_a_strict_release_refusal_names_the_release_parts_and_advises_the_same_label(
    open_folder_cache, compiled, foreign,  # noqa: ANN001
) -> None:
    """docs/jax-releases.md: a strict host of a release with no member of its own refuses
    naming `jax OTHER != THIS`, and the runbook's advice is a warm-up of this release into
    the same label, not a label of its own."""
    cache = open_folder_cache()
    entry = cache.put_artifact(foreign(compiled.tiny, jax=OTHER, jaxlib=OTHER))
    set_id = cache.index.open_release("prod", RefOrigin("warmup", release="prod"))
    cache.set_refs([entry], RefOrigin("warmup", release="prod"), release_id=set_id)
    with pytest.raises(aot.ReleaseNotFoundError) as info:
        aot.load(compiled.TINY_NAME, cache=cache, release="prod", strict=True)
    lines = str(info.value).splitlines()
    assert lines[1] == (
        f"  ({entry.signature}): cannot be served here with strict=True (it never compiles); "
        f"{entry.key[:12]} compiled for another environment: jax {OTHER} != {jax.__version__}; "
        f"jaxlib {OTHER} != {jax.__version__}"
    )
    assert lines[-1] == (
        f"Warm this JAX release ({jax.__version__}) into the same label before serving it here: "
        "aot warmup MANIFEST --release prod --commit COMMIT on a host of this release, with the "
        "commit `aot release show prod` prints (docs/jax-releases.md); or load with strict=False "
        "to recompile from the portable HLO"
    )
    assert "of its own" not in str(info.value)
    assert len(cache.entries(compiled.TINY_NAME)) == 1  # nothing compiled
