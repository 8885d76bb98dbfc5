"""Rollback by warm-up: v1 -> v2 -> v1 of a model's code serves v1 again, on a folder
cache and on PostgreSQL + S3, in a process that cannot import the model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import aot
from aot.cache.index.entry import SCHEMA_VERSION
from aot.cache.index.refs import RefOrigin
from aot.cache.warmup.run import expand, load_manifest, run_warmup

MANIFEST = '''
[[function]]
name = "act.layer"
function = "rollback_model:layer"
args = ["f32[16]"]
'''

SERVE = '''
import sys, numpy as np, aot
fn = aot.load("act.layer", cache=sys.argv[1], strict=True)
x = np.linspace(-3, 3, 16, dtype=np.float32)
sys.stdout.write(np.asarray(fn(x)).tobytes().hex())
'''


def _version(project: Path, activation: str) -> None:
    """The model's code as it is at one version (an activation of jax.nn)."""
    (project / "rollback_model.py").write_text(
        f"import jax\n\ndef layer(x):\n    return jax.nn.{activation}(x) * 2.0\n"
    )
    sys.modules.pop("rollback_model", None)  # a fresh `aot warmup` process imports it anew


def _warm(project: Path, cache: aot.Cache) -> list[str]:
    jax.clear_caches()
    report = run_warmup(cache, expand(load_manifest(project / "warmup.toml")), origin=RefOrigin("rollback test"))
    assert report.ok, [r.error for r in report.results]
    return [r.status for r in report.results]


def _served(location: str) -> bytes:
    out = subprocess.run([sys.executable, "-c", SERVE, location], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr[-3000:]
    return bytes.fromhex(out.stdout)


def _jit(activation: str) -> bytes:
    x = np.linspace(-3, 3, 16, dtype=np.float32)
    return np.asarray(jax.jit(lambda v: getattr(jax.nn, activation)(v) * 2.0)(x)).tobytes()


@pytest.mark.parametrize("backend", ["folder", pytest.param("postgresql-s3", marks=pytest.mark.postgres)])
def test_warming_v1_again_serves_v1(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # each version is read from its source
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "warmup.toml").write_text(MANIFEST)
    if backend == "folder":
        location = str(tmp_path / "cache")
        blobs = None
    else:
        location = request.getfixturevalue("postgres_url")
        blobs = request.getfixturevalue("s3_url")
    with aot.Cache(location, blob_location=blobs) as cache:
        _version(tmp_path, "gelu")
        assert _warm(tmp_path, cache) == ["compiled"]
        _version(tmp_path, "relu")
        assert _warm(tmp_path, cache) == ["compiled"]
        assert _served(location) == _jit("relu")
        _version(tmp_path, "gelu")
        assert _warm(tmp_path, cache) == ["hit"]  # v1 is stored: no compile, but declared again
        history = [h.key for h in cache.index.ref_history("act.layer")]
    assert _served(location) == _jit("gelu") != _jit("relu")
    assert len(history) == 3 and history[0] == history[2] != history[1]


def _as_written_before_refs(location: str) -> None:
    """The index as the main before refs wrote it: schema 5, no refs or releases."""
    import sqlalchemy as sa

    engine = sa.create_engine(location if "://" in location else f"sqlite:///{location}/index.sqlite")
    try:
        with engine.begin() as conn:
            for table in ("release_members", "releases", "refs", "ref_history", "cache_meta",
                          "jit_entries", "jit_stats", "jit_claims"):
                conn.exec_driver_sql(f"DROP TABLE {table}")
            conn.exec_driver_sql("UPDATE schema_version SET version = 5")
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["folder", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_cache_written_before_refs_serves_the_newest_then_what_the_next_warm_up_declares(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "warmup.toml").write_text(MANIFEST)
    location = str(tmp_path / "cache") if backend == "folder" else request.getfixturevalue("postgres_url")
    with aot.Cache(location) as cache:
        for activation in ("gelu", "relu"):
            _version(tmp_path, activation)
            _warm(tmp_path, cache)
    _as_written_before_refs(location)
    # The legacy rule (docs/serving.md, "What is served"): the newest entry serves.
    assert _served(location) == _jit("relu")
    with aot.Cache(location) as cache:  # a writer migrates the index to refs
        assert cache.index.schema_version() == SCHEMA_VERSION and cache.refs_named("act.layer") == []
        _version(tmp_path, "gelu")
        assert _warm(tmp_path, cache) == ["hit"]
    assert _served(location) == _jit("gelu")
