"""The start-up of ``aot warmup`` and ``aot compile`` (cli/common.py ``State.start_up``),
and of the warm-up's worker processes: JAX, its backend and SQLAlchemy are imported
with the garbage collector paused, then frozen; in a caller's process (CliRunner) the
collector is left as it is."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aot.cli.common import State
from tests.cli.helpers import REPO, Invoke

MANIFEST = """
[[function]]
name = "recorder"
function = "tests.cli.models:records_the_collector"
args = ["f32[4]"]
"""


def test_the_start_up_pauses_then_freezes_in_the_aot_process() -> None:
    assert gc.isenabled()
    before = gc.get_freeze_count()
    junk = [[] for _ in range(1000)]  # tracked objects the freeze moves out of reach
    try:
        with State(owns_process=True).start_up():
            assert not gc.isenabled()
        assert gc.isenabled()
        assert gc.get_freeze_count() >= before + len(junk)
    finally:
        gc.unfreeze()  # this is pytest's process: give its objects back to the collector
        gc.enable()


def test_the_start_up_leaves_a_callers_collector_alone() -> None:
    before = gc.get_freeze_count()
    with State().start_up():
        assert gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == before
    gc.disable()  # a caller that turned the collector off keeps it off
    try:
        with State(owns_process=True).start_up():
            pass
        assert not gc.isenabled() and gc.get_freeze_count() == before
    finally:
        gc.enable()


def test_warmup_in_process_leaves_the_collector_as_it_was(invoke: Invoke, tmp_path: Path, monkeypatch) -> None:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(MANIFEST)
    monkeypatch.setenv("AOT_TEST_GC_STATE", str(tmp_path / "gc.json"))
    before = gc.get_freeze_count()
    result = invoke("warmup", manifest)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "gc.json").read_text())["enabled"] is True
    assert gc.isenabled() and gc.get_freeze_count() == before


@pytest.mark.slow
def test_the_warmup_process_compiles_with_its_start_up_frozen(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(MANIFEST)
    env = {**os.environ, "AOT_TEST_GC_STATE": str(tmp_path / "gc.json")}
    result = subprocess.run(
        [sys.executable, "-m", "aot", "--cache", str(tmp_path / "cache"), "warmup", str(manifest)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("1 entry: 1 compiled, 0 hit, 0 failed in ")
    state = json.loads((tmp_path / "gc.json").read_text())
    # Collecting while the entry is traced, with JAX's and SQLAlchemy's objects (well
    # over 100,000 of them) out of every collection's way.
    assert state["enabled"] is True
    assert state["frozen"] > 100_000, state


def _traced_state(tmp_path: Path, *command: str) -> dict[str, object]:
    env = {**os.environ, "AOT_TEST_GC_STATE": str(tmp_path / "gc.json")}
    result = subprocess.run(
        [sys.executable, "-m", "aot", "--cache", str(tmp_path / "cache"), *command],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads((tmp_path / "gc.json").read_text())


@pytest.mark.slow
def test_the_compile_process_traces_with_its_start_up_frozen(tmp_path: Path) -> None:
    state = _traced_state(tmp_path, "compile", "tests.cli.models:records_the_collector", "--arg", "f32[4]")
    assert state["enabled"] is True
    assert state["frozen"] > 100_000, state


@pytest.mark.slow
def test_a_warmup_worker_traces_with_its_start_up_frozen(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(MANIFEST)
    # --isolate: the one entry is traced in a worker process, not in the aot process.
    state = _traced_state(tmp_path, "warmup", "--jobs", "2", "--isolate", str(manifest))
    assert state["enabled"] is True
    assert state["frozen"] > 100_000, state
