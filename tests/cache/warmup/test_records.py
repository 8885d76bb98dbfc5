"""Warm-up records (aot.cache.warmup.records): an unchanged entry skips its lowering;
a changed function body, spec, lazily imported module or environment never does."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from pathlib import Path

import pytest

import aot
from aot.cache.warmup.run import expand, parse_manifest, run_warmup
from aot.cache.warmup.records import RECORDS_FOLDER

MODEL = '''
import os

import jax
import jax.numpy as jnp


def scale(x):
    return x * 2.0


def lazy(x):
    from recmod_helper import offset  # imported while it is traced

    return x + offset()


def env_specs():
    return jax.ShapeDtypeStruct((int(os.environ.get("RECMOD_DIM", "4")),), jnp.float32)
'''

HELPER = '''
def offset():
    return 1.0
'''

MANIFEST = '''
[[function]]
name   = "scale"
target = "recmod:scale"
args   = ["f32[4]"]

[[function]]
name   = "lazy"
target = "recmod:lazy"
args   = ["f32[4]"]

[[function]]
name   = "env"
target = "recmod:scale"
args   = ["@recmod:env_specs"]
'''


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with a model module, a helper it imports lazily, a manifest."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "recmod.py").write_text(MODEL)
    (folder / "recmod_helper.py").write_text(HELPER)
    (folder / "warmup.toml").write_text(MANIFEST)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # a rewrite is read again
    monkeypatch.syspath_prepend(str(folder))  # `lazy` imports its helper while traced
    monkeypatch.delenv("RECMOD_DIM", raising=False)
    yield folder
    for name in ("recmod", "recmod_helper"):
        sys.modules.pop(name, None)


def _warm(project: Path, cache: Path, **kwargs) -> dict[str, tuple[str, bool | None]]:
    items = expand(parse_manifest((project / "warmup.toml").read_text(), str(project / "warmup.toml")))
    report = run_warmup(str(cache), items, **kwargs)
    assert report.ok, report.to_dict()
    return {r.label: (r.status, r.lowered) for r in report.results}


def _new_process(*modules: str) -> None:
    """As a fresh process would: the modules are imported again from their files."""
    for name in modules:
        sys.modules.pop(name, None)
    importlib.invalidate_caches()


ALL_HITS_UNLOWERED = {"scale": ("hit", False), "lazy": ("hit", False), "env": ("hit", False)}


def test_unchanged_entries_skip_lowering_changed_code_does_not(project: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _warm(project, cache)
    assert first == {"scale": ("compiled", True), "lazy": ("compiled", True), "env": ("compiled", True)}
    assert sorted(p.name for p in (cache / RECORDS_FOLDER).rglob("*.json")).__len__() == 3

    _new_process("recmod", "recmod_helper")
    assert _warm(project, cache) == ALL_HITS_UNLOWERED

    # A new function body: a new program, lowered and compiled.
    (project / "recmod.py").write_text(MODEL.replace("x * 2.0", "x * 3.0"))
    _new_process("recmod")
    changed = _warm(project, cache)
    assert changed["scale"] == ("compiled", True) and changed["env"] == ("compiled", True)
    assert changed["lazy"] == ("hit", True)  # its module file changed: lowered, same program

    # The module that `lazy` imports only while it is traced.
    _new_process("recmod", "recmod_helper")
    assert _warm(project, cache) == ALL_HITS_UNLOWERED
    (project / "recmod_helper.py").write_text(HELPER.replace("1.0", "5.0"))
    _new_process("recmod_helper")
    assert _warm(project, cache)["lazy"] == ("compiled", True)

    # --relower: every entry lowered, the records notwithstanding.
    assert set(_warm(project, cache, records=False).values()) == {("hit", True)}


def test_a_changed_spec_or_environment_is_lowered(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = tmp_path / "cache"
    _warm(project, cache)
    assert _warm(project, cache) == ALL_HITS_UNLOWERED

    # The @callable's result changes with no file changed (it reads the environment).
    monkeypatch.setenv("RECMOD_DIM", "6")
    changed = _warm(project, cache)
    assert changed["env"] == ("compiled", True)
    assert changed["scale"] == ("hit", False)
    monkeypatch.delenv("RECMOD_DIM")

    # Another environment fingerprint (XLA flags are part of it): new keys.
    import os

    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "") + " --xla_cpu_use_thunk_runtime=true")
    assert set(_warm(project, cache).values()) == {("compiled", True)}
    # No record led to loading the other environment's entries (which would have
    # quarantined them): the entries of both environments are intact.
    with aot.Cache(cache) as opened:
        assert [e.state for e in opened.entries()] == ["ok"] * 7
    monkeypatch.undo()

    # A JAX configuration value that changes how programs are traced.
    import jax

    with jax.default_matmul_precision("highest"):
        assert set(_warm(project, cache, jobs=2).values()) <= {("hit", True), ("compiled", True)}
        assert set(_warm(project, cache, jobs=2).values()) == {("hit", False)}


def test_a_record_is_only_a_hint(project: Path, tmp_path: Path) -> None:
    """A record whose key is gone, or that cannot be read, lowers the entry again."""
    cache_dir = tmp_path / "cache"
    _warm(project, cache_dir)
    cache = aot.Cache(cache_dir)
    (scale,) = [e for e in cache.entries() if e.name == "scale"]
    cache.index.delete([scale.key])
    for record in (cache_dir / RECORDS_FOLDER).rglob("*.json"):
        if json.loads(record.read_text())["key"] != scale.key:
            record.write_text("{not json")
    cache.close()
    assert _warm(project, cache_dir) == {
        "scale": ("compiled", True), "lazy": ("hit", True), "env": ("hit", True),
    }
    assert _warm(project, cache_dir) == ALL_HITS_UNLOWERED


def test_a_database_cache_keeps_no_records(postgres_url: str, project: Path) -> None:
    items = expand(parse_manifest(textwrap.dedent(MANIFEST), str(project / "warmup.toml")))[:1]
    run_warmup(postgres_url, items)
    again = run_warmup(postgres_url, items)
    assert [(r.status, r.lowered) for r in again.results] == [("hit", True)]


def test_a_target_without_a_source_file_is_always_lowered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module built at run time (no file to hash) could change unseen: no record."""
    import types

    module = types.ModuleType("recmod_synthetic")
    exec("def f(x):\n    return x - 1.0\n", module.__dict__)  # noqa: S102 - the module under test
    monkeypatch.setitem(sys.modules, "recmod_synthetic", module)
    items = expand(parse_manifest('[[function]]\nname = "syn"\ntarget = "recmod_synthetic:f"\nargs = ["f32[3]"]\n'))
    first = run_warmup(str(tmp_path / "c"), items)
    again = run_warmup(str(tmp_path / "c"), items)
    assert [(r.status, r.lowered) for r in first.results + again.results] == [("compiled", True), ("hit", True)]
    assert not (tmp_path / "c" / RECORDS_FOLDER).exists()


def test_records_written_by_workers_hold_in_the_next_run(project: Path, tmp_path: Path) -> None:
    """`aot warmup --jobs 2 --isolate` (every entry lowered and stored by a worker
    process), then `aot warmup`: no entry is lowered again. Run by the console script:
    a worker started with "spawn" then also holds the script as ``__mp_main__``."""
    import os
    import subprocess

    script = Path(sys.executable).with_name("aot")
    if not script.is_file():
        pytest.skip("the aot console script is not installed next to this Python")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(project))
    env.pop("AOT_CACHE", None)

    def warm(*options: str) -> list[tuple[str, bool]]:
        done = subprocess.run(
            [str(script), "--cache", str(tmp_path / "c"), "warmup",
             str(project / "warmup.toml"), "--json", *options],
            env=env, cwd=project, capture_output=True, text=True, timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return [(r["status"], r["lowered"]) for r in json.loads(done.stdout)["results"]]

    assert warm("--jobs", "2", "--isolate") == [("compiled", True)] * 3
    assert warm() == [("hit", False)] * 3
