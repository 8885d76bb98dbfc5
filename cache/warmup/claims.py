"""Compile once across warm-up runners without ``--shard``: compile claims.

Several ``aot warmup`` runners of one manifest into one shared cache each lower every
entry (a warm-up always lowers); before compiling one they claim its key in the
index (:meth:`~aot.cache.index.jit.IndexJit.jit_claim`, the table the jit entries'
compile-once uses). A runner that finds an entry claimed by a live holder moves on,
and comes back at the end to wait for it (:meth:`WarmupClaims.wait_for`: bounded by
``wait_seconds``); a holder's claim lasts ``claim_seconds`` past its last heartbeat
(:class:`~aot.cache.index.claim_heartbeat.ClaimHeartbeat`), so a killed holder's entries are
compiled by the others once it expires.

Every way of running a warm-up claims the same way: :func:`claim_compile` between an
item's lowering and its compile (:meth:`WarmupClaims.claim` in the warm-up's own
process; :func:`run_one` in a worker process or an executor's task),
:meth:`WarmupClaims.settle` for the deferred items at the end, and
:func:`~aot.cache.warmup.steps.store_here` gives a claim up with the stored entry.
With ``--jobs N`` and ``--isolate`` the warm-up's parent process holds the claims:
its worker processes ask it over their pipes before each compile
(:meth:`WarmupClaims.grant`); an item refused comes back
:class:`~aot.cache.warmup.steps.Deferred` and the parent waits for it at the end.
On any ``executor`` there is no pipe back to the parent: each task claims its own
compile (:func:`claiming_task`, a holder of its own with its own heartbeat), and the
parent waits for the deferred items at the end as above.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from aot.cache.index.claim_heartbeat import ClaimHeartbeat
from aot.cache.storage.locations import DATABASE, classify_location
from aot.cache.warmup.manifest import WarmupItem
from aot.cache.warmup.steps import (
    Deferred, ItemResult, Lowered, compile_lowered, load_stored, lower_here, store_here, task_cache,
)

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore

log = logging.getLogger(__name__)

__all__ = [
    "CLAIM_SECONDS", "WAIT_SECONDS", "Grant", "WarmupClaims", "claim_compile", "claiming_task", "claims_default",
    "run_one", "warmup_task",
]

#: How long a claim lasts past its holder's last heartbeat, and the longest a runner
#: waits at the end for entries another runner compiles.
CLAIM_SECONDS = 120.0
WAIT_SECONDS = 1800.0

#: Asks for the compile of a key (``grant(key, label)``): True, compile it here (it is
#: claimed for this warm-up); False, someone else compiles it (another runner, or
#: another process of this warm-up): the item is :class:`Deferred`.
Grant = Callable[[str, str], bool]
Pending = TypeVar("Pending", Lowered, Deferred)


def claims_default(cache: ArtifactStore) -> bool:
    """Claims are on by default for a shared (PostgreSQL) index (a folder cache's
    warm-up does not open SQLAlchemy to find out)."""
    if classify_location(cache.location).kind != DATABASE:
        return False
    return cache.index.dialect == "postgresql"


class WarmupClaims:
    """One warm-up's compile claims (a context manager: its heartbeat runs inside;
    every claim still held is released at its end, whatever happened).

    Thread-safe: with ``--jobs N`` the warm-up's parent process owns the one
    ``WarmupClaims``; its own compiles and its worker processes (over their pipes,
    :mod:`aot.cache.warmup.workers`) ask it for each key (:meth:`grant`); each key is
    released when its item's result comes back (:meth:`release_key`)."""

    def __init__(
        self, cache: ArtifactStore, *, claim_seconds: float = CLAIM_SECONDS, wait_seconds: float = WAIT_SECONDS,
    ) -> None:
        self.cache = cache
        self.claim_seconds = claim_seconds
        self.wait_seconds = wait_seconds
        self.holder = f"warmup {socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.heartbeat = ClaimHeartbeat(cache.index, self.holder, claim_seconds)
        self._held: set[str] = set()  # claimed in the index by this warm-up
        self._handed: set[str] = set()  # granted to the next who asks (a re-run of the item)
        self._lock = threading.Lock()

    def __enter__(self) -> WarmupClaims:
        self.heartbeat.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.heartbeat.close()
        with self._lock:
            held = set(self._held)
            self._held.clear()
            self._handed.clear()
        self.cache.index.jit_unclaim(held, self.holder)

    def _take(self, key: str) -> str | None:
        """Claims ``key`` in the index (the caller holds the lock): None, or its live holder."""
        other = self.cache.index.jit_claim(key, self.holder, self.claim_seconds)
        if other is None:
            self._held.add(key)
            self.heartbeat.hold(key)
        return other

    def grant(self, key: str, label: str | None = None) -> bool:
        """True: compile ``key`` now (claimed for this warm-up); False: another runner
        with a live claim compiles it, or another process of this warm-up does (wait
        for it at the end: :meth:`wait_for`)."""
        with self._lock:
            if key in self._handed:  # held for the re-run of its item (wait_for)
                self._handed.discard(key)
                return True
            other = "this warm-up" if key in self._held else self._take(key)
        if other is None:
            return True
        log.info("warmup: %s is being compiled by %s; coming back to it at the end", label or key[:16], other)
        return False

    def hand_on(self, key: str) -> None:
        """``key``, claimed here, is granted to the next who asks for it (an item
        lowered here and handed to a worker process, which asks again)."""
        with self._lock:
            if key in self._held:
                self._handed.add(key)

    def release_key(self, key: str) -> None:
        """Gives up the claim on ``key`` (its entry is stored, or its compile failed)."""
        with self._lock:
            self._handed.discard(key)
            if key not in self._held:
                return
            self._held.discard(key)
            self.heartbeat.drop(key)
        self.cache.index.jit_unclaim([key], self.holder)

    def claim(self, lowered: Lowered) -> ItemResult | Deferred | None:
        """:func:`claim_compile` of an item lowered in this process (a hit stored
        meanwhile gives its claim up)."""
        claimed = claim_compile(self.cache, lowered, self.grant)
        if isinstance(claimed, ItemResult):
            self.release_key(lowered.key)
        return claimed

    def wait_for(self, pending: Lowered | Deferred) -> ItemResult | None:
        """Waits for the entry of a deferred item, at most ``wait_seconds``: the hit
        another runner compiled (``waited``), or None: compile it here; the next
        :meth:`grant` of its key says so (its holder's claim expired and is now ours,
        or the wait ran out)."""
        key, deadline, delay = pending.key, time.monotonic() + self.wait_seconds, 0.1
        while True:
            stored = load_stored(self.cache, pending, waited=True)
            if stored is not None:
                return stored
            with self._lock:
                other = None if key in self._held else self._take(key)
            if other is None:
                stored = load_stored(self.cache, pending, waited=True)
                if stored is not None:
                    self.release_key(key)
                    return stored
                break
            if time.monotonic() >= deadline:
                log.warning("warmup: waited %.0f s for %s to compile %s; compiling it here",
                            self.wait_seconds, other, pending.item.label)
                break
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, 2.0)
        with self._lock:
            self._handed.add(key)
        return None

    def settle(
        self, deferred: Sequence[Pending], emit: Callable[[ItemResult], None], again: Callable[[Pending], None],
    ) -> None:
        """The deferred items, at the end, one after another: the hit another runner
        compiled goes to ``emit``; an item whose claim is now this warm-up's (its
        holder's expired, or the wait ran out) to ``again``, to compile it."""
        for pending in deferred:
            hit = self.wait_for(pending)
            if hit is not None:
                emit(hit)
            else:
                again(pending)


