"""Joining a multi-process job (``jax.distributed``) from a command, and agreeing on
its outcome: every process of a slice runs the command, one writes and reports.

:func:`join` calls :func:`jax.distributed.initialize` before JAX's backend starts,
with JAX's own cluster detection (SLURM, Open MPI, Kubernetes, Cloud TPU, mpi4py) or
``JAX_COORDINATOR_ADDRESS`` (read by JAX) with ``JAX_NUM_PROCESSES`` and
``JAX_PROCESS_ID`` (read here: JAX itself reads neither). The returned
:class:`JobProcess` publishes this process's outcome in JAX's distributed key-value
store (the one ``jax_share_binary_between_hosts`` uses) and gathers everyone's, each
wait bounded by ``AOT_DISTRIBUTED_TIMEOUT`` seconds: a process that fails, dies or
freezes makes every other one fail with its name within the bound, never hang.

``AOT_DISTRIBUTED=1`` asks the same as ``--distributed`` (a launcher that sets the
environment of every process once: a SLURM script, a Kubernetes JobSet).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from aot.errors import DistributedJobError
from aot.jaxcompat import distributed as kv

log = logging.getLogger(__name__)

DISTRIBUTED_ENV = "AOT_DISTRIBUTED"
TIMEOUT_ENV = "AOT_DISTRIBUTED_TIMEOUT"
#: Seconds: long enough for the slowest process's imports and a large compile on a busy
#: host, short enough that a CI job whose process died fails within minutes.
DEFAULT_TIMEOUT = 600.0
_TRUE = ("1", "true", "yes", "on")
_PREFIX = "aot/job"


def requested(flag: bool) -> bool:
    """``--distributed``, else ``AOT_DISTRIBUTED`` (1, true, yes, on)."""
    return flag or os.environ.get(DISTRIBUTED_ENV, "").strip().lower() in _TRUE


def job_timeout() -> float:
    """``AOT_DISTRIBUTED_TIMEOUT`` in seconds (default 600): the bound of every wait."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise DistributedJobError(
            f"{TIMEOUT_ENV} must be a number of seconds > 0, got {text!r}; unset it for "
            f"the default ({DEFAULT_TIMEOUT:.0f} s)"
        )
    return value


def _int_variable(name: str) -> int | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise DistributedJobError(f"{name} must be an integer, got {text!r}") from None


@dataclass(frozen=True, slots=True)
class Outcome:
    """One process's outcome of a step: ``ok``, and a one-line ``message`` otherwise."""

    process_id: int
    ok: bool
    message: str = ""

    def describe(self) -> str:
        return f"process {self.process_id}: {'ok' if self.ok else self.message}"


@dataclass(frozen=True, slots=True)
class JobProcess:
    """This process in a multi-process job: its id, the job's size, the wait bound."""

    process_id: int
    process_count: int
    timeout: float

    @property
    def primary(self) -> bool:
        """Process 0: the one that writes the cache and reports for the job."""
        return self.process_id == 0

    def describe(self) -> str:
        return f"process {self.process_id} of {self.process_count}"

    def publish(self, step: str, ok: bool, message: str = "") -> None:
        """Tells every process this one's outcome of ``step`` (once per step)."""
        value = "ok" if ok else "failed:" + " ".join(message.split())[:2000]
        try:
            kv.put(f"{_PREFIX}/{step}/{self.process_id}", value)
        except kv.KeyValueUnavailable as exc:
            raise DistributedJobError(f"cannot tell the job this process's outcome of {step}: {exc}") from None

    def outcome_of(self, step: str, process_id: int) -> Outcome:
        """``process_id``'s outcome of ``step``, waiting at most :attr:`timeout` seconds
        (a process that gave none in time is a failure that says so)."""
        try:
            value = kv.get(f"{_PREFIX}/{step}/{process_id}", self.timeout)
        except (kv.KeyValueTimeout, kv.KeyValueUnavailable) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return Outcome(process_id, False, (
                f"no outcome of {step} within {self.timeout:g} s ({TIMEOUT_ENV}): the process "
                f"died, froze or is still working ({first[:200]})"
            ))
        ok = value == "ok"
        return Outcome(process_id, ok, "" if ok else value.removeprefix("failed:"))

    def gather(self, step: str) -> list[Outcome]:
        """Every process's outcome of ``step`` (this one's published first), waiting at
        most :attr:`timeout` seconds in all; a process that gave none in time is a
        failure that says so (it died, froze or is still compiling)."""
        import time

        deadline = time.monotonic() + self.timeout
        out = []
        for pid in range(self.process_count):
            try:
                value = kv.get(f"{_PREFIX}/{step}/{pid}", max(0.001, deadline - time.monotonic()))
            except (kv.KeyValueTimeout, kv.KeyValueUnavailable) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                out.append(Outcome(pid, False, (
                    f"no outcome of {step} within {self.timeout:g} s ({TIMEOUT_ENV}): the process "
                    f"died, froze or is still working ({first[:200]})"
                )))
                continue
            ok = value == "ok"
            out.append(Outcome(pid, ok, "" if ok else value.removeprefix("failed:")))
        return out


