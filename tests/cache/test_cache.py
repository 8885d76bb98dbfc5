"""The Cache facade on every backend: put/get, dedup, compile hits, listing, read-only
mode, signing and two processes compiling the same key at once.

Backends (``open_cache`` / ``cache`` in conftest.py): a folder (SQLite + zstd files),
an SQLite URL (blobs in the database), PostgreSQL (blobs in the database) and
PostgreSQL with a blob folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import aot
from aot.signatures import Signature
from aot.computation import MeshComputation
from aot.errors import (
    ArtifactNotFoundError,
    CacheError,
    IntegrityError,
    ReadOnlyCacheError,
)


REPO = Path(__file__).resolve().parents[2]


def _no_compile(self: MeshComputation) -> None:
    raise AssertionError(f"XLA compile of {self.name} on a path that must not compile")


def _put_all(cache: aot.Cache, compiled) -> dict[str, str]:  # noqa: ANN001
    """Stores every session artifact; ``{signature-or-name: key}``."""
    keys = {}
    for batch, artifact in compiled.mlp.items():
        keys[f"mlp{batch}"] = cache.put(artifact).key
    keys["tiny"] = cache.put(compiled.tiny).key
    return keys


# ---------------------------------------------------------------- put / get


def test_put_get_round_trip(cache: aot.Cache, compiled) -> None:  # noqa: ANN001
    for batch, artifact in compiled.mlp.items():
        entry = cache.put(artifact)
        manifest = artifact.manifest
        assert entry.key == manifest.key
        assert (entry.name, entry.signature, entry.ok) == (compiled.MLP_NAME, manifest.signature, True)
        assert entry.raw_size == manifest.raw_size
        assert 0 < entry.stored_size < entry.raw_size  # zstd
        assert entry.env_fp == cache.environment.digest

    for batch, artifact in compiled.mlp.items():
        exe = cache.get(artifact.manifest.key)
        out = exe(compiled.params, compiled.inputs[batch])
        np.testing.assert_array_equal(np.asarray(out), compiled.expected[batch])
        # a unique prefix works too (the CLI abbreviates keys)
        assert cache.get(artifact.manifest.key[:16]).key == artifact.manifest.key


def test_get_unknown_key_says_what_to_do(cache: aot.Cache) -> None:
    with pytest.raises(ArtifactNotFoundError, match="aot ls"):
        cache.get("0" * 64)
    with pytest.raises(ArtifactNotFoundError):
        cache.get("abcd")


def test_put_computation_and_executable(cache: aot.Cache, compiled) -> None:  # noqa: ANN001
    models = compiled.models
    computation = aot.lower(models.tiny, *models.tiny_specs(), name="tiny.put")
    entry = cache.put(computation)  # compiles it
    assert entry.hlo_digest is not None
    exe = cache.get(entry.key)
    np.testing.assert_array_equal(np.asarray(exe(*compiled.tiny_inputs)), compiled.tiny_expected)

    again = cache.put(computation.compile())  # an executable of the same program
    assert again.key == entry.key
    assert [e.key for e in cache.entries()] == [entry.key]

    with pytest.raises(TypeError, match="MeshComputation"):
        cache.put("tiny")  # type: ignore[arg-type]


# ---------------------------------------------------------------- dedup


def test_same_artifact_twice_is_stored_once(cache: aot.Cache, compiled) -> None:  # noqa: ANN001
    first = cache.put(compiled.tiny)
    digests = sorted(cache.blobs.digests())
    blob_rows = cache.index.blob_rows()
    second = cache.put(compiled.tiny)
    assert second.key == first.key
    assert len(cache.entries()) == 1
    assert len(digests) == 3  # executable, portable HLO and the manifest
    assert sorted(cache.blobs.digests()) == digests
    assert cache.index.blob_rows() == blob_rows


def test_entries_with_identical_blobs_share_them(cache: aot.Cache, compiled, foreign) -> None:  # noqa: ANN001
    here = cache.put(compiled.tiny)
    there = cache.put(foreign(compiled.tiny, jaxlib="0.0.1"))  # same bytes, another key
    assert here.key != there.key
    assert (here.exe_digest, here.hlo_digest) == (there.exe_digest, there.hlo_digest)
    assert len(list(cache.blobs.digests())) == 4  # the two shared, and a manifest each
    assert len(cache.index.blob_rows()) == 4


def test_two_names_with_identical_programs_share_blobs(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    models = compiled.models
    a = cache.compile_entry(models.tiny, *models.tiny_specs(), name="alpha.tiny")
    b = cache.compile_entry(models.tiny, *models.tiny_specs(), name="beta.tiny")
    assert not a.hit and not b.hit  # a name is not a hit for another name
    assert a.entry.key != b.entry.key
    assert sorted(e.name for e in cache.entries()) == ["alpha.tiny", "beta.tiny"]
    assert a.entry.exe_digest == b.entry.exe_digest
    assert a.entry.hlo_digest == b.entry.hlo_digest
    assert len(list(cache.blobs.digests())) == 4  # the two shared, and a manifest each
    for name in ("alpha.tiny", "beta.tiny"):
        fn = aot.load(name, cache=cache)
        np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected)


# ---------------------------------------------------------------- compile


def test_second_compile_is_a_hit_without_xla(
    open_cache, compiled, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    models = compiled.models
    cache = open_cache()
    first = cache.compile_entry(models.tiny, *models.tiny_specs(), name="tiny.hit")
    assert not first.hit
    assert first.to_dict()["hit"] is False

    monkeypatch.setattr(MeshComputation, "compile", _no_compile)
    second = cache.compile_entry(models.tiny, *models.tiny_specs(), name="tiny.hit")
    assert second.hit and second.entry.key == first.entry.key
    np.testing.assert_array_equal(
        np.asarray(second.executable(*compiled.tiny_inputs)), compiled.tiny_expected
    )
    # Another Cache object on the same location (another process, in effect).
    exe = open_cache().compile(models.tiny, *models.tiny_specs(), name="tiny.hit")
    np.testing.assert_array_equal(np.asarray(exe(*compiled.tiny_inputs)), compiled.tiny_expected)
    assert len(cache.entries()) == 1
    assert cache.entry(first.entry.key).hits >= 2


# ---------------------------------------------------------------- listing


def test_entries_by_glob(cache: aot.Cache, compiled) -> None:  # noqa: ANN001
    keys = _put_all(cache, compiled)
    everything = cache.entries()
    assert {e.key for e in everything} == set(keys.values())
    assert [e.name for e in everything] == ["mlp.forward"] * 3 + ["tiny"]  # sorted by name

    mlp = cache.entries("mlp.*")
    assert {e.key for e in mlp} == {keys["mlp1"], keys["mlp2"], keys["mlp4"]}
    assert {e.signature.rsplit(", ", 1)[1] for e in mlp} == {"f32[1,784]", "f32[2,784]", "f32[4,784]"}
    assert [e.key for e in cache.entries("t?ny")] == [keys["tiny"]]
    assert len(cache.entries("[mt]*")) == 4
    assert cache.entries("MLP.*") == []  # case-sensitive, on SQLite too
    assert cache.entries("mlp.forward_v2") == []

    entry = mlp[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.name = "other"  # type: ignore[misc]
    json.dumps(entry.to_dict())  # JSON-able as is


# ---------------------------------------------------------------- read-only


def test_read_only_refuses_writes_and_still_loads(
    open_cache, compiled, tmp_path: Path  # noqa: ANN001
) -> None:
    writer = open_cache()
    keys = _put_all(writer, compiled)
    bundle = writer.export_bundle(tmp_path / "all.aotb").path
    before = ({e.key for e in writer.entries()}, sorted(writer.blobs.digests()))

    reader = open_cache(read_only=True)
    with pytest.raises(ReadOnlyCacheError, match="read-only"):
        reader.put(compiled.tiny)
    with pytest.raises(ReadOnlyCacheError, match="read-only"):
        reader.put_artifact(compiled.mlp[2])
    with pytest.raises(ReadOnlyCacheError, match="read-only"):
        reader.gc(max_size=0)
    with pytest.raises(ReadOnlyCacheError, match="read-only"):
        reader.import_bundle(bundle)
    assert isinstance(ReadOnlyCacheError("x"), (CacheError, PermissionError))

    plan = reader.gc(max_size=0, dry_run=True)  # planning writes nothing: allowed
    assert plan.entries == () and len(plan.pinned) == 4 and not plan.executed  # each put set its ref: pinned

    # ... and it still serves.
    exe = reader.get(keys["mlp2"])
    np.testing.assert_array_equal(np.asarray(exe(compiled.params, compiled.inputs[2])), compiled.expected[2])
    fn = aot.load(compiled.MLP_NAME, cache=reader)
    for batch in compiled.MLP_BATCHES:
        out = fn(compiled.params, compiled.inputs[batch])
        np.testing.assert_array_equal(np.asarray(out), compiled.expected[batch])

    # compile() on a read-only cache compiles in memory and stores nothing.
    def tiny_minus_one(x, y):  # noqa: ANN001, ANN202
        return x * y - 1

    result = reader.compile_entry(tiny_minus_one, *compiled.models.tiny_specs(), name="tiny.ro")
    assert not result.hit
    np.testing.assert_array_equal(
        np.asarray(result.executable(*compiled.tiny_inputs)), compiled.tiny_expected - 2
    )

    assert ({e.key for e in writer.entries()}, sorted(writer.blobs.digests())) == before


def test_read_only_missing_folder_is_not_created(tmp_path: Path) -> None:
    where = tmp_path / "nothing-here"
    with pytest.raises(CacheError, match="read-only"):
        aot.Cache(where, read_only=True)
    assert not where.exists()


# ---------------------------------------------------------------- signing


def test_signing_key_signs_and_loads(open_cache, compiled) -> None:  # noqa: ANN001
    signed = open_cache(signing_key="s3cret")
    entry = signed.put(compiled.tiny)
    assert len(entry.manifest_dict()["hmac"]) == 64
    np.testing.assert_array_equal(
        np.asarray(signed.get(entry.key)(*compiled.tiny_inputs)), compiled.tiny_expected
    )
    fn = aot.load(compiled.TINY_NAME, cache=open_cache(signing_key=b"s3cret"))
    np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected)
    # A cache without a key still loads signed artifacts (it cannot check them).
    assert open_cache().get(entry.key).key == entry.key


def test_signing_key_from_environment(open_folder_cache, compiled, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("AOT_SIGNING_KEY", "from-env")
    entry = open_folder_cache().put(compiled.tiny)
    assert entry.manifest_dict().get("hmac")
    with pytest.raises(IntegrityError):
        open_folder_cache(signing_key="another").get(entry.key)


def test_loader_with_key_refuses_unsigned(open_folder_cache, compiled) -> None:  # noqa: ANN001
    entry = open_folder_cache().put(compiled.tiny)  # no key: unsigned
    keyed = open_folder_cache(signing_key="s3cret")
    with pytest.raises(IntegrityError, match="not signed"):
        keyed.get(entry.key)
    with pytest.raises(IntegrityError, match="not signed"):
        aot.load(compiled.TINY_NAME, cache=keyed)
    # Nothing signed is servable: refused at start-up, lazy or not (unsigned rows are
    # skipped before the choice, so that signed ones serve beside them).
    with pytest.raises(IntegrityError, match="not signed"):
        aot.load(compiled.TINY_NAME, cache=keyed, lazy=True)


def test_loader_with_key_refuses_tampered_manifest(
    open_folder_cache, compiled, tamper_manifest  # noqa: ANN001
) -> None:
    signed = open_folder_cache(signing_key="s3cret")
    entry = signed.put(compiled.tiny)
    manifest = entry.manifest_dict()
    manifest["out_avals"][0]["shape"] = [4]  # the key only covers the fingerprints
    tamper_manifest(signed, entry.key, json.dumps(manifest))
    with pytest.raises(IntegrityError, match="does not verify"):
        signed.get(entry.key)
    with pytest.raises(IntegrityError, match="does not verify"):
        aot.load(compiled.TINY_NAME, cache=signed)
    # Signed with another key: refused the same way.
    other = open_folder_cache(signing_key="other")
    with pytest.raises(IntegrityError):
        other.get(entry.key)


def test_require_signatures_without_key_refuses_unsigned(open_folder_cache, compiled) -> None:  # noqa: ANN001
    unsigned = open_folder_cache().put(compiled.tiny)
    signed = open_folder_cache(signing_key="k").put(compiled.mlp[1])
    strict = open_folder_cache(require_signatures=True)
    with pytest.raises(IntegrityError, match="not signed"):
        strict.get(unsigned.key)
    with pytest.raises(IntegrityError):
        aot.load(compiled.TINY_NAME, cache=strict)
    assert strict.get(signed.key).key == signed.key


# ---------------------------------------------------------------- two processes

_RACER = textwrap.dedent(
    """
    import json, os, sys, time
    sys.path.append(sys.argv[1])
    location, blob_location, barrier, me = sys.argv[2:6]
    import numpy as np
    import aot
    from aot.computation import MeshComputation
    from fixtures import models

    real_compile = MeshComputation.compile

    def compile_after_barrier(self):
        # Both processes have looked the key up (a miss) before either compiles.
        open(os.path.join(barrier, "ready-" + me), "w").close()
        deadline = time.time() + 120
        while len(os.listdir(barrier)) < 2:
            if time.time() > deadline:
                raise SystemExit("the other process never reached compile")
            time.sleep(0.01)
        return real_compile(self)

    MeshComputation.compile = compile_after_barrier
    cache = aot.Cache(location, blob_location=blob_location or None)
    result = cache.compile_entry(models.tiny, *models.tiny_specs(), name="tiny.race")
    out = np.asarray(result.executable(*models.tiny_inputs()))
    print(json.dumps({"hit": result.hit, "key": result.entry.key, "out": out.tolist()}))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["folder", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_concurrent_compile_of_one_key_from_two_processes(
    kind: str, cache_of_kind, compiled, tmp_path: Path  # noqa: ANN001
) -> None:
    factory = cache_of_kind(kind)
    cache = factory()  # creates the schema up front
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = dict(os.environ)
    env["XLA_FLAGS"] = os.environ["XLA_FLAGS"]  # same device count, same environment fingerprint
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(REPO), factory.location,
             factory.blob_location or "", str(barrier), str(i)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        )
        for i in range(2)
    ]
    results = []
    for racer in racers:
        out, err = racer.communicate(timeout=240)
        assert racer.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))

    assert [r["hit"] for r in results] == [False, False]  # both compiled ...
    assert results[0]["key"] == results[1]["key"]
    for r in results:
        np.testing.assert_array_equal(np.asarray(r["out"], np.float32), compiled.tiny_expected)
    entries = cache.entries()  # ... and one entry is stored, once
    assert [e.key for e in entries] == [results[0]["key"]]
    # Its executable, HLO and manifest: the loser's manifest (its own compile's) deleted.
    assert len(list(cache.blobs.digests())) == 3
    report = cache.verify()
    assert report.ok, report.to_dict()


