"""Closed-over constants (aot.constants): a function closing over a large NumPy array
and a JAX array is compiled, stored and rehydrated bit for bit as ``jax.jit`` runs it,
on every release: JAX >= 0.11 hoists them into arguments (stored as a blob of the
artifact), older releases embed them in the program."""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
from aot.artifact import CONSTANTS, Artifact, Manifest
from aot.build import build_artifact
from aot.errors import CorruptArtifactError
from aot.recompile import recompile
from aot.rehydrate import load_executable

# 200,000 floats (800 KB): far above JAX's embedding threshold on every release that hoists.
TABLE = (np.arange(200_000, dtype=np.float32) / 7.0).reshape(200, 1000)
OFFSETS = jnp.linspace(-1.0, 1.0, 1000, dtype=jnp.float32)  # a JAX array closed over


def closes_over(x):  # noqa: ANN001, ANN201
    return jnp.tanh(x @ TABLE) + OFFSETS


def _inputs() -> jax.Array:
    return jnp.asarray(np.random.RandomState(0).standard_normal((4, 200)).astype(np.float32))


def _same(a, b) -> bool:  # noqa: ANN001
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _stored(fn=closes_over) -> tuple[aot.MeshComputation, Artifact]:  # noqa: ANN001
    computation = aot.lower(fn, aot.spec("f32[4,200]"), name="consts.table")
    executable = computation.compile()
    # Through JSON, as the index holds it.
    built = build_artifact(executable, computation.portable_hlo(executable))
    return computation, Artifact(Manifest.from_json(built.manifest.to_json()), built.blobs)


def _hoists(computation: aot.MeshComputation) -> bool:
    return bool(computation.constants)


@pytest.mark.version_suite
def test_closed_over_arrays_round_trip_bit_identical_to_jit() -> None:
    x = _inputs()
    expected = jax.jit(closes_over)(x)
    computation, artifact = _stored()
    assert _same(computation.compile()(x), expected)

    manifest = artifact.manifest
    if _hoists(computation):  # JAX >= 0.11: the constants are a blob of the artifact
        assert manifest.format_version == 5
        assert [(c.dtype, c.shape) for c in manifest.constants] == [("float32", (200, 1000)), ("float32", (1000,))]
        blob = artifact.blob(CONSTANTS)
        assert len(blob) == TABLE.nbytes + OFFSETS.nbytes
        assert blob[: TABLE.nbytes] == TABLE.tobytes()
        assert "constants" in manifest.program.as_dict()
    else:  # embedded in the program, as jax.jit does on this release
        assert manifest.constants == () and CONSTANTS not in manifest.blobs

    loaded = load_executable(artifact)
    for _ in range(3):  # the constants are put on the device once, passed on every call
        assert _same(loaded(x), expected)
    # The portable HLO (jax.export embeds the constants) recompiles to the same program.
    rebuilt = recompile(artifact)
    assert rebuilt.manifest.constants == ()
    assert _same(load_executable(rebuilt)(x), expected)


def test_other_values_are_another_entry() -> None:
    other = TABLE.copy()
    other[3, 5] += 1.0

    def closes_over_other(x):  # noqa: ANN001, ANN202
        return jnp.tanh(x @ other) + OFFSETS

    first = aot.lower(closes_over, aot.spec("f32[4,200]"), name="consts.table")
    second = aot.lower(closes_over_other, aot.spec("f32[4,200]"), name="consts.table")
    assert first.key != second.key
    assert aot.lower(closes_over, aot.spec("f32[4,200]"), name="consts.table").key == first.key


def test_a_float64_numpy_array_is_stored_as_the_float32_jax_passes() -> None:
    wide = np.linspace(0.0, 3.0, 100_000)  # float64; x64 is off

    def closes_over_wide(x):  # noqa: ANN001, ANN202
        return x * wide[None, :].sum() + jnp.sin(wide[:8])

    x = jnp.arange(8, dtype=jnp.float32)
    computation = aot.lower(closes_over_wide, aot.spec("f32[8]"))
    executable = computation.compile()
    artifact = build_artifact(executable, None)
    assert all(c.dtype == "float32" for c in artifact.manifest.constants)
    assert _same(load_executable(artifact)(x), jax.jit(closes_over_wide)(x))


def test_a_damaged_constants_blob_is_never_run() -> None:
    computation, artifact = _stored()
    if not _hoists(computation):
        pytest.skip(f"jax {jax.__version__} embeds closed-over constants in the program")
    ref = artifact.manifest.blobs[CONSTANTS]
    damaged = bytearray(artifact.blobs[ref.digest])
    damaged[12345] ^= 0x01
    with pytest.raises(CorruptArtifactError, match="constants blob"):
        load_executable(Artifact(artifact.manifest, {**artifact.blobs, ref.digest: bytes(damaged)}))
    missing = {d: b for d, b in artifact.blobs.items() if d != ref.digest}
    with pytest.raises(CorruptArtifactError, match="constants blob .* is missing"):
        load_executable(Artifact(artifact.manifest, missing))


def test_a_manifest_whose_constants_contradict_its_fingerprint_is_refused() -> None:
    computation, artifact = _stored()
    if not _hoists(computation):
        pytest.skip(f"jax {jax.__version__} embeds closed-over constants in the program")
    manifest = artifact.manifest
    # Another blob of the right size under the constants role: the key pins the digest.
    forged = bytes(len(artifact.blob(CONSTANTS)))
    digest = hashlib.sha256(forged).hexdigest()
    blobs = {**manifest.blobs, CONSTANTS: dataclasses.replace(manifest.blobs[CONSTANTS], digest=digest)}
    altered = Artifact(dataclasses.replace(manifest, blobs=blobs), {**artifact.blobs, digest: forged})
    with pytest.raises(CorruptArtifactError, match="'constants' part"):
        load_executable(altered)
    # Constants dropped from the manifest: the executable still takes them.
    stripped = dataclasses.replace(
        manifest, constants=(), blobs={r: b for r, b in manifest.blobs.items() if r != CONSTANTS}
    )
    with pytest.raises(CorruptArtifactError, match="arguments"):
        load_executable(Artifact(stripped, artifact.blobs))


@pytest.mark.parametrize("change", ["offset", "shape", "dtype", "device", "sharding"])
def test_an_altered_constant_description_is_refused(change: str) -> None:
    computation, artifact = _stored()
    if not _hoists(computation):
        pytest.skip(f"jax {jax.__version__} embeds closed-over constants in the program")
    manifest = artifact.manifest
    first = manifest.constants[0]
    altered = {
        "offset": dataclasses.replace(first, offset=first.offset + 4),
        "shape": dataclasses.replace(first, shape=(1000, 200)),
        "dtype": dataclasses.replace(first, dtype="int32"),
        "device": dataclasses.replace(first, sharding={**first.sharding, "device": 1}),
        "sharding": dataclasses.replace(first, sharding={"type": "spmd"}),
    }[change]
    forged = dataclasses.replace(manifest, constants=(altered, *manifest.constants[1:]))
    with pytest.raises(CorruptArtifactError, match="constants"):
        load_executable(Artifact(Manifest.from_json(forged.to_json()), artifact.blobs))