def join(timeout: float | None = None) -> JobProcess:
    """Initialises ``jax.distributed`` for this process (before the backend starts) and
    returns it as a :class:`JobProcess`. JAX's cluster detection fills in what the
    environment leaves unset; an error says what was missing and how to give it."""
    import jax

    from aot.jaxcompat.runtime import backend_started, distributed_process

    timeout = job_timeout() if timeout is None else timeout
    joined = distributed_process()
    if joined is not None:  # the manifest's code, or a caller, joined already
        return JobProcess(joined[0], joined[1], timeout)
    if backend_started():
        raise DistributedJobError(
            "cannot join the multi-process job: JAX's backend already started in this process; "
            "jax.distributed.initialize must come first (run the command in a fresh process)"
        )
    num_processes = _int_variable("JAX_NUM_PROCESSES")
    process_id = _int_variable("JAX_PROCESS_ID")
    failure = _connect(jax, num_processes, process_id, timeout)
    if failure is not None:
        first = str(failure).strip().splitlines()[0] if str(failure).strip() else type(failure).__name__
        raise DistributedJobError(
            f"cannot join the multi-process job: {first[:300]}. Expected a cluster JAX detects "
            "(SLURM, Open MPI, Kubernetes, Cloud TPU) or JAX_COORDINATOR_ADDRESS=HOST:PORT with "
            "JAX_NUM_PROCESSES and JAX_PROCESS_ID set in every process"
        ) from None
    # Read without starting the backend: a warm-up for device targets only keeps this
    # host's accelerator closed (aot.targets.compile_only_here).
    process_id, num_processes = distributed_process() or (0, 1)
    job = JobProcess(process_id, num_processes, timeout)
    log.info("joined the multi-process job as %s", job.describe())
    return job


def _connect(jax: Any, num_processes: int | None, process_id: int | None, timeout: float) -> BaseException | None:
    """``jax.distributed.initialize``, bounded by ``timeout``: its error (None: joined).

    JAX's client cannot be cancelled while it connects, and at its own deadline it ends
    the process with a fatal error (a native stack, exit 134). So it connects in a
    thread, with JAX's deadline well past ``timeout``; when ``timeout`` passes first, the
    client is abandoned (:func:`aot.jaxcompat.distributed.abandon`) and a
    :class:`DistributedJobError` names who did not join: the process must end then
    (the command line does), before JAX's deadline."""
    import threading

    seconds = max(1, int(timeout))
    outcome: list[BaseException | None] = []

    def initialize() -> None:
        try:
            jax.distributed.initialize(
                num_processes=num_processes, process_id=process_id,
                # Past this process's own bound: that one ends the join, with a message.
                initialization_timeout=seconds + max(60, seconds),
                heartbeat_timeout_seconds=min(100, seconds), shutdown_timeout_seconds=seconds,
            )
            outcome.append(None)
        except (ValueError, TypeError, RuntimeError) as exc:
            outcome.append(exc)

    joining = threading.Thread(target=initialize, name="aot-join", daemon=True)
    joining.start()
    joining.join(timeout)
    if outcome:
        return outcome[0]
    kv.abandon()
    found_id, found_count, address = kv.joining()
    pid = found_id if found_id is not None else process_id
    count = found_count if found_count is not None else num_processes
    raise DistributedJobError(not_joined(pid, count, address, timeout))


def not_joined(process_id: int | None, count: int | None, address: str | None, timeout: float) -> str:
    """One line: who did not join within ``timeout``, and what to do."""
    me = f"process {process_id}" if process_id is not None else "this process"
    of = f" of {count}" if count is not None else ""
    at = f" at {address}" if address else ""
    if process_id == 0 and count is not None:
        others = [str(i) for i in range(1, count)]
        missing = (f"process {others[0]}" if len(others) == 1
                   else f"one or more of processes {', '.join(others)}")
        who = f"{missing} did not connect to this process, the job's coordinator{at}"
    else:
        who = f"the coordinator{at} (process 0) or another process of the job did not join"
    ids = f" (JAX_PROCESS_ID 0 to {count - 1})" if count is not None else ""
    return (
        f"{me}{of} waited {timeout:g} s ({TIMEOUT_ENV}) for the multi-process job to start: {who}. "
        f"Start every process of the job{ids} with the same JAX_COORDINATOR_ADDRESS and "
        f"JAX_NUM_PROCESSES (or under one cluster JAX detects), or raise {TIMEOUT_ENV} if they start later"
    )
