"""Warm-ups declare what is served: refs for what they compile or hit, release sets,
and a trace that reads a config file or an environment variable is lowered again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
from aot.cache.index.refs import RefOrigin
from aot.cache.warmup.run import expand, load_manifest, run_warmup

MODEL = '''
import json, os
from pathlib import Path
import jax.numpy as jnp

def forward(x):
    scale = json.loads((Path(__file__).parent / "cfg.json").read_text())["scale"]
    shift = float(os.environ.get("DECLARE_SHIFT", "0"))
    return jnp.tanh(x) * scale + shift
'''

MANIFEST = '''
[[function]]
name = "cfg.forward"
function = "declare_model:forward"
args = ["f32[4]"]
'''

SERVE = '''
import sys, numpy as np, aot
fn = aot.load("cfg.forward", cache=sys.argv[1], strict=True)
x = np.linspace(-1, 1, 4, dtype=np.float32)
sys.stdout.write(np.asarray(fn(x)).tobytes().hex())
'''


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "declare_model.py").write_text(MODEL)
    (tmp_path / "cfg.json").write_text(json.dumps({"scale": 1.0}))
    (tmp_path / "warmup.toml").write_text(MANIFEST)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("DECLARE_SHIFT", raising=False)
    return tmp_path


def _warm(project: Path, location: str, **kwargs: object) -> list[str]:
    jax.clear_caches()  # as in a fresh `aot warmup` process: jax.jit caches traces per function
    items = expand(load_manifest(project / "warmup.toml"))
    report = run_warmup(location, items, origin=RefOrigin("warmup test", commit="c1"), **kwargs)
    assert report.ok, [r.error for r in report.results]
    return [r.status for r in report.results]


def _served(location: str) -> bytes:
    # A fresh process that cannot import declare_model (not on its path).
    out = subprocess.run([sys.executable, "-c", SERVE, location], check=True, capture_output=True,
                         text=True, cwd="/")
    return bytes.fromhex(out.stdout)


def _expected(scale: float, shift: float) -> bytes:
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    return np.asarray(jax.jit(lambda v: jnp.tanh(v) * scale + shift)(x)).tobytes()


def test_a_changed_config_file_or_environment_variable_is_compiled_and_served(
    project: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    location = str(project / "cache")
    assert _warm(project, location) == ["compiled"]
    assert _warm(project, location) == ["hit"]
    assert _served(location) == _expected(1.0, 0.0)

    (project / "cfg.json").write_text(json.dumps({"scale": 2.0}))
    assert _warm(project, location) == ["compiled"]
    assert _served(location) == _expected(2.0, 0.0)

    monkeypatch.setenv("DECLARE_SHIFT", "0.5")
    assert _warm(project, location) == ["compiled"]
    assert _served(location) == _expected(2.0, 0.5)

    # Back to the first config: a hit, and the warm-up makes it the one served again.
    (project / "cfg.json").write_text(json.dumps({"scale": 1.0}))
    monkeypatch.delenv("DECLARE_SHIFT")
    assert _warm(project, location) == ["hit"]
    with aot.Cache(location) as cache:
        history = cache.index.ref_history("cfg.forward")
        (ref,) = cache.refs_named("cfg.forward")
    assert ref.key == history[-1].key  # the ref points at the first program again
    assert _served(location) == _expected(1.0, 0.0)
    assert [h.source for h in history] == ["warmup test"] * 4
    assert {h.commit for h in history} == {"c1"}


def test_shards_of_one_run_share_one_release_set(project: Path) -> None:
    location = str(project / "cache")
    (project / "warmup.toml").write_text(MANIFEST + MANIFEST.replace('"cfg.forward"', '"cfg.other"')
                                         .replace("f32[4]", "f32[8]"))
    _warm(project, location, shard=(1, 2), release="candidate", run="r1")
    _warm(project, location, shard=(2, 2), release="candidate", run="r1")
    with aot.Cache(location) as cache:
        release = cache.index.release_set("candidate")
        assert release is not None
        assert sorted(m.name for m in release.members) == ["cfg.forward", "cfg.other"]
        assert len(cache.index.release_history("candidate")) == 1
        refs = {r.name: r.key for r in cache.index.refs()}
        assert {m.name: m.key for m in release.members} == refs
    _warm(project, location, release="candidate", run="r2")
    with aot.Cache(location) as cache:
        assert len(cache.index.release_history("candidate")) == 2


def test_cache_compile_sets_the_ref_of_a_hit(tmp_path: Path) -> None:
    with aot.Cache(str(tmp_path / "c")) as cache:
        cache.compile(lambda x: x * 2.0, "f32[3]", name="twice")
        first = cache.refs_named("twice")
        cache.compile(lambda x: x * 3.0, "f32[3]", name="twice")
        cache.compile(lambda x: x * 2.0, "f32[3]", name="twice", origin=RefOrigin("me"))
        now = cache.refs_named("twice")
        history = cache.index.ref_history("twice")
    assert [r.key for r in now] == [r.key for r in first]
    assert [h.source for h in history] == ["me", "Cache.compile", "Cache.compile"]
