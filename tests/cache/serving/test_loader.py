"""Serving: aot.load(name) dispatches stored executables by input signature, never
traces, and walks the fallback ladder (recompile from portable HLO, or refuse in
strict mode) when an executable does not fit this environment or is corrupt."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
import aot.lowering
from tests.aot.test_targets import needs_libtpu
from aot.cache.index.refs import RefOrigin
from aot.computation import MeshComputation
from aot.errors import (
    CorruptArtifactError,
    IncompatibleEnvironmentError,
    SignatureNotFoundError,
)

REPO = Path(__file__).resolve().parents[3]


def _no_compile(self: MeshComputation) -> None:
    raise AssertionError(f"XLA compile of {self.name} on a path that must not compile")


def _check_buckets(fn, compiled) -> None:  # noqa: ANN001
    for batch in compiled.MLP_BATCHES:
        out = fn(compiled.params, compiled.inputs[batch])
        np.testing.assert_array_equal(np.asarray(out), compiled.expected[batch])


def _count_loads(cache, monkeypatch: pytest.MonkeyPatch) -> list[str]:  # noqa: ANN001
    loaded: list[str] = []
    real = cache.load

    def counting(entry, **kwargs):  # noqa: ANN001, ANN003, ANN202
        loaded.append(entry.key)
        return real(entry, **kwargs)

    monkeypatch.setattr(cache, "load", counting)
    return loaded


# ---------------------------------------------------------------- dispatch


@pytest.mark.version_suite
def test_dispatches_each_bucket(served, compiled) -> None:  # noqa: ANN001
    fn = aot.load(compiled.MLP_NAME, cache=served)
    assert fn.signatures == sorted(a.manifest.signature for a in compiled.mlp.values())
    assert len(fn.signatures) == 3
    _check_buckets(fn, compiled)
    # numpy inputs (uncommitted) dispatch the same way
    out = fn(jax.tree_util.tree_map(np.asarray, compiled.params), np.asarray(compiled.inputs[2]))
    np.testing.assert_array_equal(np.asarray(out), compiled.expected[2])
    assert "3 signatures" in repr(fn)


def test_load_and_call_neither_trace_nor_lower_nor_compile(
    served, compiled, jax_work, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("aot.load traced or lowered")

    for target, attr in [
        (jax, "jit"), (jax, "eval_shape"), (aot.lowering, "lower"), (aot, "lower"),
        (jax.export, "deserialize"), (MeshComputation, "compile"),
    ]:
        monkeypatch.setattr(target, attr, refuse)
    with jax_work as work:
        for lazy in (False, True):
            _check_buckets(aot.load(compiled.MLP_NAME, cache=served, lazy=lazy), compiled)
    assert work.events == []


@pytest.mark.version_suite
def test_lazy_loads_on_first_call_and_warm_loads_all(
    served, compiled, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    loaded = _count_loads(served, monkeypatch)
    fn = aot.load(compiled.MLP_NAME, cache=served, lazy=True)
    assert loaded == [] and len(fn.signatures) == 3
    fn(compiled.params, compiled.inputs[1])
    fn(compiled.params, compiled.inputs[1])
    assert loaded == [compiled.mlp[1].manifest.key]
    assert fn.warm() is fn
    assert sorted(loaded) == sorted(a.manifest.key for a in compiled.mlp.values())
    fn.warm()  # nothing left to load
    assert len(loaded) == 3
    _check_buckets(fn, compiled)

    loaded.clear()
    aot.load(compiled.MLP_NAME, cache=served)  # the default loads everything up front
    assert len(loaded) == 3


def test_load_by_location_string(served, compiled) -> None:  # noqa: ANN001
    fn = aot.load(compiled.MLP_NAME, cache=served.location, read_only=True)
    _check_buckets(fn, compiled)


@pytest.mark.parametrize("how", ["default", "lazy"])
def test_a_held_chip_is_a_device_busy_error_naming_the_holder(
    served, compiled, monkeypatch: pytest.MonkeyPatch, how: str,  # noqa: ANN001
) -> None:
    """A second process loading while a server holds the chip gets aot.DeviceBusyError
    naming the holder, not JAX's RuntimeError: JAX's backend start fails here as it does
    there (the exact message JAX 0.10.2 gives on a TPU v5e, measured)."""
    held = (
        "Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process with pid 4242. "
        "Not attempting to load libtpu.so in this process. (set JAX_PLATFORMS='' to automatically choose "
        "an available backend)"
    )

    def busy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError(held)

    monkeypatch.setattr(jax, "default_backend", busy)
    if how == "lazy":  # no start-up probe of the backend: the environment's devices touch it
        monkeypatch.setattr(jax, "devices", busy)
        monkeypatch.setattr(jax, "local_devices", busy)
    with pytest.raises(aot.DeviceBusyError) as info:
        aot.load(compiled.MLP_NAME, cache=served.location, read_only=True, lazy=how == "lazy")
    assert info.value.pid == 4242
    assert str(info.value).startswith("the TPU is held by process 4242")
    assert "\n" not in str(info.value) and "--target" in str(info.value)


# ---------------------------------------------------------------- misses


def test_unknown_shape_lists_the_signatures_and_names_the_nearest(served, compiled) -> None:  # noqa: ANN001
    models = compiled.models
    fn = aot.load(compiled.MLP_NAME, cache=served)
    with pytest.raises(SignatureNotFoundError) as info:
        fn(compiled.params, models.mlp_input(8))
    err = info.value
    assert sorted(err.available) == fn.signatures and len(err.available) == 3
    message = str(err)
    for signature in fn.signatures:
        assert signature in message
    assert "f32[8,784]" in message  # what was asked for
    # the nearest is the bucket whose shape is closest: batch 4
    assert "Nearest: (" in message
    nearest = message.split("Nearest: (", 1)[1]
    assert nearest.startswith(compiled.mlp[4].manifest.signature)
    assert "x: stored f32[4,784], got f32[8,784]" in nearest
    assert "fallback=" in message  # says what to do

    with pytest.raises(SignatureNotFoundError, match=re.escape("x: stored f32[2,784], got f16[2,784]")):
        fn(compiled.params, np.zeros((2, 784), np.float16))
    with pytest.raises(SignatureNotFoundError, match="pytree structure"):
        fn(compiled.inputs[1])
    assert isinstance(err, LookupError)


def test_nothing_stored_under_the_name(served, compiled) -> None:  # noqa: ANN001
    # aot.load fails at start-up (a mistyped name must not start a healthy-looking
    # server that fails on its first request); allow_empty=True starts anyway.
    with pytest.raises(SignatureNotFoundError, match="nothing is stored under 'no.such.model'"):
        aot.load("no.such.model", cache=served)
    fn = aot.load("no.such.model", cache=served, allow_empty=True)
    assert fn.signatures == []
    with pytest.raises(SignatureNotFoundError, match="nothing is stored under this name"):
        fn(*compiled.tiny_inputs)


@pytest.mark.version_suite
def test_fallback_compiles_stores_and_logs(
    served, compiled, caplog, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    models = compiled.models
    fn = aot.load(compiled.MLP_NAME, cache=served, fallback=models.mlp_forward)
    before = len(served.entries())
    x8 = models.mlp_input(8)
    expected = np.asarray(jax.jit(models.mlp_forward)(compiled.params, x8))
    with caplog.at_level(logging.WARNING, logger="aot.cache.serving"):
        out = fn(compiled.params, x8)
    np.testing.assert_array_equal(np.asarray(out), expected)
    assert len(served.entries()) == before + 1
    assert any("fallback" in r.getMessage() and "f32[8,784]" in r.getMessage() for r in caplog.records)
    assert len(fn.signatures) == 4

    # Now stored: neither this dispatcher nor a new one compiles it again.
    monkeypatch.setattr(MeshComputation, "compile", _no_compile)
    np.testing.assert_array_equal(np.asarray(fn(compiled.params, x8)), expected)
    again = aot.load(compiled.MLP_NAME, cache=served)
    assert len(again.signatures) == 4
    np.testing.assert_array_equal(np.asarray(again(compiled.params, x8)), expected)


def test_fallback_on_a_read_only_cache_stores_nothing(served, compiled) -> None:  # noqa: ANN001
    from aot.cache.cache import Cache

    models = compiled.models
    reader = Cache(served.location, read_only=True)
    try:
        fn = aot.load(compiled.MLP_NAME, cache=reader, fallback=models.mlp_forward)
        x8 = models.mlp_input(8)
        out = fn(compiled.params, x8)
        expected = np.asarray(jax.jit(models.mlp_forward)(compiled.params, x8))
        np.testing.assert_array_equal(np.asarray(out), expected)
        assert len(served.entries()) == 3
    finally:
        reader.close()


# ---------------------------------------------------------------- fallback ladder


@pytest.fixture
def moved(served, compiled, foreign):  # noqa: ANN001, ANN201
    """The batch-2 bucket only exists as an artifact of another jaxlib, declared there
    (as a warm-up on that host declares it); this environment has no ref for it."""
    original = compiled.mlp[2].manifest.key
    other = served.put_artifact(foreign(compiled.mlp[2], jaxlib="0.0.1"))
    gone = served.lookup(original)
    assert served.index.delete([original]) == 1
    assert served.index.drop_refs([(gone.name, gone.signature, gone.env_fp)]) == 1
    served.set_refs([other], RefOrigin("warm-up on a host with jaxlib 0.0.1"))
    assert other.env_fp != served.environment.digest
    return served, original, other.key


@pytest.mark.version_suite
def test_other_environment_is_recompiled_from_hlo(moved, compiled, caplog) -> None:  # noqa: ANN001
    cache, original, other = moved
    with caplog.at_level(logging.WARNING, logger="aot.cache.serving"):
        fn = aot.load(compiled.MLP_NAME, cache=cache)
    _check_buckets(fn, compiled)
    assert len(fn.signatures) == 3
    rows = {e.key: e for e in cache.entries(compiled.MLP_NAME)}
    assert original in rows and other in rows  # a row for this environment appeared
    assert rows[original].env_fp == cache.environment.digest
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "recompiled from portable HLO" in messages and "jaxlib 0.0.1" in messages


@pytest.mark.version_suite
@pytest.mark.parametrize("lazy", [False, True])
def test_strict_refuses_another_environment_naming_the_part(moved, compiled, lazy: bool) -> None:  # noqa: ANN001
    cache, original, _ = moved
    with pytest.raises(IncompatibleEnvironmentError) as info:
        fn = aot.load(compiled.MLP_NAME, cache=cache, strict=True, lazy=lazy)
        fn(compiled.params, compiled.inputs[1])  # other buckets still work
        fn(compiled.params, compiled.inputs[2])
    err = info.value
    assert "jaxlib" in str(err) and "strict=True" in str(err)
    assert [d.split()[0] for d in err.differences] == ["jaxlib"]
    assert cache.index.get(original) is None  # nothing was compiled or stored


def _corrupt_blob(cache, digest: str, read_raw, write_raw) -> None:  # noqa: ANN001
    stored = bytearray(read_raw(cache.blobs, digest))
    stored[len(stored) // 2] ^= 0xFF
    write_raw(cache.blobs, digest, bytes(stored))
    assert cache.blobs.check(digest) is not None


def test_corrupt_executable_blob_is_quarantined_and_recompiled(
    open_cache, compiled, read_raw, write_raw, caplog  # noqa: ANN001
) -> None:
    cache = open_cache()
    entries = {b: cache.put(a) for b, a in compiled.mlp.items()}
    bad = entries[4]
    _corrupt_blob(cache, bad.exe_digest, read_raw, write_raw)
    with caplog.at_level(logging.WARNING):
        fn = aot.load(compiled.MLP_NAME, cache=cache)
    _check_buckets(fn, compiled)
    # Told once each: the quarantine (with what to run), then the recompile (with why).
    told = [r.getMessage() for r in caplog.records if r.name.startswith("aot") and r.levelno >= logging.WARNING]
    assert len(told) == 2, told
    blob = f"executable blob {bad.exe_digest} at "
    assert told[0].startswith(f"quarantined {bad.name} ({bad.key[:12]}): {blob}"), told
    assert told[0].count(bad.key[:12]) == 1 and "is corrupt (digest mismatch); run `aot verify`" in told[0]
    assert told[1].startswith(f"{bad.name} (") and (
        f"): recompiled from portable HLO (stored executable unusable: {blob}") in told[1], told
    assert told[1].endswith(" is corrupt (digest mismatch))"), told
    healed = cache.index.get(bad.key)  # the quarantined row was replaced
    assert healed.ok and cache.blobs.check(healed.exe_digest) is None
    report = cache.verify()
    assert report.problems == ()
    assert set(report.orphan_blobs) <= {bad.exe_digest}  # for gc, if it was not rewritten
    # ... and the next process loads it without recompiling.
    again = aot.load(compiled.MLP_NAME, cache=open_cache())
    _check_buckets(again, compiled)


def test_strict_refuses_a_corrupt_executable_blob(served, compiled, read_raw, write_raw) -> None:  # noqa: ANN001
    key = compiled.mlp[1].manifest.key
    _corrupt_blob(served, served.index.get(key).exe_digest, read_raw, write_raw)
    with pytest.raises(CorruptArtifactError, match="corrupt"):
        aot.load(compiled.MLP_NAME, cache=served, strict=True)
    # strict=True never writes to the cache, not even to quarantine (it logs).
    assert served.index.get(key).state == "ok"


@pytest.mark.parametrize("field", ["device_ids", "in_tree"])
def test_strict_never_writes_for_a_manifest_that_contradicts_its_fingerprints(
    served, compiled, tamper_manifest, field: str  # noqa: ANN001
) -> None:
    """The dispatcher files rows by their manifest's cross-checks; under
    strict=True a contradicting row is logged and refused, never quarantined (issue
    11: strict loading never writes). A lenient dispatcher quarantines it."""
    import json

    key = compiled.mlp[1].manifest.key
    manifest = json.loads(served.index.get(key).manifest)
    if field == "device_ids":
        manifest["device_ids"] = [3]
    else:
        manifest["in_tree"] = {"t": "tuple", "c": [manifest["in_tree"]]}
    tamper_manifest(served, key, json.dumps(manifest))
    with pytest.raises(aot.AotError):
        aot.load(compiled.MLP_NAME, cache=served, strict=True)(compiled.params, compiled.inputs[1])
    assert served.index.get(key).state == "ok"
    fn = aot.load(compiled.MLP_NAME, cache=served, lazy=True)
    assert served.index.get(key).state == "quarantined"
    if field == "device_ids":  # healed from the portable HLO on the first call
        np.testing.assert_array_equal(fn(compiled.params, compiled.inputs[1]), compiled.expected[1])


def test_entry_quarantined_by_verify_is_recompiled_not_lost(
    served, compiled, read_raw, write_raw  # noqa: ANN001
) -> None:
    key = compiled.mlp[2].manifest.key
    _corrupt_blob(served, served.index.get(key).exe_digest, read_raw, write_raw)
    assert served.verify().quarantined == (key,)
    fn = aot.load(compiled.MLP_NAME, cache=served)
    assert len(fn.signatures) == 3
    _check_buckets(fn, compiled)
    assert served.index.get(key).ok
    _corrupt_blob(served, served.index.get(key).exe_digest, read_raw, write_raw)
    served.verify()
    with pytest.raises(CorruptArtifactError):  # strict: neither compile nor run it
        aot.load(compiled.MLP_NAME, cache=served, strict=True)


def test_missing_blob_is_recompiled(served, compiled) -> None:  # noqa: ANN001
    entry = served.index.get(compiled.mlp[1].manifest.key)
    served.blobs.delete(entry.exe_digest)
    _check_buckets(aot.load(compiled.MLP_NAME, cache=served), compiled)
    healed = served.index.get(entry.key)
    assert healed.ok and served.blobs.check(healed.exe_digest) is None


# ---------------------------------------------------------------- another process

_SERVER = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class NoModelCode(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "fixtures" or name.startswith("fixtures."):
                raise ImportError(f"the serving process must not import {name}")
            return None

    sys.meta_path.insert(0, NoModelCode())
    try:
        import fixtures.models
    except ImportError:
        pass
    else:
        raise SystemExit("the import guard does not work")

    import jax.monitoring
    import numpy as np
    import aot

    cache, data = sys.argv[1], np.load(sys.argv[2], allow_pickle=False)
    params = [{"b": data[f"b{i}"], "w": data[f"w{i}"]} for i in range(3)]
    work = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: work.append(event) if "/jax/core/compile/" in event else None
    )
    fn = aot.load("mlp.forward", cache=cache)
    result = {"signatures": fn.signatures, "ok": []}
    for batch in (1, 2, 4):
        out = np.asarray(fn(params, data[f"x{batch}"]))
        np.testing.assert_array_equal(out, data[f"y{batch}"])
        result["ok"].append(batch)
    result["jax_work"] = work
    # Serving a program without linalg needs neither LAPACK (scipy) nor SQLAlchemy
    # nor the lowering modules; serving exact signatures needs none of the modules of
    # other features (every serving process pays for its imports at start-up).
    result["imported"] = sorted(
        m for m in (
            "scipy", "sqlalchemy", "aot.lowering", "aot.computation",
            "aot.cache.index.sql",  # the SQLAlchemy index: the stdlib reader serves
            "aot.cache.serving.padding",  # only with pad=
            "aot.symbolic",  # only for symbolic signatures
            "aot.signatures",  # the wording of a miss
            "aot.cache.serving.misses",  # the wording of a miss
            "aot.cache.serving.symbolic",  # only for symbolic signatures
            "aot.cache.reports.stats", "aot.cache.stats_report",  # reading statistics back (aot stats)
            "aot.cache.serving.background",  # only with background=True
            "aot.cache.names", "aot.cache.pauses",  # writers only
            # Value objects defined apart because serving never makes one.
        )
        if m in sys.modules
    )
    try:
        fn(params, np.zeros((8, 784), np.float32))
    except aot.SignatureNotFoundError as err:
        result["error"] = str(err)
        result["available"] = list(err.available)
    result["model_imported"] = any(m.startswith("fixtures") for m in sys.modules)
    print(json.dumps(result))
    """
)


