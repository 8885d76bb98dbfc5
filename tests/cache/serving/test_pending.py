"""aot.load files a row when its signature is first needed, not at start-up
(cache/serving/pending.py): a lazy or background start-up of a name with many
signatures parses no manifest it does not need, and every check filing makes still
runs before a row's executable does."""

from __future__ import annotations

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sqlalchemy as sa

import aot
from aot.artifact import Manifest
from aot.cache.serving.pending import leaf_keys_of
from aot.errors import CorruptArtifactError, SignatureNotFoundError
from aot.specs import leaf_aval

SIZES = (1, 2, 3, 4, 5, 6)


def double(x):  # noqa: ANN001, ANN201
    return x * 2.0


@pytest.fixture
def many(open_folder_cache):  # noqa: ANN001, ANN201
    """A folder cache holding ``many`` at f32[1] .. f32[6]."""
    cache = open_folder_cache()
    for size in SIZES:
        cache.compile(double, aot.spec(f"f32[{size}]"), name="many")
    return cache


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of the manifests parsed from now on."""
    seen: list[str] = []
    real = Manifest.from_json.__func__  # type: ignore[attr-defined]

    def counted(cls, text):  # noqa: ANN001, ANN202
        manifest = real(cls, text)
        seen.append(manifest.key)
        return manifest

    monkeypatch.setattr(Manifest, "from_json", classmethod(counted))
    return seen


def _row(cache, size: int):  # noqa: ANN001, ANN202
    return next(e for e in cache.entries("many") if e.signature == f"f32[{size}]")


def _update(cache, key: str, **values: str) -> None:  # noqa: ANN001
    from aot.cache.index.schema import ARTIFACTS as t

    with cache.index.engine.begin() as conn:
        conn.execute(sa.update(t).where(t.c.key == key).values(**values))


def test_leaf_keys_of_a_signature_column_are_a_calls_leaf_keys() -> None:
    x, scalar = jnp.zeros((8, 784), jnp.float32), 0.5
    assert leaf_keys_of("f32[8,784], ~f32[]") == (leaf_aval(x), leaf_aval(scalar))
    assert leaf_keys_of("i32[], bool[3], bf16[2,2]") == (
        leaf_aval(jnp.int32(1)), leaf_aval(jnp.zeros(3, bool)), leaf_aval(jnp.zeros((2, 2), jnp.bfloat16)),
    )
    # What the column does not say is filed at start-up, as before.
    for text in ("", "f32[b,784]", "f32[8], act='relu'", "key<fry>[2]", "float8_e4m3fn[2]", "f32[8", "f32[²]"):
        assert leaf_keys_of(text) is None, text


def test_a_lazy_start_up_parses_no_manifest_of_a_signature_not_called(many, parses) -> None:  # noqa: ANN001
    fn = aot.load("many", cache=many, lazy=True)
    assert len(parses) <= 1  # start-up files one group: something is servable
    x = jnp.arange(3, dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(fn(x)), np.arange(3) * 2.0)
    assert set(parses) <= {_row(many, 3).key, _row(many, 1).key}
    assert fn.signatures == [f"f32[{n}]" for n in SIZES]  # listing files every row


@pytest.mark.parametrize("mode", ["eager", "background"])
def test_eager_and_background_loads_file_and_load_every_signature(many, mode: str) -> None:  # noqa: ANN001
    fn = aot.load("many", cache=many, background=mode == "background")
    assert fn.wait(60)
    programs = list(fn.programs.concrete.values())
    assert sorted(p.signature for p in programs) == [f"f32[{n}]" for n in SIZES]
    assert all(p.executable is not None for p in programs)
    for n in SIZES:
        np.testing.assert_array_equal(np.asarray(fn(jnp.ones(n, jnp.float32))), np.full(n, 2.0))


def _damage(cache, size: int) -> str:  # noqa: ANN001
    """The row of f32[size] with device ids its program fingerprint contradicts (not
    covered by the key: found by filing's cross-checks, not by the key)."""
    entry = _row(cache, size)
    data = json.loads(entry.manifest)
    data["device_ids"] = [1]
    _update(cache, entry.key, manifest=json.dumps(data))
    return entry.key


def test_a_damaged_row_of_a_lazy_signature_is_found_at_its_first_call_before_it_runs(many, caplog) -> None:  # noqa: ANN001
    key = _damage(many, 4)
    fn = aot.load("many", cache=many, lazy=True)
    assert many.index.get(key).ok  # not filed yet: nothing read it
    with caplog.at_level(logging.WARNING, logger="aot.cache.serving"):
        out = fn(jnp.ones(4, jnp.float32))
    np.testing.assert_array_equal(np.asarray(out), np.full(4, 2.0))  # recompiled from its portable HLO
    assert "manifest contradicts its fingerprints: device_ids [1] != [0]" in caplog.text
    assert "recompiled from portable HLO" in caplog.text


def test_strict_never_runs_a_damaged_row_of_a_lazy_signature(many) -> None:  # noqa: ANN001
    key = _damage(many, 4)
    fn = aot.load("many", cache=many, lazy=True, strict=True)
    with pytest.raises(CorruptArtifactError, match="device_ids"):
        fn(jnp.ones(4, jnp.float32))
    np.testing.assert_array_equal(np.asarray(fn(jnp.ones(2, jnp.float32))), np.full(2, 2.0))
    assert many.index.get(key).ok  # strict never writes


def test_a_row_whose_signature_column_lies_is_served_by_its_manifest(many) -> None:  # noqa: ANN001
    _update(many, _row(many, 3).key, signature="f32[99]")
    fn = aot.load("many", cache=many, lazy=True)
    np.testing.assert_array_equal(np.asarray(fn(jnp.ones(3, jnp.float32))), np.full(3, 2.0))
    with pytest.raises(SignatureNotFoundError):
        fn(jnp.ones(99, jnp.float32))


@pytest.mark.parametrize("mode", ["lazy", "background"])
@pytest.mark.parametrize("strict", [False, True])
def test_start_up_still_refuses_a_name_none_of_whose_rows_serves_here(open_folder_cache, mode, strict) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    jax.config.update("jax_enable_x64", True)  # restored by conftest
    for size in (2, 3):
        cache.compile(double, aot.spec(f"f64[{size}]"), name="wide")
    jax.config.update("jax_enable_x64", False)
    with pytest.raises(SignatureNotFoundError) as info:
        aot.load("wide", cache=cache, strict=strict, lazy=mode == "lazy", background=mode == "background")
    message = str(info.value)
    assert "(f64[2])" in message and "(f64[3])" in message
    assert "cannot run in this process: compiled with jax_enable_x64=true" in message


@pytest.mark.parametrize("mode", ["lazy", "background"])
def test_strict_start_up_refuses_a_name_stored_only_for_another_environment(
    open_folder_cache, compiled, foreign, mode: str,  # noqa: ANN001
) -> None:
    cache = open_folder_cache()
    cache.put_artifact(foreign(compiled.tiny, jaxlib="0.0.1"))
    with pytest.raises(SignatureNotFoundError, match="with strict=True"):
        aot.load(compiled.TINY_NAME, cache=cache, strict=True, lazy=mode == "lazy", background=mode == "background")
    fn = aot.load(compiled.TINY_NAME, cache=cache, lazy=mode == "lazy", background=mode == "background")
    np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected)  # recompiled


