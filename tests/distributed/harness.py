"""Runs a multi-process JAX job on loopback, as a pod slice runs on its hosts.

``run_job("tests.distributed.workers:compile_step", payload, processes=2)`` starts N
Python processes, each with 2 CPU devices (``--xla_force_host_platform_device_count=2``),
gloo collectives and ``jax.distributed.initialize`` against a coordinator on a free
loopback port; each calls the named worker function with ``payload`` (JSON) and its
JSON result comes back, one per process, in process order. The pytest process keeps
its own 8 devices: the workers are subprocesses with their own environment.

Every wait has a bound: the job as a whole (``timeout``), JAX's initialisation, the
heartbeat that declares a process dead, the end-of-job barrier; whatever is left of
the job is killed in ``finally``. A process that exits without a result (killed, or
ended by JAX's coordination service) comes back as ``ProcessResult.result is None``
with its exit code and the tail of its stderr, never as a hang.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
#: The most one test may spend in its jobs, all together (tests/distributed/conftest.py
#: starts the clock for each test): whatever hangs is killed at this bound.
TEST_SECONDS = 50.0
_deadline: float | None = None


def start_test_clock(seconds: float | None = TEST_SECONDS) -> None:
    """Every job from now on ends by ``seconds`` from now (None: each its own ``timeout``)."""
    global _deadline
    _deadline = None if seconds is None else time.monotonic() + seconds


@dataclass(frozen=True, slots=True)
class ProcessResult:
    process_id: int
    returncode: int | None  # None: killed by the harness at the job's bound
    result: dict[str, Any] | None  # the worker's JSON result (None: it wrote none)
    stderr: str  # its tail

    @property
    def error(self) -> dict[str, Any] | None:
        return None if self.result is None else self.result.get("error")

    def value(self) -> dict[str, Any]:
        """The worker's result, or an assertion naming what happened to the process."""
        assert self.result is not None, (
            f"process {self.process_id} wrote no result (exit {self.returncode}):\n{self.stderr}"
        )
        assert self.error is None, f"process {self.process_id} raised {self.error}:\n{self.stderr}"
        return self.result["value"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker: this one's, with 2 CPU devices and no accelerator."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "JAX_COORDINATOR"))}
    env.update({
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
        "AOT_ENV_RECORD": "off",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra or {})
    return env


def run_job(
    worker: str, payload: dict[str, Any] | None = None, *, processes: int = 2, timeout: float = TEST_SECONDS,
    env: dict[str, str] | None = None, env_per_process: dict[int, dict[str, str]] | None = None,
    num_processes: int | None = None,
) -> list[ProcessResult]:
    """Runs ``worker`` (``module:function``) in ``processes`` processes of one job.

    ``num_processes`` is what each process tells ``jax.distributed.initialize`` (default
    ``processes``: a wrong count is a test of its own). ``env_per_process`` adds to one
    process's environment (a pause in process 0 only)."""
    with tempfile.TemporaryDirectory(prefix="aot-dist-") as tmp:
        work = Path(tmp)
        (work / "payload.json").write_text(json.dumps(payload or {}))
        port = free_port()
        children: list[subprocess.Popen[bytes]] = []
        stderr_files = []
        try:
            for i in range(processes):
                err = open(work / f"stderr-{i}.txt", "wb")
                stderr_files.append(err)
                args = [
                    sys.executable, "-m", "tests.distributed.worker", worker, str(i),
                    str(num_processes or processes), str(port), str(work),
                ]
                child_env = worker_env({**(env or {}), **(env_per_process or {}).get(i, {})})
                children.append(subprocess.Popen(
                    args, cwd=REPO, env=child_env, stdout=subprocess.DEVNULL, stderr=err,
                    start_new_session=True,
                ))
            deadline = time.monotonic() + timeout
            if _deadline is not None:
                deadline = min(deadline, _deadline)
            codes: list[int | None] = []
            for child in children:
                try:
                    codes.append(child.wait(timeout=max(0.1, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    codes.append(None)
        finally:
            for child in children:
                if child.poll() is None:
                    try:
                        os.killpg(child.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    child.wait(timeout=10)
            for err in stderr_files:
                err.close()
        results = []
        for i, code in enumerate(codes):
            path = work / f"result-{i}.json"
            result = json.loads(path.read_text()) if path.exists() else None
            stderr = (work / f"stderr-{i}.txt").read_text(errors="replace")[-4000:]
            results.append(ProcessResult(i, code, result, stderr))
        return results


def values(results: list[ProcessResult]) -> list[dict[str, Any]]:
    """Every process's result value (an assertion error naming any that failed)."""
    return [r.value() for r in results]