@pytest.mark.version_suite
@pytest.mark.slow
def test_serving_process_without_the_model_code(served, compiled, tmp_path: Path) -> None:  # noqa: ANN001
    arrays = {}
    for i, layer in enumerate(compiled.params):
        arrays[f"b{i}"], arrays[f"w{i}"] = np.asarray(layer["b"]), np.asarray(layer["w"])
    for batch in compiled.MLP_BATCHES:
        arrays[f"x{batch}"] = np.asarray(compiled.inputs[batch])
        arrays[f"y{batch}"] = compiled.expected[batch]
    data = tmp_path / "io.npz"
    np.savez(data, **arrays)
    served.close()

    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, "-c", _SERVER, served.location, str(data)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] == [1, 2, 4]
    assert result["signatures"] == sorted(a.manifest.signature for a in compiled.mlp.values())
    assert result["jax_work"] == []  # no trace, no lowering, no XLA compile
    assert result["imported"] == []
    assert sorted(result["available"]) == result["signatures"]
    assert "f32[8,784]" in result["error"] and "Nearest" in result["error"]
    assert not result["model_imported"]


def test_the_newest_program_of_a_signature_is_served(open_folder_cache, compiled) -> None:  # noqa: ANN001
    """A name recompiled from changed code (same signature, new program) serves the new
    program, not the first one stored."""
    cache = open_folder_cache()
    cache.put(compiled.tiny)

    def tiny_v2(x, y):  # noqa: ANN001, ANN202
        return x * y + 2

    cache.compile(tiny_v2, *compiled.models.tiny_specs(), name=compiled.TINY_NAME)
    assert len(cache.entries(compiled.TINY_NAME)) == 2
    fn = aot.load(compiled.TINY_NAME, cache=cache)
    assert len(fn.signatures) == 1
    np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected + 1)


