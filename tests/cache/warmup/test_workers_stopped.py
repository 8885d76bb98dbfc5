"""A stopped warm-up worker is told from a busy one (aot.cache.warmup.workers): only
one seen stopped for the whole bound is killed, with the reason its item reports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aot.cache.timeouts import timeouts
from aot.cache.warmup.workers import Worker, WorkerPool, is_stopped
from aot.errors import CacheError

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to see a stopped process")


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


def _pool_of(proc: subprocess.Popen[bytes]) -> tuple[WorkerPool, Worker]:
    pool = WorkerPool(0)
    worker = Worker(proc, conn=None, ready=True)  # type: ignore[arg-type]
    pool.workers.append(worker)
    return pool, worker


def _wait_state(pid: int, stopped: bool) -> None:
    deadline = time.monotonic() + 5
    while is_stopped(pid) != stopped:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_worker_stopped_for_the_bound_is_killed_with_the_reason(sleeper: subprocess.Popen[bytes]) -> None:
    pool, worker = _pool_of(sleeper)
    assert pool.kill_stopped(1.0, now=100.0) == []  # running: a long compile is fine
    os.kill(sleeper.pid, signal.SIGSTOP)
    _wait_state(sleeper.pid, True)
    assert pool.kill_stopped(1.0, now=200.0) == []  # first seen stopped
    assert pool.kill_stopped(1.0, now=200.9) == []
    assert pool.kill_stopped(1.0, now=201.0) == [worker]
    assert worker.killed_because == f"worker {sleeper.pid} was stopped (SIGSTOP) for 1 s; killed"
    assert sleeper.wait(timeout=5) == -signal.SIGKILL


def test_a_worker_that_runs_again_starts_its_count_over(sleeper: subprocess.Popen[bytes]) -> None:
    pool, worker = _pool_of(sleeper)
    os.kill(sleeper.pid, signal.SIGSTOP)
    _wait_state(sleeper.pid, True)
    assert pool.kill_stopped(1.0, now=10.0) == []
    os.kill(sleeper.pid, signal.SIGCONT)
    _wait_state(sleeper.pid, False)
    assert pool.kill_stopped(1.0, now=10.5) == [] and worker.stopped_since is None
    os.kill(sleeper.pid, signal.SIGSTOP)
    _wait_state(sleeper.pid, True)
    assert pool.kill_stopped(1.0, now=11.2) == []  # stopped again: counted from here
    assert sleeper.poll() is None


def test_the_bound_comes_from_the_environment() -> None:
    assert timeouts({}).worker_stopped_s == 10.0
    assert timeouts({"AOT_WORKER_STOPPED_TIMEOUT": "2.5"}).worker_stopped_s == 2.5
    with pytest.raises(CacheError, match="AOT_WORKER_STOPPED_TIMEOUT='0' is not a timeout"):
        timeouts({"AOT_WORKER_STOPPED_TIMEOUT": "0"})