def claim_compile(cache: ArtifactStore, lowered: Lowered, grant: Grant) -> ItemResult | Deferred | None:
    """Asks ``grant`` for the compile of a lowered item: None, compile it (claimed);
    :class:`~aot.cache.warmup.steps.Deferred`, another holder compiles it (wait for
    it at the end); a hit, stored between the look-up and the claim (whoever granted
    the claim releases it)."""
    if not grant(lowered.key, lowered.item.label):
        return Deferred(lowered.index, lowered.item, lowered.key, lowered.seconds)
    return load_stored(cache, lowered)


def _now(fn: Callable[[], Any]) -> Future[Any]:
    """``fn()`` run here, as a finished future."""
    future: Future[Any] = Future()
    try:
        future.set_result(fn())
    except BaseException as exc:  # noqa: BLE001 - delivered by result()
        future.set_exception(exc)
    return future


def run_one(cache: ArtifactStore, index: int, item: WarmupItem, grant: Grant | None = None) -> ItemResult | Deferred:
    """One item, start to end, in this thread. ``grant``: asked before the compile
    (:func:`claim_compile`); an item it refuses is :class:`Deferred`."""
    outcome = lower_here(cache, index, item)
    if isinstance(outcome, ItemResult):
        return outcome
    claimed = claim_compile(cache, outcome, grant) if grant is not None else None
    return claimed if claimed is not None else store_here(cache, outcome, _now(lambda: compile_lowered(outcome)))


def warmup_task(
    cache_options: dict[str, Any], x64: bool, index: int, item: WarmupItem, grant: Grant | None = None,
) -> ItemResult | Deferred:
    """Compiles one item into the cache ``cache_options`` names; what an executor runs.

    A module-level function of plain data, so any executor can ship it (pickled by a
    process pool, cloudpickled by dask). Each worker process (and thread) opens the
    cache once and keeps it. ``grant`` (a worker process of ``--jobs N``: its parent's
    compile claims) is asked before the compile; an item it refuses comes back
    :class:`Deferred`.
    """
    try:
        cache = task_cache(cache_options, x64)
    except Exception as exc:  # noqa: BLE001
        return ItemResult.failed(index, item, exc)
    return run_one(cache, index, item, grant)


def claiming_task(
    cache_options: dict[str, Any], x64: bool, index: int, item: WarmupItem, claim_seconds: float,
) -> ItemResult | Deferred:
    """:func:`warmup_task` that claims its own compile: what
    an executor runs when claims are on. The task is a holder of its own (its claim
    renewed by its own heartbeat while it compiles, released when it returns); an item
    another live holder compiles comes back :class:`~aot.cache.warmup.steps.Deferred`,
    and the warm-up waits for it at the end."""
    try:
        cache = task_cache(cache_options, x64)
    except Exception as exc:  # noqa: BLE001 - reported as the item's failure
        return ItemResult.failed(index, item, exc)
    with WarmupClaims(cache, claim_seconds=claim_seconds) as claims:
        return run_one(cache, index, item, claims.grant)