def test_compile_heals_a_corrupt_or_quarantined_hit(
    cache: aot.Cache, compiled, read_raw, write_raw  # noqa: ANN001
) -> None:
    models = compiled.models
    first = cache.compile_entry(models.tiny, *models.tiny_specs(), name=compiled.TINY_NAME)
    stored = bytearray(read_raw(cache.blobs, first.entry.exe_digest))
    stored[len(stored) // 2] ^= 0xFF
    write_raw(cache.blobs, first.entry.exe_digest, bytes(stored))

    healed = cache.compile_entry(models.tiny, *models.tiny_specs(), name=compiled.TINY_NAME)
    assert not healed.hit  # the corrupt executable was not used ...
    np.testing.assert_array_equal(np.asarray(healed.executable(*compiled.tiny_inputs)), compiled.tiny_expected)
    assert cache.index.get(first.entry.key).ok  # ... the row was replaced, the blob rewritten
    assert cache.verify().problems == ()

    cache.quarantine(cache.entry(first.entry.key), "by hand")
    again = cache.compile_entry(models.tiny, *models.tiny_specs(), name=compiled.TINY_NAME)
    assert not again.hit and cache.index.get(first.entry.key).ok
    assert cache.compile_entry(models.tiny, *models.tiny_specs(), name=compiled.TINY_NAME).hit


def test_default_location_is_aot_cache(tmp_path: Path, compiled, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("AOT_CACHE", str(tmp_path / "from-env"))
    with aot.Cache() as cache:
        assert cache.location == str(tmp_path / "from-env")
        cache.put(compiled.tiny)
    fn = aot.load(compiled.TINY_NAME)
    try:
        np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected)
    finally:
        fn.cache.close()


@pytest.mark.postgres
def test_messages_never_show_the_database_password(postgres_url: str, compiled, tmp_path: Path) -> None:  # noqa: ANN001
    from sqlalchemy.engine import make_url

    secret = "hunter2-secret"
    url = make_url(postgres_url).set(password=secret).render_as_string(hide_password=False)
    writer = aot.Cache(url)  # the test server trusts loopback: any password works
    reader = aot.Cache(url, read_only=True)
    try:
        writer.put(compiled.tiny)
        failures = [
            lambda: reader.put(compiled.tiny),
            lambda: reader.gc(max_size=0),
            lambda: writer.get("0" * 64),
            lambda: writer.export_bundle(tmp_path / "b.aotb", ["no.such.*"]),
        ]
        for failure in failures:
            with pytest.raises(aot.AotError) as info:
                failure()
            assert secret not in str(info.value)
        assert secret not in repr(writer) and secret not in writer.display_location
        assert writer.location == url  # the real URL stays available (worker processes)
    finally:
        writer.close()
        reader.close()


# ---------------------------------------------------------------- storing what was run


def _ranked(x):  # noqa: ANN001, ANN202
    import jax.numpy as jnp

    return jnp.sort(x)[::-1] * 2.0, jnp.argsort(x)


def test_compile_after_jax_jit_ran_the_program_stores_it(open_folder_cache) -> None:  # noqa: ANN001
    """jax.jit ran it first, so Lowered.compile() returns JAX's cached executable, which
    XLA CPU cannot serialize after a sort ran; a fresh copy is stored."""
    import jax

    x = np.array([0.5, 3.0, -1.0, 2.0], np.float32)
    expected = jax.jit(_ranked)(x)
    cache = open_folder_cache()
    exe = cache.compile(_ranked, x, name="ranked")
    for out, want in zip(exe(x), expected):
        np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    served = aot.load("ranked", cache=cache)(x)
    for out, want in zip(served, expected):
        np.testing.assert_array_equal(np.asarray(out), np.asarray(want))


def test_put_of_an_executable_that_ran(open_folder_cache) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    exe = aot.lower(_ranked, "f32[4]", name="ranked.put").compile()
    x = np.array([4.0, 1.0, 3.0, 2.0], np.float32)
    first = exe(x)
    entry = cache.put(exe)
    assert entry.signature == "f32[4]"
    for out, want in zip(cache.get(entry.key)(x), first):
        np.testing.assert_array_equal(np.asarray(out), np.asarray(want))


def test_from_specs_matches_a_compiled_manifest(compiled) -> None:  # noqa: ANN001
    manifest = compiled.mlp[2].manifest
    stored = Signature.from_manifest_args(manifest.args)
    asked = Signature.from_specs([compiled.param_specs, aot.spec("f32[2,784]")], arg_names=["params", "x"])
    assert stored == asked
    assert stored.flat_text == manifest.signature
