"""The installed ``aot`` script end to end, in subprocesses, as CI and a server use it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import aot
from tests.cli.helpers import MANIFEST, REPO

pytestmark = pytest.mark.slow


def _aot_command() -> list[str]:
    script = shutil.which("aot") or str(Path(sys.executable).with_name("aot"))
    return [script] if Path(script).exists() else [sys.executable, "-m", "aot"]


def run(*args: object, module: bool = False, check: int = 0) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "aot"] if module else _aot_command()
    result = subprocess.run(
        [*command, *map(str, args)], cwd=REPO, env=os.environ.copy(), capture_output=True,
        text=True, timeout=300,
    )
    assert result.returncode == check, (args, result.returncode, result.stdout, result.stderr)
    return result


SERVE = textwrap.dedent("""
    import json, sys
    import numpy as np
    import aot

    folder = sys.argv[1]
    out = {}
    mlp = aot.load("mlp.forward", cache=folder, strict=True)
    out["signatures"] = len(mlp.signatures)
    # Real inputs; the model module is imported only to build them and a reference.
    from fixtures import models
    import jax
    params, x = models.mlp_init(0), models.mlp_input(8)
    got = np.asarray(mlp(params, x))
    want = np.asarray(jax.jit(models.mlp_forward)(params, x))
    out["mlp_shape"] = list(got.shape)
    out["mlp_max_abs_diff"] = float(np.max(np.abs(got - want)))
    tiny = aot.load("tiny", cache=folder, strict=True)
    out["tiny"] = np.asarray(tiny(*models.tiny_inputs())).tolist()
    # Serving a folder cache reads its index with the standard library's sqlite3.
    out["sqlalchemy"] = sorted(m for m in sys.modules if m == "sqlalchemy" or m.startswith("sqlalchemy."))
    # LAPACK (SciPy's bindings) is initialised only for executables that call it.
    out["scipy"] = sorted(m for m in sys.modules if m == "scipy" or m.startswith("scipy."))
    print(json.dumps(out))
""")


@pytest.mark.version_suite
def test_ci_to_serving(tmp_path: Path) -> None:
    ci_cache, served, bundle = tmp_path / "ci", tmp_path / "served", tmp_path / "models.aotb"

    warm = run("--cache", ci_cache, "warmup", MANIFEST, "--jobs", "2")
    assert warm.stdout.splitlines()[-1].startswith("5 entries: 5 compiled, 0 hit, 0 failed in ")

    listed = json.loads(run("ls", "--cache", ci_cache, "--json").stdout)  # options after the command
    assert listed["count"] == 5
    assert sorted({e["name"] for e in listed["entries"]}) == ["allreduce", "mlp.forward", "tiny"]

    verified = run("--cache", ci_cache, "verify", "--manifest", MANIFEST, "--strict")
    assert "all 5 entries are stored for this environment" in verified.stdout

    cache = aot.Cache(ci_cache)
    (allreduce,) = cache.entries("allreduce")
    cache.index.delete([allreduce.key])
    cache.close()
    failed = run("--cache", ci_cache, "verify", "--manifest", MANIFEST, "--strict", check=1)
    assert f"  allreduce ({MANIFEST}:28): f32[8,1024]" in failed.stdout

    plan = run("--cache", ci_cache, "gc", "--max-size", "1", "--dry-run")
    # What the warm-up declared served is pinned: a size bound never evicts it.
    assert "kept 4 pinned entries:" in plan.stdout and "  to unpin: " in plan.stdout

    exported = run("--cache", ci_cache, "bundle", "export", bundle)
    assert exported.stdout.startswith(f"exported 4 entries to {bundle} (")
    imported = run("--cache", served, "bundle", "import", bundle, module=True)  # python -m aot
    assert imported.stdout == f"imported 4 entries from {bundle} (0 already present)\nrefs: 4 set\n"

    serving = subprocess.run(
        [sys.executable, "-c", SERVE, str(served)], cwd=REPO, env=os.environ.copy(),
        capture_output=True, text=True, timeout=300,
    )
    assert serving.returncode == 0, serving.stderr
    out = json.loads(serving.stdout.splitlines()[-1])
    assert out["signatures"] == 3
    assert out["mlp_shape"] == [8, 10] and out["mlp_max_abs_diff"] < 1e-4
    assert out["tiny"] == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0]
    assert out["sqlalchemy"] == []  # the serving process never imported SQLAlchemy
    assert out["scipy"] == []  # no program here calls LAPACK: SciPy's bindings stay unloaded


EXIT_MODULE = textwrap.dedent("""
    import atexit, os

    OUT = os.environ["EXITMOD_OUT"]


    def _write(name, text, _open=open, _join=os.path.join):
        with _open(_join(OUT, name), "w") as f:
            f.write(text)


    atexit.register(_write, "atexit", "ran")


    class _Finalized:
        # Written when the interpreter frees this module's objects at exit.
        def __del__(self, _write=_write):
            _write("finalized", "ran")


    _sentinel = _Finalized()


    def double(x):
        return x * 2.0
