"""Loading a dispatcher's executables in background threads (``aot.load(background=True)``).

A :class:`BackgroundLoad` runs one task per signature in a small thread pool and
returns at once. XLA's deserialization of an executable releases the GIL, so the
threads overlap with whatever the serving process does meanwhile (loading its
weights) and with each other. The dispatcher makes each task take the signature's
own lock, so a call of a signature that is still loading waits for exactly that one.

The tasks never outlive their cache badly: :meth:`stop` (called by
:meth:`aot.cache.store.ArtifactStore.close`) drops the tasks not started and waits for the
running ones (an XLA deserialization cannot be interrupted), and the threads take no
task once the main thread has finished (the interpreter is exiting), so an exiting
process waits for at most the loads already running, not for the queue.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
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
    """Runs ``load(item)`` for every item in a few threads; ``load`` must not raise
    (the dispatcher keeps each signature's error for the first call of it).

    Plain non-daemon threads, not a ``ThreadPoolExecutor``: the executor's exit hook
    runs every queued task before the interpreter may exit, while these threads stop
    taking tasks once the main thread has finished (the interpreter then joins them
    after their running load; a daemon thread would be killed inside XLA instead).
    """

    def __init__(
        self, items: Sequence[T], load: Callable[[T], None], *, workers: int | None = None,
        name: str = "aot-load",
    ) -> None:
        self.workers = workers if workers is not None and workers > 0 else default_workers(len(items))
        self._load = load
        self._stopped = threading.Event()
        self._queue: queue.SimpleQueue[T] = queue.SimpleQueue()
        for item in items:
            self._queue.put(item)
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=False)
            for i in range(min(self.workers, len(items)))
        ]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while not self._stopped.is_set() and threading.main_thread().is_alive():
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            try:
                self._load(item)
            except Exception:  # a bug in the task: never lose it silently
                log.exception("a background load failed")

    @property
    def done(self) -> bool:
        """Whether every task has finished (or was dropped by :meth:`stop`)."""
        return not any(t.is_alive() for t in self._threads)

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until every task has finished; False when ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            if thread is threading.current_thread():
                continue
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self.done

    def stop(self) -> None:
        """Drops the tasks not started yet and waits for the running ones."""
        self._stopped.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
