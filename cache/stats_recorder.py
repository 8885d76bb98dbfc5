"""Serving statistics, like ``sccache --show-stats``: per environment, name and signature.

What is counted (one row per environment x name x signature in the index's
``call_stats`` table):

``calls``
    calls served by an ``aot.load`` dispatcher (an exact signature, or padded up to
    a stored bucket).
``loads``, ``load_seconds``
    executables rehydrated from the cache (:meth:`~aot.cache.store.ArtifactStore.load`: a
    dispatcher's start-up, ``cache.get``, a ``cache.compile`` hit), and the time
    that took (blob reads included).
``saved_seconds``
    compile time saved: the stored compile time of each executable loaded instead
    of compiled.
``misses``, ``miss_reason``
    calls whose signature has no stored executable and no bucket to pad to (the row's
    signature is the one that missed), and what happened to the last one: not found,
    compiled from a symbolic program, compiled by the fallback.
``recompiles``, ``recompile_seconds``, ``recompile_reason``
    executables compiled from stored portable HLO, and why (another environment, a
    quarantined executable, a symbolic program bound to a concrete shape).

How, without slowing the call path: a dispatcher counts a call with one integer
increment on the program object it already holds (``program.calls += 1`` in
:meth:`aot.cache.serving.dispatcher.Dispatcher.__call__`); nothing else happens per call. Loads,
misses and recompiles are slow paths anyway: they add to a pending tally under a lock.
One flusher thread per process (:data:`FLUSH_SECONDS`), :meth:`StatsRecorder.flush`
at :meth:`Cache.close` and at exit (``weakref.finalize``) move the counts into the
index in one transaction per cache: ``call_stats`` rows are upserted (adding, so any
number of processes can share one index), and each called entry's ``hits`` grows by
its calls and its ``last_used_at`` becomes the database server's now (``aot ls``'s
HITS counts calls, and ``aot gc --older-than`` finds buckets nobody calls; a
dispatcher's own loads at start-up do not count as uses). A failed write is logged
and kept for the next flush; nothing is ever raised into the caller.

Where: the cache's own index when it is writable. A read-only cache keeps them in
memory (:meth:`StatsRecorder.report`), unless it has a local tier
(:mod:`aot.cache.tiered`), whose index (a folder this process writes anyway)
receives them.

Counting is exact for one thread; threads calling one dispatcher concurrently may
lose an increment now and then (``+=`` on an attribute is not atomic), never add one.

This module records (every serving process imports it); reading the statistics back
and ``aot stats``'s value objects are :mod:`aot.cache.stats_report`; the statements
that write them, :mod:`aot.cache.index.call_stats`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.cache.index.call_stats import COUNTERS, REASONS
from aot.cache.serving_events import StatsEvent, notify
from aot.cache.timeouts import ENVIRONMENT, Timeouts, timeouts
from aot.errors import CacheError

if TYPE_CHECKING:
    from aot.cache.index.entry import IndexEntry
    from aot.cache.stats_report import StatsReport

log = logging.getLogger(__name__)

__all__ = [
    "FALLBACK_REASON", "FLUSH_SECONDS", "COUNTERS", "REASONS", "StatsRecorder",
    "exit_timeout", "report_calls",
]

#: The miss reason of a call compiled by ``aot.load(..., fallback=fn)`` (a fallback, to listeners).
FALLBACK_REASON = "compiled by the fallback"

#: How often the flusher thread writes pending counts (seconds); None: only at
#: :meth:`StatsRecorder.flush`, :meth:`Cache.close` and exit.
FLUSH_SECONDS: float | None = 5.0

#: Distinct missed signatures a process records per name; further ones are counted
#: under :data:`OTHER_SIGNATURES` (a client sending random shapes must not fill the index).
MAX_MISSED_SIGNATURES = 100
OTHER_SIGNATURES = "(other signatures)"


def exit_timeout(env: Mapping[str, str] | None = None) -> float:
    """The bound on the last flush (at :meth:`StatsRecorder.close`, :meth:`Cache.close`
    and exit), in seconds: ``AOT_STATS_EXIT_TIMEOUT`` (:mod:`aot.cache.timeouts`)."""
    return timeouts(env).stats_exit_s


def _digest(signature: str) -> str:
    return hashlib.sha256(signature.encode()).hexdigest()


# ---------------------------------------------------------------- pending tallies


class _Tally:
    """Counts not written yet, for one (environment, name, signature)."""

    __slots__ = (*COUNTERS, *REASONS)
    # The slots, typed (each name of COUNTERS and REASONS; set in __init__).
    calls: int
    loads: int
    load_seconds: float
    saved_seconds: float
    misses: int
    recompiles: int
    recompile_seconds: float
    miss_reason: str | None
    recompile_reason: str | None

    def __init__(self) -> None:
        for name in COUNTERS:
            setattr(self, name, 0)
        for name in REASONS:
            setattr(self, name, None)

    def merge(self, other: _Tally) -> None:
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in REASONS:
            if getattr(other, name) is not None:
                setattr(self, name, getattr(other, name))

    def row(self, env_fp: str, name: str, signature: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "env_fp": env_fp, "name": name, "signature_digest": _digest(signature),
            "signature": signature,
        }
        for counter in COUNTERS:
            out[counter] = getattr(self, counter)
        for reason in REASONS:
            out[reason] = getattr(self, reason)
        return out


_Key = tuple[str, str, str]  # (env_fp, name, signature)


@dataclass(frozen=True, slots=True, eq=False)
class _Watch:
    """A dispatcher's programs, whose ``calls`` the flusher reads."""

    env_fp: str
    name: str
    programs: MutableMapping[Any, Any]