def test_a_foreign_unsigned_artifact_is_not_recompiled_by_a_keyed_loader(
    open_folder_cache, compiled, foreign  # noqa: ANN001
) -> None:
    open_folder_cache().put(foreign(compiled.tiny, jaxlib="0.0.1"))  # stored without a key
    keyed = open_folder_cache(signing_key="k")
    with pytest.raises(aot.IntegrityError, match="not signed"):
        aot.load(compiled.TINY_NAME, cache=keyed)
    assert len(keyed.entries()) == 1  # nothing was compiled from it


# ---------------------------------------------------------------- failing fast at start-up


@pytest.mark.parametrize("read_only", [None, False, True])
def test_a_mistyped_folder_is_refused_and_not_created(tmp_path: Path, read_only) -> None:  # noqa: ANN001
    missing = tmp_path / "caches" / "typo"
    with pytest.raises(aot.CacheError) as caught:
        aot.load("mlp.forward", cache=str(missing), read_only=read_only)
    message = str(caught.value)
    assert str(missing) in message and "check the path" in message
    assert not missing.exists() and not (tmp_path / "caches").exists()


def test_a_mistyped_url_is_refused_and_nothing_created(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    sqlite_file = tmp_path / "typo.sqlite"
    with pytest.raises(aot.CacheError, match="no jax-aot cache index"):
        aot.load("mlp.forward", cache=f"sqlite:///{sqlite_file}")
    assert not sqlite_file.exists()


@pytest.mark.postgres
def test_an_empty_database_is_refused_and_not_initialised(postgres_url: str) -> None:
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    with pytest.raises(aot.CacheError, match="no jax-aot cache index") as caught:
        aot.load("mlp.forward", cache=postgres_url)
    assert "aot.load never creates a cache" in str(caught.value)
    engine = sa.create_engine(postgres_url, poolclass=NullPool)
    try:
        assert sa.inspect(engine).get_table_names() == []  # no schema was created
    finally:
        engine.dispose()


@pytest.mark.parametrize(("strict", "lazy"), [(False, False), (True, True)])
def test_a_mistyped_name_is_refused_at_start_up_naming_close_names(
    open_cache, compiled, strict: bool, lazy: bool  # noqa: ANN001
) -> None:
    cache = open_cache()
    for artifact in compiled.all():
        cache.put(artifact)
    with pytest.raises(SignatureNotFoundError) as caught:
        aot.load("mlp.froward", cache=open_cache(), strict=strict, lazy=lazy)
    message = str(caught.value)
    assert "nothing is stored under 'mlp.froward'" in message
    assert "Did you mean 'mlp.forward'?" in message
    assert "allow_empty=True" in message
    fn = aot.load("mlp.froward", cache=open_cache(), strict=strict, lazy=lazy, allow_empty=True)
    assert fn.signatures == []


def test_strict_with_only_other_environments_names_each_entry_and_part(
    open_cache, compiled, foreign  # noqa: ANN001
) -> None:
    import jaxlib

    cache = open_cache()
    stored = cache.put(foreign(compiled.tiny, jaxlib="0.0.1"))
    with pytest.raises(SignatureNotFoundError) as caught:
        aot.load(compiled.TINY_NAME, cache=open_cache(), strict=True, lazy=True)
    message = str(caught.value)
    assert "can be served here with strict=True" in message
    assert f"({compiled.tiny.manifest.signature}) {stored.key[:12]} compiled for another environment" in message
    assert f"jaxlib 0.0.1 != {jaxlib.__version__}" in message
    assert caught.value.available == (compiled.tiny.manifest.signature,)
    # without strict, the portable HLO makes it servable (recompiled on load)
    fn = aot.load(compiled.TINY_NAME, cache=open_cache())
    np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected)