""")


def test_a_command_ends_without_teardown_yet_leaves_its_work_closed(tmp_path: Path) -> None:
    """After a command, the process ends without the interpreter freeing every module
    (0.3-0.4 s once JAX is loaded); atexit handlers still run, the cache is closed
    (no SQLite write-ahead log left behind) and the exit status is the command's."""
    project, cache = tmp_path / "project", tmp_path / "cache"
    project.mkdir()
    (project / "exitmod.py").write_text(EXIT_MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(project), os.environ.get("PYTHONPATH", "")])}

    def outputs(name: str, command: list[str]) -> tuple[subprocess.CompletedProcess[str], set[str]]:
        out = tmp_path / name
        out.mkdir()
        result = subprocess.run(
            command, cwd=REPO, env={**env, "EXITMOD_OUT": str(out)}, capture_output=True, text=True,
            timeout=300,
        )
        return result, {p.name for p in out.iterdir()}

    # The control: a plain interpreter exit finalizes the module's objects.
    plain, written = outputs("plain", [sys.executable, "-c", "import exitmod"])
    assert plain.returncode == 0, plain.stderr
    assert written == {"atexit", "finalized"}

    compiled, written = outputs(
        "aot", [*_aot_command(), "--cache", str(cache), "compile", "exitmod:double", "--arg", "f32[4]"]
    )
    assert compiled.returncode == 0, compiled.stderr
    assert "exitmod.double" in compiled.stdout
    assert written == {"atexit"}  # atexit ran; the interpreter's teardown did not
    assert sorted(p.name for p in cache.glob("index.sqlite*")) == ["index.sqlite"]
    entry = aot.Cache(cache, read_only=True).entries("exitmod.double")
    assert len(entry) == 1 and entry[0].ok

    failed, written = outputs(
        "failed", [*_aot_command(), "--cache", str(cache), "compile", "exitmod:nope", "--arg", "f32[4]"]
    )
    assert failed.returncode == 1 and failed.stderr.startswith("Error: "), failed.stderr
    assert written == {"atexit"}
    usage, _ = outputs("usage", [*_aot_command(), "--cache", str(cache), "compile"])
    assert usage.returncode == 2 and "Usage: aot compile" in usage.stderr


DRIVER = textwrap.dedent("""
    # The aot command, reporting at exit whether this process imported SQLAlchemy.
    import atexit
    import sys

    from aot.cli.main import main

    atexit.register(lambda: print(f"SQLALCHEMY_HERE={'sqlalchemy' in sys.modules}", file=sys.stderr))

    if __name__ == "__main__":
        main()
""")


def test_a_fully_cached_warmup_never_imports_sqlalchemy(tmp_path: Path) -> None:
    """The first warm-up into a folder creates and writes its index (SQLAlchemy); the
    next one, all hits, only reads it through the standard library: it never imports
    SQLAlchemy, and it leaves no -wal or -shm file behind."""
    driver, cache = tmp_path / "driver.py", tmp_path / "cache"
    driver.write_text(DRIVER)

    def warmup() -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, str(driver), "--cache", str(cache), "warmup", str(MANIFEST)],
            cwd=REPO, env=os.environ.copy(), capture_output=True, text=True, timeout=300,
        )
        assert result.returncode == 0, result.stderr
        return result

    first = warmup()
    assert "5 compiled, 0 hit" in first.stdout
    assert sorted(p.name for p in cache.glob("index.sqlite*")) == ["index.sqlite"]
    with aot.Cache(cache, read_only=True) as stored:
        entries = stored.entries()
        assert len(entries) == 5 and all(e.ok for e in entries)
    run("--cache", cache, "verify", "--manifest", MANIFEST, "--strict")

    second = warmup()
    assert "0 compiled, 5 hit" in second.stdout
    assert "SQLALCHEMY_HERE=False" in second.stderr
    assert sorted(p.name for p in cache.glob("index.sqlite*")) == ["index.sqlite"]