# ---------------------------------------------------------------- the recorder

_REGISTRY: weakref.WeakSet[StatsRecorder] = weakref.WeakSet()
_THREAD: threading.Thread | None = None
_THREAD_LOCK = threading.Lock()


def _flusher() -> None:
    while True:
        time.sleep(FLUSH_SECONDS or 1.0)
        if FLUSH_SECONDS is None:
            continue
        for recorder in list(_REGISTRY):
            recorder.flush()


def _start_flusher() -> None:
    global _THREAD
    with _THREAD_LOCK:
        if _THREAD is None or not _THREAD.is_alive():
            _THREAD = threading.Thread(target=_flusher, name="aot-stats-flusher", daemon=True)
            _THREAD.start()


def _after_fork_in_child() -> None:
    # The parent's pending counts are the parent's to write; recorders check the pid.
    global _THREAD
    _THREAD = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class StatsRecorder:
    """Collects one cache's statistics and writes them in batches (module docstring).

    ``sink``: a callable returning where to write (created on the first flush with
    something to write), or None to keep the statistics in memory. ``exit_seconds``:
    the bound on the last flush (None: ``AOT_STATS_EXIT_TIMEOUT``, read at close).
    """

    def __init__(self, location: str, sink: Any = None, exit_seconds: float | None = None) -> None:
        self.location = location
        self.exit_seconds = exit_seconds
        self._sink_factory = sink
        self._sink: Any = None
        # Reentrant: a dispatcher's finalizer (_unwatch) can run on this thread while
        # the lock is held, when a garbage collection happens inside flush (a
        # dispatcher in a reference cycle, freed by the collector, not by refcount).
        self._lock = threading.RLock()
        # One write at a time; held while the index is written, never by a recording call.
        self._write_lock = threading.Lock()
        self._inflight: dict[_Key, _Tally] | None = None
        self._pending: dict[_Key, _Tally] = {}
        self._touches: dict[str, int] = {}
        self._memory: dict[_Key, _Tally] = {}
        self._watches: dict[int, _Watch] = {}
        self._missed: dict[tuple[str, str], set[str]] = {}
        self._releases: dict[str, str] = {}  # name -> the release its dispatcher serves
        self._pid = os.getpid()
        self._closed = False
        self._warned = False
        _REGISTRY.add(self)

    @property
    def stored(self) -> bool:
        """Whether the statistics go to an index (else they stay in memory)."""
        return self._sink_factory is not None

    def __repr__(self) -> str:
        where = self.location if self.stored else "memory"
        return f"StatsRecorder({where!r})"

    # -- recording (slow paths only; a call is counted by the dispatcher itself) ----

    def watch(self, dispatcher: Any, programs: MutableMapping[Any, Any], env_fp: str, name: str) -> None:
        """Reads ``program.calls`` of ``programs`` (a dispatcher's) at every flush; the
        last counts when the dispatcher is garbage-collected."""
        ident = id(programs)
        with self._lock:
            self._watches[ident] = _Watch(env_fp, name, programs)
        weakref.finalize(dispatcher, self._unwatch, ident)
        _start_flusher()

    def serves(self, name: str, release: str | None) -> None:
        """A dispatcher of ``name`` serves ``release`` (None: the name's refs); events
        of ``name`` carry it (:class:`~aot.cache.serving_events.StatsEvent`)."""
        with self._lock:
            self._releases[name] = release or ""
            event = self._event("serve", name)
        notify(event)

    def _event(self, kind: str, name: str, **fields: Any) -> StatsEvent:
        return StatsEvent(kind, name, self._releases.get(name, ""), **fields)

    def _unwatch(self, ident: int) -> None:
        with self._lock:
            watch = self._watches.pop(ident, None)
            if watch is not None:
                self._collect(watch)

    def _tally(self, key: _Key) -> _Tally:
        tally = self._pending.get(key)
        if tally is None:
            tally = self._pending[key] = _Tally()
        return tally

    def loaded(self, env_fp: str, entry: IndexEntry, seconds: float) -> None:
        """An executable was loaded from the cache instead of compiled."""
        with self._lock:
            tally = self._tally((env_fp, entry.name, entry.signature))
            tally.loads += 1
            tally.load_seconds += seconds
            tally.saved_seconds += float(entry.compile_seconds or 0.0)
            event = self._event(
                "load", entry.name, seconds=seconds,
                saved_seconds=None if entry.compile_seconds is None else float(entry.compile_seconds),
            )
        notify(event)
        _start_flusher()

    def missed(self, env_fp: str, name: str, signature: str, reason: str) -> None:
        """A call found no stored executable for ``signature``."""
        with self._lock:
            seen = self._missed.setdefault((env_fp, name), set())
            if signature not in seen:
                if len(seen) >= MAX_MISSED_SIGNATURES:
                    signature = OTHER_SIGNATURES
                else:
                    seen.add(signature)
            tally = self._tally((env_fp, name, signature))
            tally.misses += 1
            tally.miss_reason = reason
            event = self._event("fallback" if reason == FALLBACK_REASON else "miss", name)
        notify(event)
        _start_flusher()

    def recompiled(
        self, env_fp: str, name: str, signature: str, reason: str, seconds: float, *, after_miss: bool = False,
    ) -> None:
        """An executable was compiled from stored portable HLO. ``after_miss``: the call
        that caused it was counted as a miss already (a symbolic program bound to a
        shape), so JAX's miss events are not recorded twice."""
        with self._lock:
            tally = self._tally((env_fp, name, signature))
            tally.recompiles += 1
            tally.recompile_seconds += seconds
            tally.recompile_reason = reason
            event = self._event("recompile", name, seconds=seconds, counts_miss=not after_miss)
        notify(event)
        _start_flusher()

    def quarantined(self, entry: IndexEntry) -> None:
        """An executable of ``entry`` was proven corrupt and refused (not in the index's
        statistics: the entry's state says it; for listeners)."""
        with self._lock:
            event = self._event("quarantine", entry.name)
        notify(event)

    def report_calls(self) -> None:
        """Moves the calls counted since the last flush into the pending tallies now,
        telling listeners (a scrape reads calls fresh, not as of the last flush)."""
        with self._lock:
            for watch in list(self._watches.values()):
                self._collect(watch)

    # -- flushing ------------------------------------------------------------------

    def _collect(self, watch: _Watch) -> None:
        """Moves the calls counted since the last flush into the pending tallies (lock held)."""
        for program in list(watch.programs.values()):
            calls = program.calls
            delta = calls - program.counted
            if delta <= 0:
                continue
            program.counted = calls
            self._tally((watch.env_fp, watch.name, program.signature)).calls += delta
            # Under the lock, as the counts move: each call reaches listeners exactly once.
            notify(self._event("calls", watch.name, count=delta))
            executable = program.executable
            key = getattr(executable, "key", None)
            if key:
                self._touches[key] = self._touches.get(key, 0) + delta

    def _snapshot(self) -> tuple[dict[_Key, _Tally], dict[str, int]] | None:
        """Takes what is pending (lock held briefly); None when there is nothing to write."""
        with self._lock:
            for watch in list(self._watches.values()):
                self._collect(watch)
            if not self._pending and not self._touches:
                return None
            pending, touches = self._pending, self._touches
            self._pending, self._touches = {}, {}
            if self._sink_factory is None or self._closed:
                _merge_into(self._memory, pending)
                return None
            self._inflight = pending
            return pending, touches

    def flush(self) -> bool:
        """Writes what was counted since the last flush; False if the write failed
        (the counts are kept for the next one). Never raises.

        The counts are taken under the recording lock and written outside it: a call
        that records a load or a miss never waits on the index (a frozen database
        holds only the writer). One write at a time per recorder (``_write_lock``)."""
        if os.getpid() != self._pid:
            return False  # a forked child: these counts are the parent's
        with self._write_lock:
            taken = self._snapshot()
            if taken is None:
                return True
            pending, touches = taken
            try:
                if self._sink is None:
                    self._sink = self._sink_factory()
                rows = [tally.row(*key) for key, tally in sorted(pending.items())]
                self._sink.write(rows, touches)
            except Exception as exc:  # noqa: BLE001 - statistics never fail the caller
                with self._lock:
                    self._inflight = None
                    _merge_into(self._pending, pending, first=True)
                    for key, n in touches.items():
                        self._touches[key] = self._touches.get(key, 0) + n
                level = logging.DEBUG if self._warned else logging.WARNING
                self._warned = True
                log.log(level, "could not record call statistics at %s (kept for the next "
                        "try): %s", self.location, exc)
                return False
            with self._lock:
                self._inflight = None
                _merge_into(self._memory, pending)
            return True

    def unflushed(self) -> int:
        """How many counts (calls, loads, misses, recompiles) are not written yet,
        including those of a write under way."""
        with self._lock:
            for watch in list(self._watches.values()):
                self._collect(watch)
            tallies = list(self._pending.values()) + list((self._inflight or {}).values())
        return sum(t.calls + t.loads + t.misses + t.recompiles for t in tallies)

    def close(self, timeout: float | None = None) -> bool:
        """Flushes within ``timeout`` seconds (default: the recorder's ``exit_seconds``,
        else ``AOT_STATS_EXIT_TIMEOUT``);
        afterwards counts stay in memory (the index is being closed). Returns False
        when the deadline passed: the unflushed counts are dropped with one warning
        naming how many, and the write left running is abandoned (a daemon thread),
        so that a process exits within the bound whatever its index does."""
        if self._closed:
            return True
        if timeout is None:
            timeout = self.exit_seconds
        if timeout is None:
            try:
                timeout = exit_timeout()
            except CacheError as exc:
                log.warning("%s; using %gs", exc, Timeouts().stats_exit_s)
                timeout = Timeouts().stats_exit_s
        done = True
        if not self.stored:
            self.flush()  # into memory: nothing to wait on
        elif os.getpid() == self._pid:
            writer = threading.Thread(target=self.flush, name="aot-stats-exit-flush", daemon=True)
            writer.start()
            writer.join(timeout)
            if writer.is_alive():
                done = False
                lost = self.unflushed()
                log.warning(
                    "dropped %d unflushed call statistics count(s) for %s: the index did not "
                    "answer within %gs (%s); the process goes on closing",
                    lost, self.location, timeout,
                    "Timeouts.stats_exit_s" if self.exit_seconds is not None else ENVIRONMENT["stats_exit_s"],
                )
        self._closed = True
        _REGISTRY.discard(self)
        return done

    # -- reading -------------------------------------------------------------------

    def report(self, name_glob: str | None = None) -> StatsReport:
        """This process's statistics (written or not), without reading the index: what
        a read-only cache without a local tier counted lives only here."""
        from aot.cache.stats_report import SignatureStats, StatsReport, ordered
        from aot.signatures import Signature

        with self._lock:
            for watch in list(self._watches.values()):
                self._collect(watch)
            totals: dict[_Key, _Tally] = {}
            _merge_into(totals, self._memory)
            _merge_into(totals, self._inflight or {})
            _merge_into(totals, self._pending)
            named = {
                (watch.name, program.signature): Signature.with_paths(program.signature, program.paths)
                for watch in self._watches.values() for program in list(watch.programs.values())
            }
        rows = [
            SignatureStats(env_fp=env, name=name, signature=signature, **_counts(tally))
            for (env, name, signature), tally in totals.items()
            if name_glob is None or fnmatch.fnmatchcase(name, name_glob)
        ]
        return StatsReport("this process", ordered(rows), stored=False, named=named)

    def zero(self, name_glob: str | None = None) -> None:
        """Forgets this process's counts (matching ``name_glob``)."""
        with self._lock:
            for watch in list(self._watches.values()):
                self._collect(watch)
            for table in (self._memory, self._pending):
                for key in [k for k in table if name_glob is None or fnmatch.fnmatchcase(k[1], name_glob)]:
                    del table[key]


def report_calls() -> None:
    """:meth:`StatsRecorder.report_calls` for every recorder of this process."""
    for recorder in list(_REGISTRY):
        recorder.report_calls()


def _merge_into(target: dict[_Key, _Tally], source: Mapping[_Key, _Tally], first: bool = False) -> None:
    for key, tally in source.items():
        if key in target:
            if first:  # the older counts' reasons give way to newer ones
                older = _Tally()
                older.merge(tally)
                older.merge(target[key])
                target[key] = older
            else:
                target[key].merge(tally)
        else:
            copy = _Tally()
            copy.merge(tally)
            target[key] = copy


def _counts(tally: _Tally) -> dict[str, Any]:
    return {name: getattr(tally, name) for name in (*COUNTERS, *REASONS)}
