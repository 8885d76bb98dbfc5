"""Running a warm-up: compile every item of a manifest into a cache, in parallel.

:func:`run_warmup` compiles :class:`WarmupItem` s into a cache (``jobs > 1``: here
and in ``jobs - 1`` worker processes, :mod:`aot.cache.warmup.workers`; ``isolate=True``:
in worker processes only), and
:func:`coverage` lists the items a cache is missing for this environment. The
manifest format lives in :mod:`aot.cache.warmup.manifest`, target resolution in
:mod:`aot.cache.warmup.targets`, warm-up records in :mod:`aot.cache.warmup.records`, the
``--jobs auto`` rule in :mod:`aot.cache.warmup.jobs`; their public names are
re-exported here.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.errors import (
    CorruptArtifactError,
    IncompatibleEnvironmentError,
    SpecError,
    TargetError,
)
from aot.cache.warmup.failures import Failure
from aot.cache.warmup.jobs import JOB_MEMORY, auto_jobs, available_cores, available_memory, resolve_jobs
from aot.cache.warmup.records import RecordStore, record_id
from aot.cache.serving.signatures import Signature
from aot.cache.warmup.targets import (
    Prepared,
    compile_item,
    compile_target,
    item_signature,
    make_mesh,
    prepare,
    remembering_specs,
    resolve_args,
    resolve_target,
    search_path,
    x64_hint,
    x64_mode,
)
from aot.cache.warmup.shard import parse_shard, select_shard
from aot.cache.warmup.manifest import (
    FunctionEntry,
    WarmupItem,
    WarmupManifest,
    expand,
    load_manifest,
    parse_manifest,
    parse_mesh,
)

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from aot.cache.cache import Cache
    from aot.cache.warmup.workers import WorkerPool

log = logging.getLogger(__name__)

#: Width of the signature in a report line (both ends kept; --json has it whole).
SIGNATURE_WIDTH = 72

__all__ = [
    "FunctionEntry",
    "ItemResult",
    "Prepared",
    "TargetError",
    "WarmupItem",
    "WarmupManifest",
    "WarmupReport",
    "JOB_MEMORY",
    "auto_jobs",
    "available_cores",
    "available_memory",
    "compile_item",
    "compile_target",
    "coverage",
    "expand",
    "item_signature",
    "load_manifest",
    "make_mesh",
    "parse_manifest",
    "parse_mesh",
    "prepare",
    "resolve_args",
    "resolve_jobs",
    "resolve_target",
    "run_warmup",
    "search_path",
    "warmup_task",
]


# ---------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class ItemResult:
    """What happened to one item: ``compiled``, ``hit`` or ``failed`` (with the error)."""

    index: int
    name: str
    label: str
    status: str
    seconds: float
    key: str | None = None
    signature: str | None = None
    compile_seconds: float | None = None
    raw_size: int | None = None
    stored_size: int | None = None
    error: str | None = None
    source: str | None = None
    traceback: str | None = None  # of a failure (shown by `aot warmup --debug`)
    arguments: Signature | None = None  # the signature with pytree paths
    # False: a hit found through its warm-up record, without lowering (None: failed
    # before it was known).
    lowered: bool | None = None

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def describe(self, width: int | None = SIGNATURE_WIDTH) -> str:
        """``label (x: f32[8], ...) 0.27s``, or ``label: error`` for a failure."""
        if self.status == "failed":
            return f"{self.label}: {self.error}"
        shown = self.arguments.compact(width) if self.arguments is not None else self.signature
        return f"{self.label} ({shown}) {self.seconds:.2f}s"

    def line(self, width: int | None = SIGNATURE_WIDTH) -> str:
        """One report line: ``compiled  label (...) 0.27s`` / ``FAILED    label: error``
        (a multi-line error's further lines are indented under it)."""
        status = {"compiled": "compiled", "hit": "hit", "failed": "FAILED"}[self.status]
        first, *rest = self.describe(width).splitlines() or [""]
        return "\n".join([f"{status:<9} {first}", *(f"{'':10}{r}" for r in rest)])

    @classmethod
    def failed(
        cls, index: int, item: WarmupItem, exc: BaseException, seconds: float = 0.0
    ) -> ItemResult:
        failure = Failure.of(exc)
        return cls(
            index, item.name, item.label, "failed", seconds, error=failure.describe(),
            source=item.source, traceback=failure.traceback,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "status": self.status,
            "key": self.key,
            "signature": self.signature,
            "seconds": round(self.seconds, 4),
            "compile_seconds": self.compile_seconds,
            "raw_size": self.raw_size,
            "stored_size": self.stored_size,
            "error": self.error,
            "source": self.source,
            "arguments": self.arguments.to_list() if self.arguments is not None else None,
            "lowered": self.lowered,
            "traceback": self.traceback,
        }


@dataclass(frozen=True, slots=True)
class WarmupReport:
    location: str
    jobs: int
    results: tuple[ItemResult, ...]
    seconds: float
    shard: tuple[int, int] | None = None  # (i, n): this runner's share of the manifest

    def _count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def compiled(self) -> int:
        return self._count("compiled")

    @property
    def hit(self) -> int:
        return self._count("hit")

    @property
    def failed(self) -> int:
        return self._count("failed")

    @property
    def ok(self) -> bool:
        return self.failed == 0

    @property
    def failures(self) -> tuple[ItemResult, ...]:
        return tuple(r for r in self.results if r.status == "failed")

    def summary(self) -> str:
        where = f" (shard {self.shard[0]}/{self.shard[1]})" if self.shard else ""
        return (
            f"{len(self.results)} entries{where}: {self.compiled} compiled, {self.hit} hit, "
            f"{self.failed} failed in {self.seconds:.1f}s"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "cache": self.location,
            "jobs": self.jobs,
            "shard": f"{self.shard[0]}/{self.shard[1]}" if self.shard else None,
            "total": len(self.results),
            "compiled": self.compiled,
            "hit": self.hit,
            "failed": self.failed,
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "results": [r.to_dict() for r in self.results],
        }


def _error_text(exc: BaseException) -> str:
    return Failure.of(exc).describe()


def _done(
    index: int, item: WarmupItem, entry: Any, status: str, seconds: float, *, lowered: bool = True,
) -> ItemResult:
    return ItemResult(
        index, item.name, item.label, status, seconds, key=entry.key,
        signature=entry.signature, compile_seconds=entry.compile_seconds,
        raw_size=entry.raw_size, stored_size=entry.stored_size, source=item.source,
        arguments=Signature.from_manifest_json(entry.manifest, entry.signature), lowered=lowered,
    )


# ---------------------------------------------------------------- one item, in steps
#
# Every way of running a warm-up goes through the same three steps: _lower_here
# (prepare, warm-up record, lower, look up: a hit or a failure ends there), the XLA
# compile (inline, in this process's compile thread, or in a worker process's own
# _run_one), and _store_here (export the portable HLO, serialize, put, write the record).


@dataclass(slots=True)
class _Lowered:
    """An item lowered here that is not in the cache: it waits for its XLA compile."""

    index: int
    item: WarmupItem
    computation: Any
    rid: str | None  # its warm-up record's id
    seconds: float  # spent on it so far (prepare, lower, look up)


def _failed(index: int, item: WarmupItem, exc: BaseException, seconds: float) -> ItemResult:
    log.debug("warmup: %s failed", item.label, exc_info=exc)
    if isinstance(exc, SpecError):
        exc = x64_hint(item, exc)
    return ItemResult.failed(index, item, exc, seconds)


def _load_hit(
    cache: Cache, index: int, item: WarmupItem, entry: Any, start: float, *, lowered: bool,
) -> ItemResult | None:
    """Loads a stored entry, which checks that it is servable: the hit, or None when
    it did not load (then it is quarantined, and compiled again)."""
    try:
        if entry.exe_digest is not None:  # a symbolic entry has no executable to load
            cache.load(entry)
    except (CorruptArtifactError, IncompatibleEnvironmentError) as exc:
        cache.quarantine(entry, str(exc))
        return None
    return _done(index, item, entry, "hit", time.perf_counter() - start, lowered=lowered)


def _lower_here(cache: Cache, records: RecordStore, index: int, item: WarmupItem) -> ItemResult | _Lowered:
    """The hit (found by its record, or lowered and found by key), a failure, or the
    lowered item to compile."""
    from aot.cache.names import check_name
    from aot.lowering import lower, lower_pmap

    start = time.perf_counter()
    with x64_mode(item):
        try:
            prepared = prepare(item)
            rid = record_id(item, prepared, cache.environment.digest) if records.enabled else None
            key = records.lookup(rid)
            if key is not None:
                entry = cache.lookup(key)
                if entry is not None and entry.ok and entry.env_fp == cache.environment.digest:
                    result = _load_hit(cache, index, item, entry, start, lowered=False)
                    if result is not None:
                        return result
            options = dict(prepared.options)
            pmap = options.pop("pmap", False)
            computation = (lower_pmap if pmap else lower)(prepared.fn, *prepared.args, **options)
            check_name(computation.name)  # before an XLA compile that could not be stored
            key = computation.fingerprint
            entry = cache.lookup(key)
            if entry is not None and entry.ok:
                result = _load_hit(cache, index, item, entry, start, lowered=True)
                if result is not None:
                    records.remember(rid, key)
                    return result
            if computation.symbolic:  # nothing to compile: its portable HLO is stored
                entry = cache.put(computation)
                records.remember(rid, entry.key)
                return _done(index, item, entry, "compiled", time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - every item is tried; failures are recorded
            return _failed(index, item, exc, time.perf_counter() - start)
    return _Lowered(index, item, computation, rid, time.perf_counter() - start)


def _compile(lowered: _Lowered) -> tuple[Any, float]:
    """The XLA compile of a lowered item (in any thread: XLA releases the GIL)."""
    start = time.perf_counter()
    with x64_mode(lowered.item):
        executable = lowered.computation.compile()
    return executable, time.perf_counter() - start


def _store_here(
    cache: Cache, records: RecordStore, lowered: _Lowered, compiled: Future[tuple[Any, float]],
) -> ItemResult:
    """Exports, serializes and stores a compiled item; its result."""
    from aot.build import build_artifact

    index, item = lowered.index, lowered.item
    start = time.perf_counter()
    try:
        executable, compile_seconds = compiled.result()
        with x64_mode(item):
            artifact = build_artifact(executable, lowered.computation.portable_hlo(executable))
        entry = cache.put_artifact(artifact)
    except Exception as exc:  # noqa: BLE001
        return _failed(index, item, exc, lowered.seconds + time.perf_counter() - start)
    records.remember(lowered.rid, entry.key)
    seconds = lowered.seconds + compile_seconds + time.perf_counter() - start
    return _done(index, item, entry, "compiled", seconds)


def _now(fn: Callable[[], Any]) -> Future[Any]:
    """``fn()`` run here, as a finished future."""
    future: Future[Any] = Future()
    try:
        future.set_result(fn())
    except BaseException as exc:  # noqa: BLE001 - delivered by result()
        future.set_exception(exc)
    return future


def _run_one(cache: Cache, index: int, item: WarmupItem, records: RecordStore | None = None) -> ItemResult:
    """One item, start to end, in this thread."""
    records = records if records is not None else RecordStore(None)
    outcome = _lower_here(cache, records, index, item)
    if isinstance(outcome, ItemResult):
        return outcome
    return _store_here(cache, records, outcome, _now(lambda: _compile(outcome)))


def _run_pipelined(
    cache: Cache, items: list[WarmupItem], emit: Callable[[ItemResult], None], records: RecordStore,
) -> None:
    """``--jobs 1``: one XLA compile at a time, in a thread (XLA releases the GIL),
    while this thread lowers the next item and exports and stores the previous one;
    the Python around the compiles (tracing, lowering, exporting, storing) then costs
    no wall time where a compile takes longer. At most two executables are held."""
    compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aot-warmup-compile")
    pending: tuple[_Lowered, Future[tuple[Any, float]]] | None = None
    try:
        for index, item in enumerate(items):
            outcome = _lower_here(cache, records, index, item)
            if isinstance(outcome, ItemResult):
                emit(outcome)
                continue
            compiled = compiler.submit(_compile, outcome)  # starts when the previous ends
            if pending is not None:
                emit(_store_here(cache, records, *pending))
            pending = (outcome, compiled)
        if pending is not None:
            emit(_store_here(cache, records, *pending))
    finally:
        compiler.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------- in parallel


def _cache_options(cache: Cache) -> dict[str, Any]:
    """How a worker process opens the same cache (signing key included)."""
    return {
        "location": cache.location,
        "signing_key": cache.signing_key,
        "require_signatures": cache.require_signatures,
        "blob_location": cache.blob_location,
    }


def _probe(cache: Cache, records: RecordStore, index: int, item: WarmupItem) -> ItemResult | None:
    """Looks ``item`` up here (by its record, else lowered): a hit (or a failure to
    prepare or lower it) needs no worker process. ``None``: it must be compiled."""
    outcome = _lower_here(cache, records, index, item)
    return outcome if isinstance(outcome, ItemResult) else None


def _maybe_stored(cache: Cache, item: WarmupItem, stored: dict[str, set[str]]) -> bool:
    """False when no intact entry of this name and signature exists for this environment."""
    if item.name not in stored:
        with x64_mode(item):
            env = cache.environment.digest
        stored[item.name] = {
            e.signature for e in cache.index.by_name(item.name, env_fp=env, state="ok")
        }
    if not stored[item.name]:
        return False
    try:
        return item_signature(item) in stored[item.name]
    except Exception:  # noqa: BLE001 - the probe reports the error with the item
        return True


_DIED = "the worker process died while compiling it (crash or out of memory)"
_NO_WORKER = "no worker process could start (see the log)"


#: A worker takes an item only when nobody took one for this long (counted from when
#: this process starts on the manifest): while this process gets through quick items
#: faster than that, a worker would only make it wait at the end (a worker's first item
#: is a cold start: its module imports, the cache to open); slow items leave the queue
#: quiet soon enough.
_HOLD_S = 0.3


class _Work:
    """The items not taken yet, for this process and the workers' dispatcher thread."""

    def __init__(self, pairs: Iterable[tuple[int, WarmupItem]] = ()) -> None:
        self._pairs = collections.deque(pairs)
        self._lock = threading.Lock()
        self._taken_at = time.monotonic()

    def take(self) -> tuple[int, WarmupItem] | None:
        with self._lock:
            if not self._pairs:
                return None
            self._taken_at = time.monotonic()
            return self._pairs.popleft()

    def quiet_for(self) -> float:
        """Seconds since an item was last taken."""
        with self._lock:
            return time.monotonic() - self._taken_at

    def put(self, pair: tuple[int, WarmupItem], *, first: bool = False) -> None:
        with self._lock:
            if first:
                self._pairs.appendleft(pair)
            else:
                self._pairs.append(pair)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pairs)


def _failure(pair: tuple[int, WarmupItem], error: str) -> ItemResult:
    index, item = pair
    return ItemResult(index, item.name, item.label, "failed", 0.0, source=item.source, error=error)


def _dispatch(
    pool: WorkerPool, work: _Work, payload: tuple[Any, ...], target: int, isolate: bool,
    events: queue.SimpleQueue[tuple[str, Any]], wake: Connection,
) -> None:
    """The parent's thread that keeps the workers busy: it gives each ready worker the
    next item, passes results on to ``events``, replaces a worker that died (at most
    ``target`` may fail to start), and returns when ``wake`` says stop. Should it
    fail, ``events`` gets ``("crashed", exception)``."""
    try:
        _dispatch_loop(pool, work, payload, target, isolate, events, wake)
    except BaseException as exc:  # noqa: BLE001 - the main thread must not wait forever
        events.put(("crashed", exc))


def _dispatch_loop(
    pool: WorkerPool, work: _Work, payload: tuple[Any, ...], target: int, isolate: bool,
    events: queue.SimpleQueue[tuple[str, Any]], wake: Connection,
) -> None:
    from multiprocessing.connection import wait as wait_for

    failed_starts = 0
    asked = False  # told the main thread a worker is idle with nothing left to take
    while True:
        hold = 0.0 if isolate else _HOLD_S - work.quiet_for()
        for worker in pool.idle() if hold <= 0 else ():
            pair = work.take()
            if pair is None:
                if not asked:
                    events.put(("idle", None))
                    asked = True
                break
            asked = False
            if not pool.send(worker, *pair, payload):
                work.put(pair, first=True)  # it died; the next wait says so
        if len(work) and len(pool.workers) < target and failed_starts < target:
            pool.add()  # the first ones (isolate), or in place of one that died
        if isolate and len(work) and not pool.workers:  # none could start: fail the rest
            while (pair := work.take()) is not None:
                events.put(("result", _failure(pair, _NO_WORKER)))
        waiting = hold > 0 and len(work) and pool.idle()
        for conn in wait_for([wake, *(w.conn for w in pool.workers)], hold if waiting else None):
            if conn is wake:
                if wake.recv() == "stop":
                    # Closed from this thread: the kernel's parent-death signal of the
                    # workers it started follows this thread, so it outlives them.
                    pool.close()
                    return
                continue  # new work
            worker = next(w for w in pool.workers if w.conn is conn)
            was_ready = worker.ready
            kind, value = pool.receive(worker)
            if kind == "result":
                events.put(("result", value))
            elif kind == "died":
                failed_starts += not was_ready
                if value is not None:
                    events.put(("result", _failure(value, _DIED)))


def _run_parallel(
    cache: Cache, items: list[WarmupItem], jobs: int, emit: Callable[[ItemResult], None],
    records: RecordStore, *, isolate: bool, pool: WorkerPool | None,
) -> None:
    """``jobs`` XLA compiles at once: one in this process and ``jobs - 1`` in worker
    processes; with ``isolate``, ``jobs`` workers and none here.

    Why processes, and this one too: XLA's compile releases the GIL, but two compiles
    in one process cost about 10% more CPU than in two processes and finished no
    sooner (benchmarks/README.md); one compile alone already keeps about 1.8 of 2 cores
    busy, and what leaves a core idle is the Python around it (tracing, lowering,
    exporting, storing) and the start-up. So this process imports JAX while the workers
    (started first: the CLI starts them before it imports JAX) import theirs; it lowers
    its next item while its previous one compiles in a thread; and every process takes
    the next item of the manifest as soon as it is free (a thread here feeds the
    workers, also while this one traces). A manifest done before a worker is ready
    never waits for it. Without ``isolate`` a crash here ends the warm-up, as with
    ``--jobs 1``; a worker that dies fails only its item.

    With ``isolate`` this process only looks up the items that are probably stored
    (by record, or lowered) and sends the others to workers, started when the first
    one is needed: a fully cached manifest starts none.
    """
    import multiprocessing

    import jax

    from aot.cache.warmup.workers import WorkerPool

    payload = (bool(jax.config.jax_enable_x64), _cache_options(cache), records.enabled)
    target = jobs if isolate else min(jobs - 1, len(items) - 1)  # worker processes
    if pool is None:
        pool = WorkerPool(0 if isolate else target)
    work = _Work() if isolate else _Work(enumerate(items))
    events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    wake_reader, wake_writer = multiprocessing.Pipe(duplex=False)
    dispatcher = threading.Thread(
        target=_dispatch, args=(pool, work, payload, target, isolate, events, wake_reader),
        name="aot-warmup-dispatch", daemon=True,
    )
    compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aot-warmup-compile")
    lowered: _Lowered | None = None  # lowered here, next to compile here
    compiling = False
    left = len(items)

    def finish(result: ItemResult) -> None:
        nonlocal left
        left -= 1
        emit(result)

    def compile_here(item: _Lowered) -> None:
        nonlocal compiling
        compiling = True
        future = compiler.submit(_compile, item)
        future.add_done_callback(lambda f: events.put(("compiled", (item, f))))

    def handle(kind: str, value: Any) -> None:
        nonlocal compiling, lowered
        if kind == "compiled":
            item, future = value
            compiling = False
            if lowered is not None:  # this process compiles on while it stores
                compile_here(lowered)
                lowered = None
            finish(_store_here(cache, records, item, future))
        elif kind == "crashed":
            raise RuntimeError(f"the warm-up's worker dispatcher failed: {value!r}") from value
        elif kind == "idle":
            if lowered is not None:
                # A worker is free and nothing is left but the item lowered here, which
                # waits for this process's compile: the worker starts it sooner (it
                # lowers it again: a fraction of a compile). Near the end this keeps a
                # long compile from running alone.
                work.put((lowered.index, lowered.item), first=True)
                wake_writer.send("work")
                lowered = None
        else:
            finish(value)

    dispatcher.start()
    try:
        if isolate:
            stored: dict[str, set[str]] = {}
            for index, item in enumerate(items):
                result = _probe(cache, records, index, item) if _maybe_stored(cache, item, stored) else None
                if result is not None:
                    finish(result)
                else:
                    work.put((index, item))
                    wake_writer.send("work")
        while left:
            while True:  # results that came in meanwhile
                try:
                    handle(*events.get_nowait())
                except queue.Empty:
                    break
            if not isolate and lowered is None:
                pair = work.take()
                if pair is not None:
                    outcome = _lower_here(cache, records, *pair)
                    if isinstance(outcome, ItemResult):
                        finish(outcome)
                    elif compiling:
                        lowered = outcome
                    else:
                        compile_here(outcome)
                    continue
            if left:
                handle(*events.get())
    finally:
        wake_writer.send("stop")
        dispatcher.join()
        pool.close()  # closed already, unless the dispatcher failed
        compiler.shutdown(wait=True, cancel_futures=True)
        wake_reader.close()
        wake_writer.close()


def run_warmup(
    location: str | os.PathLike[str] | Cache | None,
    items: Iterable[WarmupItem],
    jobs: int | str = 1,
    on_result: Callable[[ItemResult], None] | None = None,
    *,
    shard: tuple[int, int] | str | None = None,
    executor: Executor | None = None,
    isolate: bool = False,
    records: bool = True,
    workers: WorkerPool | None = None,
) -> WarmupReport:
    """Compiles every item into the cache at ``location`` (hits cost no compile).

    ``jobs`` XLA compiles run at once (``"auto"``: :func:`auto_jobs`): one in this
    process and ``jobs - 1`` in worker processes (started with "spawn"; they inherit
    ``XLA_FLAGS`` and the x64 mode), each process taking the next item when it is free.
    ``isolate=True`` compiles in ``jobs`` worker processes only: a worker that crashes
    or is killed for memory fails only the item it was compiling. ``workers``: a
    :class:`~aot.cache.warmup.workers.WorkerPool` started earlier (the CLI starts it
    before it imports JAX); it is closed at the end. Every item is tried; a failure is
    recorded in the report with the item and the error. ``on_result`` is called with
    each :class:`ItemResult` as it completes (in completion order); the report lists
    them in item order.

    ``records`` (on by default; folder caches): an item whose warm-up record proves
    it unchanged is looked up by its recorded key without lowering
    (:mod:`aot.cache.warmup.records` has the rule and the safety argument);
    ``records=False`` lowers every item.

    ``shard=(i, n)`` (or ``"i/n"``, 1 <= i <= n) compiles only this runner's share of
    the items, chosen by :mod:`aot.cache.warmup.shard` (deterministic, balanced by
    estimated compile time); result indices stay the items' positions.

    ``executor`` runs the items on any :class:`concurrent.futures.Executor` instead of
    here or in ``jobs`` processes (a thread or process pool, a ``dask.distributed``
    client's ``get_executor()``, ...): each task opens the cache by its location, so
    the executor's workers must reach it. Process pools must not fork a process that
    has JAX loaded: use ``mp_context=multiprocessing.get_context("spawn")``.
    """
    from aot.cache.cache import Cache

    items = list(items)
    jobs = resolve_jobs(jobs)
    if executor is not None and (jobs != 1 or isolate or workers is not None):
        raise ValueError("give either jobs or executor, not both")
    cores = available_cores()
    if jobs > cores and len(items) > 1:
        log.warning(
            "--jobs %d exceeds the %d core%s available to this process: the compiles will "
            "compete for them (XLA's compiler already uses several threads); --jobs %d "
            "or fewer is usually faster", jobs, cores, "s" if cores != 1 else "", cores,
        )
    start = time.perf_counter()
    try:
        cache = location if isinstance(location, Cache) else Cache(location)  # fail early
        if cache.read_only:
            from aot.errors import ReadOnlyCacheError

            raise ReadOnlyCacheError(
                f"cannot warm up the cache at {cache.display_location}: it is opened "
                "read-only; warm up a writable cache (in CI) and ship it or a bundle"
            )
    except BaseException:
        if workers is not None:
            workers.close()
        raise
    results: dict[int, ItemResult] = {}
    positions = list(range(len(items)))  # the manifest position of each item run

    def emit(result: ItemResult) -> None:
        if positions[result.index] != result.index:
            result = dataclasses.replace(result, index=positions[result.index])
        results[result.index] = result
        log.info("warmup: %s %s", result.status, result.describe())
        if on_result is not None:
            on_result(result)

    store = RecordStore.for_cache(cache, enabled=records)
    try:
        with remembering_specs():
            if shard is not None:
                shard = parse_shard(shard)
                chosen = select_shard(items, shard, cache)
                positions = [i for i, _ in chosen]
                items = [item for _, item in chosen]
            if executor is not None:
                _run_on_executor(cache, items, executor, emit, records)
            elif isolate or (jobs > 1 and len(items) > 1):
                pool, workers = workers, None
                _run_parallel(cache, items, jobs, emit, store, isolate=isolate, pool=pool)
            else:
                _run_pipelined(cache, items, emit, store)
    finally:
        if workers is not None:
            workers.close()
        if not isinstance(location, Cache):
            cache.close()
    ordered = tuple(results[i] for i in sorted(results))
    return WarmupReport(
        cache.display_location, jobs, ordered, time.perf_counter() - start,
        shard=shard if isinstance(shard, tuple) else None,
    )


# ---------------------------------------------------------------- any executor

_TASK_CACHES: dict[tuple[Any, ...], Cache] = {}
_TASK_LOCK = threading.Lock()


def warmup_task(
    cache_options: dict[str, Any], x64: bool, index: int, item: WarmupItem, records: bool = True,
) -> ItemResult:
    """Compiles one item into the cache ``cache_options`` names; what an executor runs.

    A module-level function of plain data, so any executor can ship it (pickled by a
    process pool, cloudpickled by dask). Each worker process (and thread) opens the
    cache once and keeps it. ``records``: use and write warm-up records.
    """
    import jax

    from aot.cache.cache import Cache

    if bool(jax.config.jax_enable_x64) != x64:
        jax.config.update("jax_enable_x64", x64)
    key = (os.getpid(), threading.get_ident(), repr(sorted(cache_options.items())))
    with _TASK_LOCK:
        cache = _TASK_CACHES.get(key)
    if cache is None:
        options = dict(cache_options)
        try:
            cache = Cache(options.pop("location"), **options)
        except Exception as exc:  # noqa: BLE001
            return ItemResult.failed(index, item, exc)
        with _TASK_LOCK:
            _TASK_CACHES[key] = cache
    return _run_one(cache, index, item, RecordStore.for_cache(cache, enabled=records))


def _run_on_executor(
    cache: Cache, items: list[WarmupItem], executor: Executor, emit: Callable[[ItemResult], None],
    records: bool,
) -> None:
    import jax

    options = _cache_options(cache)
    x64 = bool(jax.config.jax_enable_x64)
    futures = {
        executor.submit(warmup_task, options, x64, index, item, records): (index, item)
        for index, item in enumerate(items)
    }
    for future in as_completed(futures):
        index, item = futures[future]
        try:
            result = future.result()
        except Exception as exc:  # noqa: BLE001 - a worker that died, a task that did not ship
            result = ItemResult.failed(index, item, exc)
        emit(result)


# ---------------------------------------------------------------- coverage


def coverage(cache: Cache, items: Iterable[WarmupItem]) -> list[WarmupItem]:
    """The items with no intact entry (same name and signature) for this environment
    (:func:`aot.cache.reports.coverage.check_coverage` also says why each is missing)."""
    from aot.cache.reports.coverage import check_coverage

    return [m.item for m in check_coverage(cache, items).missing]
