"""Compile once per slice: one process of a multi-process job compiles, the others wait.

A pod slice runs one SPMD program in many processes (``jax.distributed``); each calls
``Cache.compile`` for the same program at about the same time. A slice waits for its
slowest host, so the others compiling too saves nothing, and N writers race to store
one entry. Here the *leader* of a program (the process owning its lowest-id device,
as JAX's ``jax_share_binary_between_hosts`` chooses) does the work and publishes the
outcome in JAX's distributed key-value store; the others wait for it, bounded, then
load what it stored, or raise the error it published.

* The key waited on is the artifact key (program and environment fingerprints: equal
  in every process of the slice) and the ordinal of this request for it in this
  process, so a program compiled again in the same job never reads an old outcome.
  Every process counts every request (a hit too), and the leader publishes every
  outcome (a hit too), so the ordinals agree whatever each process found stored.
* The wait is ``AOT_SLICE_WAIT_SECONDS`` (default :data:`WAIT_SECONDS`); then
  :class:`~aot.errors.SliceTimeoutError` names the key, the leader and what to do. A
  leader that raises publishes its error first: the others raise it at once. A leader
  that dies takes JAX's coordination service with it (process 0) or stops answering:
  the others raise :class:`~aot.errors.SliceError` as soon as the store says so.
* Single-process jobs, and programs whose devices are all this process's, never touch
  the store: :func:`slice_of` is None.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from aot.errors import SliceError, SliceTimeoutError, UsageError
from aot.jaxcompat import distributed as kv

log = logging.getLogger(__name__)

__all__ = ["ENV_WAIT", "WAIT_SECONDS", "Slice", "once_per_slice", "slice_of", "wait_seconds"]

#: How long a process waits for the leader's entry. JAX's own binary sharing waits 20
#: minutes; a large program's pod compile takes minutes, and a dead leader should cost
#: less than that.
ENV_WAIT = "AOT_SLICE_WAIT_SECONDS"
WAIT_SECONDS = 600.0

T = TypeVar("T")

_OK = "ok"
_ERROR = "error:"
_requests: dict[str, int] = {}
_requests_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Slice:
    """This process's place in the job that runs a program."""

    process: int  # this process's index
    leader: int  # the process that compiles for the slice
    processes: int  # how many processes the program's devices span

    @property
    def leads(self) -> bool:
        return self.process == self.leader


def wait_seconds() -> float:
    """``AOT_SLICE_WAIT_SECONDS`` (a positive number of seconds), else the default."""
    raw = os.environ.get(ENV_WAIT, "").strip()
    if not raw:
        return WAIT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"{ENV_WAIT}={raw!r}: expected a positive number of seconds (default {WAIT_SECONDS:g})")
    return value


def slice_of(devices: Iterable[Any]) -> Slice | None:
    """The slice running a program on ``devices`` (None: one process runs it all, or
    ``jax.distributed`` is not initialized)."""
    devices = list(devices)
    if not devices or kv.client() is None:
        return None
    processes = {int(d.process_index) for d in devices}
    if len(processes) < 2:
        return None
    import jax

    leader = int(min(devices, key=lambda d: d.id).process_index)
    return Slice(int(jax.process_index()), leader, len(processes))


def _request_key(key: str) -> str:
    with _requests_lock:
        n = _requests.get(key, 0) + 1
        _requests[key] = n
    return f"aot/slice/{key}/{n}"


def once_per_slice(
    key: str, devices: Iterable[Any], *, lead: Callable[[], T], follow: Callable[[str], T],
    ready: Callable[[], T | None] = lambda: None, publish: Callable[[T], str] = lambda _: "",
    what: str = "", announce: Callable[[], str | None] = lambda: None,
) -> T:
    """``lead()`` in the leader (publishing its outcome: ``publish(result)``, a string);
    in the others ``ready()`` (what is stored already; None: nothing), else
    ``follow(published)`` once the leader succeeded. Outside a slice, just ``lead()``.
    ``what`` names the program in messages. ``announce()``, in the leader before
    ``lead()``: a string is published at once as its outcome (the others need not wait
    for it: a leader that will store nothing), and ``lead()``'s is not."""
    found = slice_of(devices)
    if found is None:
        return lead()
    token = _request_key(key)
    if not found.leads:
        stored = ready()
        if stored is not None:
            return stored
    label = f"{what} ({key})" if what else key
    if found.leads:
        early = announce()
        if early is not None:
            _publish(token, _OK + early)
            return lead()
        try:
            result = lead()
        except BaseException as exc:
            _publish(token, f"{_ERROR}{type(exc).__name__}: {exc}")
            raise
        _publish(token, _OK + publish(result))
        return result
    bound = wait_seconds()
    started = time.perf_counter()
    log.info("process %d waits for process %d to compile %s for the slice", found.process, found.leader, label)
    try:
        outcome = kv.get(token, bound)
    except kv.KeyValueTimeout:
        raise SliceTimeoutError(
            f"process {found.process} waited {bound:g} s for process {found.leader} to compile and store "
            f"{label} for the slice, and it did not: it froze, or its compile takes longer. Set {ENV_WAIT} "
            "above the compile time, or warm the cache before the job (aot warmup)",
            key=key, process=found.leader,
        ) from None
    except kv.KeyValueUnavailable as exc:
        raise SliceError(
            f"process {found.process} lost the job's coordination service while process {found.leader} "
            f"compiled {label} for the slice (that process died, or this one was cut off: {exc}); nothing "
            "of it is served unless it was stored whole. Restart the job",
            key=key, process=found.leader,
        ) from None
    if outcome.startswith(_ERROR):
        raise SliceError(
            f"process {found.leader} failed to compile {label} for the slice: {outcome[len(_ERROR):]}",
            key=key, process=found.leader,
        )
    log.info("process %d: %s stored by process %d after %.3f s", found.process, label, found.leader,
             time.perf_counter() - started)
    return follow(outcome[len(_OK):])


def _publish(token: str, value: str) -> None:
    try:
        kv.put(token, value)
    except kv.KeyValueUnavailable as exc:  # the others find out themselves, bounded
        log.warning("could not publish %s to the slice: %s", token, exc)