def scaled(x, n):  # noqa: ANN001, ANN201
    return x * n


def test_a_row_whose_signature_column_hides_its_statics_is_not_served(open_folder_cache) -> None:  # noqa: ANN001
    """A row without ``=`` in its signature column is read as statics-free without its
    manifest (start-up reads no manifest); filing refuses one whose manifest has some."""
    cache = open_folder_cache()
    cache.compile(scaled, aot.spec("f32[3]"), 3.0, static_argnums=1, name="scaled")
    entry = cache.entries("scaled")[0]
    assert entry.signature == "f32[3], n=3.0"
    _update(cache, entry.key, signature="f32[3]")
    with pytest.raises(SignatureNotFoundError, match=r"its manifest has static arguments \(n=3.0\)"):
        aot.load("scaled", cache=cache, lazy=True)


def test_a_loaded_signature_is_parsed_and_cross_checked_once(many, parses, monkeypatch) -> None:  # noqa: ANN001
    """Filing parses a row's manifest and checks it; the load that follows uses them."""
    import aot.artifact

    checks: list[str] = []
    real = aot.artifact.manifest_problems

    def counted(manifest):  # noqa: ANN001, ANN202
        checks.append(manifest.key)
        return real(manifest)

    monkeypatch.setattr("aot.artifact.manifest_problems", counted)
    monkeypatch.setattr("aot.cache.serving.programs.manifest_problems", counted)
    aot.load("many", cache=many)
    assert sorted(parses) == sorted(checks) == sorted(e.key for e in many.entries("many"))


@pytest.mark.parametrize("mode", ["lazy", "background"])
def test_threads_calling_signatures_not_filed_yet_each_get_theirs(many, mode: str) -> None:  # noqa: ANN001
    """Filing is shared: a group is filed once, whichever thread (a call, a background
    load, a miss filing every row) gets there first; the others wait for it."""
    from concurrent.futures import ThreadPoolExecutor

    fn = aot.load("many", cache=many, lazy=mode == "lazy", background=mode == "background")
    sizes = [*SIZES, *SIZES, 7]  # f32[7] is a miss: it files every row meanwhile

    def call(n: int) -> object:
        try:
            return np.asarray(fn(jnp.ones(n, jnp.float32)))
        except SignatureNotFoundError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=len(sizes)) as pool:
        results = list(pool.map(call, sizes))
    for n, result in zip(sizes[:-1], results):
        np.testing.assert_array_equal(result, np.full(n, 2.0))
    assert isinstance(results[-1], SignatureNotFoundError)
    assert fn.wait(60) and len(fn.programs.concrete) == len(SIZES)
