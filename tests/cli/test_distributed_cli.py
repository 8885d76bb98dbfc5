"""``aot warmup --distributed`` / ``aot compile --distributed`` as a 2-process job on
loopback (2 CPU devices each, gloo collectives), and a host of that slice labelling
its entries ``this`` from the environment record.

The pytest process pins 8 devices (tests/conftest.py): every process of a job is a
subprocess with its own environment, its own free port, and every wait is bounded
(a helper local to this module; tests/distributed/ holds the shared harness).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from tests.cli.helpers import REPO

WAIT = 240  # seconds for a whole job on a busy 2-core runner

MESH_MANIFEST = """
[[function]]
name          = "slice.matmul"
function      = "fixtures.models:matmul"
args          = ["f32[64,512]", "f32[512,256]"]
mesh          = "data=2,model=2"
in_shardings  = ["data,None", "None,model"]
out_shardings = "data,model"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(process_id: int, count: int, port: int, extra: Mapping[str, str] = {}) -> dict[str, str]:
    """One process's environment: the pytest process's without its JAX/XLA pins."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "AOT_"))}
    env.update({
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
        "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
        "JAX_NUM_PROCESSES": str(count),
        "JAX_PROCESS_ID": str(process_id),
        "AOT_DISTRIBUTED_TIMEOUT": "60",
        "PYTHONPATH": str(REPO),
    })
    env.update(extra)
    return env


def run_job(
    argv: Sequence[str], count: int, *, extra: Mapping[str, str] = {}, per_process: Mapping[int, Sequence[str]] = {},
    port: int | None = None,
) -> list[subprocess.CompletedProcess[str]]:
    """Runs ``aot ARGV`` as ``count`` processes of one job; kills them all on the way out."""
    port = _free_port() if port is None else port
    procs = []
    try:
        for i in range(count):
            cmd = [sys.executable, "-m", "aot", *per_process.get(i, argv)]
            procs.append(subprocess.Popen(
                cmd, cwd=REPO, env=job_env(i, count, port, extra), text=True,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            ))
        deadline = time.monotonic() + WAIT
        out = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=max(1, deadline - time.monotonic()))
            out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "slice.toml"
    path.write_text(MESH_MANIFEST)
    return path


def _compiles(run: subprocess.CompletedProcess[str]) -> int:
    """XLA compiles of one process (JAX_LOG_COMPILES: JAX logs each one it finishes)."""
    return run.stderr.count("Finished XLA compilation")


def test_warmup_distributed_stores_one_entry_and_process_0_reports(tmp_path: Path, manifest: Path) -> None:
    cache, records, port = tmp_path / "cache", tmp_path / "records", _free_port()
    # JAX_LOG_COMPILES: JAX logs every compile (a JAX_ variable: in the record's key too).
    recorded = {"AOT_ENV_RECORD": str(records), "JAX_LOG_COMPILES": "1"}
    runs = run_job(["warmup", str(manifest), "--distributed", "--cache", str(cache)], 2, extra=recorded, port=port)
    assert [r.returncode for r in runs] == [0, 0], [r.stderr[-2000:] for r in runs]
    assert "1 compiled" in runs[0].stdout and "slice.matmul" in runs[0].stdout, runs[0].stdout
    assert runs[1].stdout == "", runs[1].stdout  # process 1 reports nothing
    # Compiled once for the slice: process 1 loaded process 0's entry from the cache.
    assert [_compiles(r) for r in runs] == [1, 0], [r.stderr[-2000:] for r in runs]

    import aot

    entries = aot.Cache(cache).entries("slice.matmul")
    assert len(entries) == 1
    # A host of the slice (a shell with process 1's environment, no device opened: the
    # record) knows the entry as its own: every device of the job, 2 processes.
    (row,) = _ls(cache, 1, port, extra=recorded)
    assert row["this_environment"] is True, row
    text = subprocess.run(
        [sys.executable, "-m", "aot", "ls", "--cache", str(cache)], cwd=REPO, text=True, capture_output=True,
        env=job_env(1, 2, port, {**recorded, "COLUMNS": "200"}), timeout=120,
    )
    (line,) = [x for x in text.stdout.splitlines() if "slice.matmul" in x]
    assert " this " in f" {line} ", text.stdout

    # Again: every process of the job loads the stored entry; nobody compiles.
    again = run_job(["warmup", str(manifest), "--distributed", "--cache", str(cache)], 2,
                    extra={"JAX_LOG_COMPILES": "1"})
    assert [r.returncode for r in again] == [0, 0], [r.stderr[-2000:] for r in again]
    assert "1 entry: 0 compiled, 1 hit, 0 failed" in again[0].stdout, again[0].stdout
    assert [_compiles(r) for r in again] == [0, 0], [r.stderr[-2000:] for r in again]
    assert len(aot.Cache(cache).entries("slice.matmul")) == 1


def _ls(cache: Path, process_id: int, port: int, extra: Mapping[str, str]) -> list[dict]:
    """``aot ls --json`` in the environment of ``process_id`` of the job (on ``port``),
    outside the job: a shell on that host, after it."""
    env = job_env(process_id, 2, port, extra)
    done = subprocess.run(
        [sys.executable, "-m", "aot", "ls", "--json", "--cache", str(cache)],
        cwd=REPO, env=env, text=True, capture_output=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    return data["entries"] if isinstance(data, dict) else data


def test_without_the_slice_record_the_entry_is_not_this_hosts(tmp_path: Path, manifest: Path) -> None:
    cache, port = tmp_path / "cache", _free_port()
    runs = run_job(
        ["warmup", str(manifest), "--distributed", "--cache", str(cache)], 2, extra={"AOT_ENV_RECORD": "off"},
        port=port,
    )
    assert [r.returncode for r in runs] == [0, 0], [r.stderr[-2000:] for r in runs]
    (row,) = _ls(cache, 1, port, extra={"AOT_ENV_RECORD": str(tmp_path / "empty")})
    # A single process of 2 CPU devices: not the slice's environment.
    assert row["this_environment"] is False
    assert any(d["part"] == "process_count" for d in row["environment_differences"]), row


@pytest.mark.parametrize("bad", [1, 0])
def test_a_failure_in_one_process_fails_every_process(tmp_path: Path, manifest: Path, bad: int) -> None:
    cache = tmp_path / "cache"
    broken = tmp_path / "bad.toml"
    broken.write_text(MESH_MANIFEST.replace("fixtures.models:matmul", "fixtures.models:no_such_function"))
    argv = ["warmup", str(manifest), "--distributed", "--cache", str(cache)]
    started = time.monotonic()
    runs = run_job(argv, 2, per_process={bad: ["warmup", str(broken), "--distributed", "--cache", str(cache)]},
                   extra={"AOT_SLICE_WAIT_SECONDS": "120"})
    assert [r.returncode for r in runs] == [1, 1], [(r.stdout, r.stderr[-2000:]) for r in runs]
    assert time.monotonic() - started < 100  # process 1 did not wait out its 120 s for process 0's item
    assert "no_such_function" in runs[0].stderr and "no_such_function" in runs[1].stderr
    assert "Traceback" not in runs[0].stderr + runs[1].stderr
    if bad == 1:  # process 0 names who failed and why; process 1 printed its own failure
        assert "Error: process 1: 1 failed, first slice.matmul" in runs[0].stderr, runs[0].stderr
    else:  # process 1 was told process 0's failure of the item it waited for
        assert "failed: slice.matmul" in runs[1].stderr, runs[1].stderr
        assert "process 0 failed to warm up slice.matmul" in runs[1].stderr
    assert aot_entries(cache) == (1 if bad else 0)  # process 0 alone stores


def aot_entries(cache: Path) -> int:
    import aot

    return len(aot.Cache(cache).entries()) if (cache / "index.sqlite").exists() else 0


def test_compile_distributed_mesh_over_both_processes(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    argv = [
        "compile", "fixtures.models:matmul", "--arg", "f32[64,512]", "--arg", "f32[512,256]",
        "--mesh", "data=4", "--in-sharding", "data,None", "--in-sharding", "", "--distributed",
        "--cache", str(cache), "--name", "slice.compiled",
    ]
    runs = run_job(argv, 2, extra={"JAX_LOG_COMPILES": "1"})
    assert [r.returncode for r in runs] == [0, 0], [r.stderr[-2000:] for r in runs]
    assert runs[0].stdout.startswith("miss: compiled and stored slice.compiled"), runs[0].stdout
    assert runs[1].stdout == ""
    # Once for the slice: process 1 (the cache read-only) waited and loaded process 0's entry.
    assert [_compiles(r) for r in runs] == [1, 0], [r.stderr[-2000:] for r in runs]

    import aot

    (entry,) = aot.Cache(cache).entries("slice.compiled")
    assert entry.manifest is not None
    # Again: process 1 loads the entry from the shared cache too; nobody compiles.
    again = run_job(argv, 2, extra={"JAX_LOG_COMPILES": "1"})
    assert [r.returncode for r in again] == [0, 0], [r.stderr[-2000:] for r in again]
    assert again[0].stdout.startswith("hit: slice.compiled was in the cache (no compile)"), again[0].stdout
    assert [_compiles(r) for r in again] == [0, 0], [r.stderr[-2000:] for r in again]


def test_a_process_that_never_joins_is_a_bounded_error(tmp_path: Path, manifest: Path) -> None:
    # Process 0 of a 2-process job whose process 1 never starts, and process 1 of another
    # whose process 0 (the coordinator) never starts: each ends within
    # AOT_DISTRIBUTED_TIMEOUT with one aot line naming who did not join, exit 1, and no
    # abort of JAX's coordination client (its deadline is past ours).
    bound = 5
    alone = {}
    start = time.monotonic()
    for pid in (0, 1):
        env = job_env(pid, 2, _free_port(), {"AOT_DISTRIBUTED_TIMEOUT": str(bound)})
        alone[pid] = subprocess.Popen(
            [sys.executable, "-m", "aot", "warmup", str(manifest), "--distributed", "--cache", str(tmp_path / f"c{pid}")],
            cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
    try:
        done = {pid: p.communicate(timeout=120) for pid, p in alone.items()}
    finally:
        for p in alone.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    elapsed = time.monotonic() - start
    assert elapsed < bound + 25, elapsed  # the start-up (imports) and the bound, not JAX's deadline
    for pid, (stdout, stderr) in done.items():
        assert alone[pid].returncode == 1, stderr
        assert stdout == ""
        (line,) = [x for x in stderr.splitlines() if x.strip()]
        assert line.startswith(f"Error: process {pid} of 2 waited 5 s (AOT_DISTRIBUTED_TIMEOUT) for the "
                               "multi-process job to start: "), stderr
        assert "Start every process of the job (JAX_PROCESS_ID 0 to 1)" in line
        assert not (tmp_path / f"c{pid}").exists()
    assert "process 1 did not connect to this process, the job's coordinator at 127.0.0.1:" in done[0][1]
    assert "the coordinator at 127.0.0.1:" in done[1][1] and "(process 0) or another process" in done[1][1]


def test_a_job_without_its_variables_says_what_to_set(tmp_path: Path, manifest: Path) -> None:
    env = job_env(0, 2, 1)
    del env["JAX_NUM_PROCESSES"], env["JAX_PROCESS_ID"], env["JAX_COORDINATOR_ADDRESS"]
    done = subprocess.run(
        [sys.executable, "-m", "aot", "warmup", str(manifest), "--cache", str(tmp_path / "c")],
        cwd=REPO, env={**env, "AOT_DISTRIBUTED": "1"}, text=True, capture_output=True, timeout=120,
    )
    assert done.returncode == 1, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.strip()]
    assert line.startswith("Error: cannot join the multi-process job"), done.stderr
    assert "JAX_COORDINATOR_ADDRESS" in line and "JAX_NUM_PROCESSES" in line
    assert not (tmp_path / "c").exists()
