"""Warm-up worker processes: started before the parent imports JAX, fed one item at a time.

``aot warmup --jobs N`` compiles in this process and in ``N - 1`` worker processes
(``--isolate``: in ``N`` workers only). A worker is a fresh Python (``spawn``, never
``fork``: the parent has JAX's threads) that imports JAX and jax-aot, says it is ready,
then runs one item at a time as the parent sends them, each from preparing and lowering
to storing, and sends back the :class:`~aot.cache.warmup.steps.ItemResult`.

With compile claims (:mod:`aot.cache.warmup.claims`) a worker asks the parent before
each compile, over the same pipe (``("claim", (key, label))``, answered ``("grant",
bool)``): the parent owns the claims, releases each when the item's result (or the
worker's death) comes back, and waits at the end for the items it refused.

Nothing here imports JAX, so the CLI starts the workers before it imports JAX itself:
their imports overlap the parent's. Each worker has its own pipe, so the parent knows
which item a worker was running when it died (a crash, the out-of-memory killer): that
item fails, the others go on.

A worker that is *stopped* (SIGSTOP, a debugger, a job-control stop; Linux ``/proc``
state ``T``/``t``) would hang the warm-up on its pipe for ever, while one that is
merely slow may be compiling for minutes: compile time has no bound, but a worker
seen stopped for longer than ``AOT_WORKER_STOPPED_TIMEOUT`` seconds
(:mod:`aot.cache.timeouts`, default 10) is killed (:meth:`WorkerPool.kill_stopped`),
and its item fails as that of a worker that died, with the reason.

A worker never outlives the warm-up that started it (``kill -9`` of the CLI included):
on Linux the kernel kills it when its parent dies (``PR_SET_PDEATHSIG``; workers are
started from the thread that runs the warm-up, which lives until they are closed), and
everywhere a watchdog thread exits once the parent is gone.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["GRANT_SECONDS", "INHERITED_ENV", "Worker", "WorkerPool", "exit_with_parent", "is_stopped"]

#: Environment variables a worker takes from the parent (set before it imports JAX).
INHERITED_ENV = ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_ENABLE_X64", "TF_CPP_MIN_LOG_LEVEL")

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_WATCHDOG_SECONDS = 1.0
_CLOSE_SECONDS = 2.0  # how long a ready worker gets to exit when told to
#: How long a worker waits for its parent to grant a compile claim; then it compiles
#: without one (the parent answers from its index in one statement).
GRANT_SECONDS = 120.0


@dataclass(eq=False)
class Worker:
    """One worker process and the parent's end of its pipe."""

    process: Any  # multiprocessing.process.BaseProcess
    conn: Connection
    ready: bool = False
    task: tuple[int, Any] | None = None  # (index, item) it is running
    sent: int = field(default=0)  # items it was given
    stopped_since: float | None = None  # monotonic time it was first seen stopped
    killed_because: str | None = None  # why this process killed it
    claimed: str | None = None  # the key whose compile claim it was granted (for its task)

    @property
    def idle(self) -> bool:
        return self.ready and self.task is None


