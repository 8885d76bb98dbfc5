"""Executables deserialized ahead of their load.

XLA deserializes an executable outside the interpreter (the GIL is released), and for a
large program that is most of what a load costs. A caller that knows early which
verified bytes a load will deserialize (``aot.load`` guesses them from the index before
it imports what serving needs: :mod:`aot.cache.serving.read_ahead`) can start XLA on
them in a thread of its own; :func:`aot.rehydrate.load_executable` then :func:`take`\\s
the result, after all of its own checks, instead of deserializing the same bytes again.

What makes a taken result the same as the one the load would make: it was deserialized
from bytes whose sha256 is the digest the load verified, onto the same device ids of the
same backend client, through :func:`aot.jaxcompat.deserialize.deserialize_xla_executable`
(executables with host callbacks are never read ahead: theirs are bound at load time).
A failed deserialization ahead is forgotten, so the load runs XLA itself and raises its
own error. Nothing taken is ever shared: a result is handed out once.

A guess is planned (:func:`plan`) before anything runs, so that a load reaching an
executable before its turn came takes it over (:func:`take` returns None) and the
reader skips it; :func:`forget` drops whatever a caller did not take, and a result
finished after that is dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

_PLANNED = "planned"
_RUNNING = "running"
_DONE = "done"

Job = tuple[str, tuple[int, ...]]  # (executable digest, device ids)


class _Ahead:
    """One executable: planned, running (``done`` not set yet), or done."""

    __slots__ = ("backend", "done", "result", "state")

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.state = _PLANNED
        self.result: Any = None
        self.done = threading.Event()


_lock = threading.Lock()
_jobs: dict[Job, _Ahead] = {}


def job(digest: str, device_ids: Sequence[int]) -> Job:
    return digest, tuple(int(i) for i in device_ids)


def plan(jobs: Sequence[Job], backend: Any) -> list[Job]:
    """Records ``jobs`` as planned for ``backend``; returns those that were not already
    planned or running (another load's), which the caller now owns."""
    owned: list[Job] = []
    with _lock:
        for j in jobs:
            if j not in _jobs:
                _jobs[j] = _Ahead(backend)
                owned.append(j)
    return owned


def begin(j: Job) -> bool:
    """Whether the planner should deserialize ``j`` now: False when a load took it over
    or it was forgotten."""
    with _lock:
        ahead = _jobs.get(j)
        if ahead is None or ahead.state != _PLANNED:
            return False
        ahead.state = _RUNNING
        return True


def finish(j: Job, result: Any) -> None:
    """The outcome of a :func:`begin`: XLA's executable, or None when it failed."""
    with _lock:
        ahead = _jobs.get(j)
        if ahead is None:
            return  # forgotten meanwhile: dropped
        ahead.result = result
        ahead.state = _DONE
        ahead.done.set()


def take(digest: str, device_ids: Sequence[int], backend: Any) -> Any | None:
    """The executable deserialized ahead from ``digest`` onto ``device_ids`` of
    ``backend``, waiting for it if XLA is at work on it; None (the caller deserializes)
    when none was planned, it failed, or its turn has not come (it is then the caller's)."""
    j = job(digest, device_ids)
    with _lock:
        ahead = _jobs.get(j)
        if ahead is None or ahead.backend is not backend:
            return None
        if ahead.state == _PLANNED:
            del _jobs[j]
            return None
    ahead.done.wait()
    with _lock:
        if _jobs.get(j) is ahead:
            del _jobs[j]
        result, ahead.result = ahead.result, None
    if result is not None:
        log.debug("executable %s deserialized ahead of its load", digest[:12])
    return result


def forget(jobs: Sequence[Job]) -> None:
    """Drops ``jobs`` (untaken results, or planned ones not started)."""
    with _lock:
        for j in jobs:
            ahead = _jobs.pop(j, None)
            if ahead is not None:
                ahead.result = None
                ahead.done.set()  # a take() that found it running sees no result


def pending() -> list[Job]:
    """The executables planned, running or not taken yet (for tests)."""
    with _lock:
        return list(_jobs)
