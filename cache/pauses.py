"""Named points in the storage protocols, where race tests pause or kill a process.

The writer (:meth:`aot.cache.store.ArtifactStore.put_artifact`) and gc
(:func:`aot.cache.admin.maintenance.collect_garbage`) call :func:`reached` at each step of
the protocol described in docs/reliability.md. Nothing happens unless a test set a
hook (:func:`set_hook`, in-process) or the environment variable ``AOT_TEST_PAUSE``
(child processes)::

    AOT_TEST_PAUSE="gc.locked=touch:/tmp/at+wait:/tmp/go,put.leased=kill"

Each ``POINT=ACTION[+ACTION...]``: ``kill`` (SIGKILL this process), ``sleep:SECONDS``,
``touch:PATH`` (create a file: "I am here"), ``wait:PATH`` (until the file exists).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["ENV", "POINTS", "reached", "set_hook"]

ENV = "AOT_TEST_PAUSE"

#: Every point, in protocol order (writer, then gc).
POINTS = (
    "put.start",  # nothing done yet
    "put.leased",  # leases committed; blobs not checked or written
    "put.blobs_ready",  # every blob durable; index transaction not begun
    "put.before_commit",  # inside the index transaction: row written, leases released, not committed
    "put.committed",  # row committed
    "copy.start",  # push/pull, a batch of entries (cache/admin/copy_batches.py): nothing done yet
    "copy.leased",  # the batch's leases committed; blobs not checked or copied
    "copy.blobs_ready",  # every blob of the batch durable; no row of the batch committed
    "copy.committed",  # the batch's rows committed
    "stats.flushing",  # a folder cache's statistics flush: rows written in its transaction, not committed
    "refs.recorded",  # a ref change in its history (its seq taken), the ref not written yet
    "gc.planned",  # plan made; nothing deleted
    "gc.rows_deleted",  # victim rows deleted; no blob deleted
    "gc.locked",  # inside the deletion lock: deletable blobs selected, none deleted
    "gc.deleted",  # inside the lock: the batch's blobs deleted, not committed
    "gc.done",  # every batch committed
    "jit.missed",  # aot.jax_cache: a jit key missed in the index; its compile not claimed yet
    "jit.claimed",  # aot.jax_cache: this process claimed a jit key's compile; not compiled yet
    "serve.loading",  # aot.load: one signature's executable about to load (eager or background)
    "warmup.compiling",
    "slice.compiling",  # Cache.compile: a miss, about to compile (in a slice: the leader, the others waiting)  # aot warmup: an entry's XLA compile starts (its compile claim, if any, taken)
)

Hook = Callable[[str], None]

_hook: Hook | None = None


def reached(point: str) -> None:
    """Called by the protocols at ``point``; free when no hook is set."""
    hook = _hook
    if hook is not None:
        hook(point)


def set_hook(hook: Hook | None) -> Hook | None:
    """Installs ``hook`` (None removes it); returns the previous one."""
    global _hook
    previous, _hook = _hook, hook
    return previous


def _action(spec: str) -> Callable[[], None]:
    verb, _, arg = spec.partition(":")
    if verb == "kill":
        return lambda: os.kill(os.getpid(), signal.SIGKILL)
    if verb == "sleep":
        seconds = float(arg)
        return lambda: time.sleep(seconds)
    if verb == "touch":
        return lambda: Path(arg).touch()
    if verb == "wait":

        def wait() -> None:
            while not os.path.exists(arg):
                time.sleep(0.005)

        return wait
    raise ValueError(f"{ENV}: unknown action {spec!r} (kill, sleep:S, touch:PATH, wait:PATH)")


def _from_environment(text: str) -> Hook:
    plan: dict[str, list[Callable[[], None]]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        point, _, actions = item.partition("=")
        if point not in POINTS:
            raise ValueError(f"{ENV}: unknown point {point!r}; points: {', '.join(POINTS)}")
        plan[point] = [_action(a) for a in actions.split("+")]

    def hook(point: str) -> None:
        for act in plan.get(point, ()):
            act()

    return hook


if os.environ.get(ENV):
    _hook = _from_environment(os.environ[ENV])