class WorkerPool:
    """Worker processes, each fed one item at a time by the parent."""

    def __init__(self, count: int, *, log_level: int | None = None) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        self._log_level = log_level if log_level is not None else logging.getLogger("aot").getEffectiveLevel()
        self.workers: list[Worker] = []
        self.started = 0
        for _ in range(count):
            self.add()

    def add(self) -> Worker:
        """Starts one more worker (it says when it is ready)."""
        parent_conn, child_conn = self._context.Pipe()
        process = self._context.Process(
            target=_worker_main, args=(child_conn, self._env, self._log_level, os.getpid()),
            name="aot-warmup-worker", daemon=True,
        )
        process.start()
        child_conn.close()
        worker = Worker(process, parent_conn)
        self.workers.append(worker)
        self.started += 1
        return worker

    def idle(self) -> list[Worker]:
        return [w for w in self.workers if w.idle]

    @property
    def busy(self) -> bool:
        return any(w.task is not None for w in self.workers)

    def send(self, worker: Worker, index: int, item: Any, payload: tuple[Any, ...]) -> bool:
        """Gives ``worker`` an item; False when its pipe is closed (it died: the next
        :meth:`receive` says so)."""
        try:
            worker.conn.send(("task", index, item, *payload))
        except (OSError, ValueError):
            return False
        worker.task = (index, item)
        worker.sent += 1
        return True

    def answer(self, worker: Worker, granted: bool) -> None:
        """Answers the worker's ``("claim", (key, label))``: compile it, or not."""
        try:
            worker.conn.send(("grant", granted))
        except (OSError, ValueError):
            pass  # it died: the next receive says so

    def receive(self, worker: Worker) -> tuple[str, Any]:
        """The worker's next message: ``("ready", pid)``, ``("result", ItemResult |
        Deferred)``, ``("claim", (key, label))`` (answer it: :meth:`answer`), or
        ``("died", (index, item) | None)`` when its pipe closed (it is removed)."""
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            self.workers.remove(worker)
            worker.conn.close()
            worker.process.join(timeout=_CLOSE_SECONDS)
            task, worker.task = worker.task, None
            log.warning(
                "warmup: worker process %s died (exit code %s)%s", worker.process.pid,
                worker.process.exitcode, f" while running {task[1].label}" if task else "",
            )
            return "died", task
        kind, value = message
        if kind == "ready":
            worker.ready = True
        elif kind == "result":
            worker.task = None
        return kind, value

    def kill_stopped(self, bound_s: float, now: float | None = None) -> list[Worker]:
        """Kills the workers seen stopped (SIGSTOP) for ``bound_s`` seconds or more and
        returns them; their pipes then close, and :meth:`receive` says they died (with
        :attr:`Worker.killed_because`). A worker seen running again starts over."""
        now = time.monotonic() if now is None else now
        killed = []
        for worker in self.workers:
            if worker.killed_because is not None:
                continue
            pid = worker.process.pid
            if pid is None or not is_stopped(pid):
                worker.stopped_since = None
                continue
            if worker.stopped_since is None:
                worker.stopped_since = now
            if now - worker.stopped_since >= bound_s:
                worker.killed_because = f"worker {pid} was stopped (SIGSTOP) for {bound_s:g} s; killed"
                log.warning("warmup: %s", worker.killed_because)
                worker.process.kill()  # SIGKILL ends a stopped process; SIGTERM would wait
                killed.append(worker)
        return killed

    def close(self) -> None:
        """Ready, idle workers are told to exit; any other is terminated (one still
        importing JAX has nothing to finish)."""
        for worker in self.workers:
            try:
                if worker.idle:
                    worker.conn.send(None)
                else:
                    worker.process.terminate()
            except (OSError, ValueError):
                worker.process.terminate()
        deadline = time.monotonic() + _CLOSE_SECONDS
        for worker in self.workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join(timeout=_CLOSE_SECONDS)
            if worker.process.is_alive():  # a stopped process keeps SIGTERM pending
                worker.process.kill()
                worker.process.join(timeout=_CLOSE_SECONDS)
            worker.conn.close()
        self.workers.clear()


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal or traced (Linux ``/proc/PID/stat``
    state ``T`` or ``t``); False where ``/proc`` cannot tell (and for a process gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    fields = stat.rpartition(b")")[2].split()  # the command name may hold spaces and ")"
    return bool(fields) and fields[0] in (b"T", b"t")


# ---------------------------------------------------------------- in the worker


def _worker_main(conn: Connection, env: dict[str, str], log_level: int, parent_pid: int) -> None:
    exit_with_parent(parent_pid)
    os.environ.update(env)
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    from aot.libtpu_log import quiet_jax_import

    quiet_jax_import()  # as the command's own process: the CUDA plugin's start-up noise held
    import gc
    import importlib

    # As the warm-up's own start-up (aot.cli.common.State.start_up): the imports and the
    # first compile make long-lived objects, collected by none of the full collections
    # they would start; frozen, later collections walk only what the items make.
    gc.disable()
    try:
        importlib.import_module("aot.cache.store")  # imported now, not in the first item
        from aot.cache.warmup.functions import remembering_specs
        from aot.cache.warmup.claims import warmup_task
        from aot.cache.warmup.steps import ItemResult

        _warm_up()
    finally:
        gc.freeze()
        gc.enable()
    conn.send(("ready", os.getpid()))
    with remembering_specs():  # this worker serves one warm-up
        _serve(conn, ItemResult, warmup_task)


def _serve(conn: Connection, result_type: Any, task: Any) -> None:
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if message is None:
            # Everything is stored (each put commits); JAX's teardown would only keep
            # the parent waiting.
            logging.shutdown()
            os._exit(0)
        if message[0] == "grant":
            continue  # an answer that came after its wait ran out
        _, index, item, x64, options, claims = message
        grant = (lambda key, label: _ask_grant(conn, key, label)) if claims else None
        try:
            result = task(options, x64, index, item, grant)
        except Exception as exc:  # noqa: BLE001 - the parent must get an answer
            result = result_type.failed(index, item, exc)
        conn.send(("result", result))


def _ask_grant(conn: Connection, key: str, label: str) -> bool:
    """The parent's compile claim for ``key``: True, compile it; False, it is deferred."""
    conn.send(("claim", (key, label)))
    if not conn.poll(GRANT_SECONDS):
        log.warning("warmup: no compile claim for %s from the parent in %.0f s; compiling it", label, GRANT_SECONDS)
        return True
    kind, granted = conn.recv()
    return bool(granted) if kind == "grant" else True


def _warm_up() -> None:
    """The first program a process traces, lowers, compiles and exports costs it a few
    tenths of a second of one-time work (the backend, MLIR, jax.export's modules); paid
    here, before the worker says it is ready, not by the first item it is given."""
    try:
        from aot.lowering import lower

        computation = lower(lambda x: x * 2.0 + 1.0, "f32[2]", name="aot.warmup.worker")
        computation.portable_hlo(computation.compile())
    except Exception:  # noqa: BLE001 - only a head start; the items say what is wrong
        log.debug("worker warm-up failed", exc_info=True)


def exit_with_parent(parent_pid: int) -> None:
    """A worker must not outlive the warm-up that started it (``kill -9`` of the CLI included): nothing would collect
    its result, and it holds CPU, memory and the resource tracker's pipe (so the
    tracker outlives everyone too).

    On Linux the kernel kills the worker when its parent dies (``PR_SET_PDEATHSIG``).
    Everywhere, a watchdog thread exits once the parent is gone (the worker is
    re-parented, so ``getppid()`` changes).
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                log.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        except (OSError, AttributeError) as exc:
            log.debug("prctl(PR_SET_PDEATHSIG) unavailable: %s", exc)
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)
    threading.Thread(
        target=_watch_parent, args=(parent_pid,), name="aot-warmup-parent-watchdog", daemon=True
    ).start()


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(_WATCHDOG_SECONDS)
        if os.getppid() != parent_pid:
            os._exit(1)  # no cleanup to run: the parent that wanted the result is gone