def test_a_fallback_starts_on_an_empty_name(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put(compiled.tiny)
    fn = aot.load("new.name", cache=cache, fallback=compiled.models.tiny)
    np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected)


def test_the_loaders_error_shows_a_list_in_one_phrase(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put(compiled.mlp[2])
    fn = aot.load(compiled.MLP_NAME, cache=cache)
    with pytest.raises(aot.SignatureNotFoundError) as info:
        fn(compiled.params, [0.5] * 1000)
    first = str(info.value).splitlines()[0]
    assert first == (
        "mlp.forward: no executable compiled for (params: [{b: f32[512], w: f32[784,512]}, "
        "{b: f32[512], w: f32[512,512]}, {b: f32[10], w: f32[512,10]}], x: a list of 1000 Python floats)."
    )
    assert len(str(info.value)) < 1000


SERVE_BOTH = """
[[function]]
name = "serve.forward"
function = "fixtures.models:tiny"
args = ["f32[{n}]", "f32[{n}]"]
vary = { n = [4, 8, 16] }
target = ["tpu:v5e:1x1", "host"]
"""


@needs_libtpu
def test_a_cpu_replica_of_its_release_says_nothing_of_the_tpu_entries(tmp_path: Path, caplog) -> None:  # noqa: ANN001
    """A release for CPU replicas (prod-cpu) in a cache that also holds the TPU
    fleet's entries of the same signatures: those rows are nothing to this host (a row
    of its own environment serves each signature), so loading warns of none of them;
    a release that leaves a signature to a TPU row alone still warns."""
    from aot.cache.warmup.manifest import expand, parse_manifest
    from aot.cache.warmup.run import run_warmup

    items = expand(parse_manifest(SERVE_BOTH, str(tmp_path / "serve.toml")))
    tpu = [i for i in items if i.device_target is not None]
    host = [i for i in items if i.device_target is None]
    location = tmp_path / "cache"
    assert run_warmup(location, tpu, origin=RefOrigin("ci", commit="c1"), release="prod").ok
    assert run_warmup(location, host, origin=RefOrigin("ci", commit="c1"), release="prod-cpu").ok
    with aot.Cache(location) as cache, caplog.at_level(logging.INFO, logger="aot"):
        fn = aot.load("serve.forward", cache=cache, release="prod-cpu")
        for n in (4, 8, 16):
            np.testing.assert_array_equal(fn(jnp.ones(n), jnp.ones(n)), np.full(n, 2.0))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    skipped = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(skipped) == 3 and all(
        m.endswith("compiled for tpu:v5e:1x1, this process runs cpu x8") for m in skipped
    ), skipped

    # The TPU fleet's release on this CPU host: its rows are what it names, so each
    # one this host cannot run is a warning.
    caplog.clear()
    with aot.Cache(location) as cache, caplog.at_level(logging.WARNING, logger="aot"):
        aot.load("serve.forward", cache=cache, release="prod", lazy=False)
    assert len([r for r in caplog.records if "skipping" in r.getMessage()]) == 3, caplog.text
