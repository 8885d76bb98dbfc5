"""Loading a dispatcher's executables in background threads (``aot.load(background=True)``).

A :class:`BackgroundLoad` runs one task per signature in a small thread pool and
returns at once. XLA's deserialization of an executable releases the GIL, so the
threads overlap with whatever the serving process does meanwhile (loading its
weights) and with each other. The dispatcher makes each task take the signature's
own lock, so a call of a signature that is still loading waits for exactly that one.

The tasks never outlive their cache badly: :meth:`stop` (called by
:meth:`aot.cache.cache.Cache.close`) cancels the tasks not started and waits for the
running ones (an XLA deserialization cannot be interrupted), and a task that starts
after the main thread has finished (the interpreter is exiting) does nothing, so an
exiting process waits for at most the loads already running, not for the queue.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: At most this many executables are deserialized at once. More threads than cores
#: only time-slice the same work, and every load in flight holds its blob twice
#: (compressed and raw) plus XLA's copy: a handful bounds that transient memory for
#: the multi-hundred-MB executables of large models while still overlapping I/O,
#: decompression and deserialization of several signatures.
MAX_WORKERS = 4


def default_workers(tasks: int) -> int:
    """``min(MAX_WORKERS, cores, tasks)``, at least 1."""
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1, tasks))


class BackgroundLoad(Generic[T]):
    """Runs ``load(item)`` for every item in a thread pool; ``load`` must not raise
    (the dispatcher keeps each signature's error for the first call of it)."""

    def __init__(
        self, items: Sequence[T], load: Callable[[T], None], *, workers: int | None = None,
        name: str = "aot-load",
    ) -> None:
        self.workers = workers if workers is not None and workers > 0 else default_workers(len(items))
        self._load = load
        self._stopped = threading.Event()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=name)
        self._futures = [pool.submit(self._run, item) for item in items]
        # No more work: the threads exit once the queue is drained.
        pool.shutdown(wait=False)

    def _run(self, item: T) -> None:
        if self._stopped.is_set() or not threading.main_thread().is_alive():
            return  # the cache was closed, or the interpreter is exiting
        try:
            self._load(item)
        except Exception:  # noqa: BLE001 - a bug in the task: never lose it silently
            log.exception("a background load failed")

    @property
    def done(self) -> bool:
        """Whether every task has finished (or was cancelled)."""
        return all(f.done() for f in self._futures)

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until every task has finished; False when ``timeout`` passed first."""
        _, pending = concurrent.futures.wait(self._futures, timeout=timeout)
        return not pending

    def stop(self) -> None:
        """Cancels the tasks not started yet and waits for the running ones."""
        self._stopped.set()
        for future in self._futures:
            future.cancel()
        concurrent.futures.wait(self._futures)
