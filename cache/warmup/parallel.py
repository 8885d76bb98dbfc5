"""A warm-up in parallel: XLA compiles in this process and in worker processes at once.

:func:`run_parallel` keeps every process busy with the next item of the manifest: this
process lowers, compiles in a thread and stores; a dispatcher thread feeds the worker
processes of :mod:`aot.cache.warmup.workers` and passes their results on. With compile
claims the dispatcher also answers the workers' requests for a claim; the items
claimed by another runner are waited for at the end.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from aot.cache.timeouts import timeouts
from aot.cache.warmup.manifest import WarmupItem
from aot.cache.warmup.steps import Deferred, ItemResult, Lowered, compile_lowered, lower_here, store_here, task_options
from aot.cache.warmup.functions import item_environment, item_signature, x64_mode

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from aot.cache.store import ArtifactStore
    from aot.cache.warmup.claims import WarmupClaims
    from aot.cache.warmup.workers import WorkerPool

__all__ = ["run_parallel"]


def _probe(cache: ArtifactStore, index: int, item: WarmupItem) -> ItemResult | None:
    """Looks ``item`` up here (lowered): a hit (or a failure to
    prepare or lower it) needs no worker process. ``None``: it must be compiled."""
    outcome = lower_here(cache, index, item)
    return outcome if isinstance(outcome, ItemResult) else None


def _maybe_stored(cache: ArtifactStore, item: WarmupItem, stored: dict[str, set[str]]) -> bool:
    """False when no intact entry of this name and signature exists for this environment."""
    slot = f"{item.name}@{item.device_target or ''}"
    if slot not in stored:
        with x64_mode(item):
            env = item_environment(cache, item).digest
        stored[slot] = {
            e.signature for e in cache.index.by_name(item.name, env_fp=env, state="ok")
        }
    if not stored[slot]:
        return False
    try:
        return item_signature(item) in stored[slot]
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
    events: queue.SimpleQueue[tuple[str, Any]], wake: Connection, claims: WarmupClaims | None = None,
) -> None:
    """The parent's thread that keeps the workers busy: it gives each ready worker the
    next item, answers their requests for compile claims (``claims``; a worker's claim
    is released when its result or its death comes back), passes results on to
    ``events``, replaces a worker that died (at most ``target`` may fail to start), and
    returns when ``wake`` says stop. Should it fail, ``events`` gets ``("crashed",
    exception)``."""
    try:
        _dispatch_loop(pool, work, payload, target, isolate, events, wake, claims)
    except BaseException as exc:  # noqa: BLE001 - the main thread must not wait forever
        events.put(("crashed", exc))


def _dispatch_loop(
    pool: WorkerPool, work: _Work, payload: tuple[Any, ...], target: int, isolate: bool,
    events: queue.SimpleQueue[tuple[str, Any]], wake: Connection, claims: WarmupClaims | None,
) -> None:
    from multiprocessing.connection import wait as wait_for

    stopped_bound = timeouts().worker_stopped_s
    check_every = min(1.0, stopped_bound / 4)
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
        # A bound on the wait: a stopped worker never answers (see kill_stopped).
        timeout = min(hold, check_every) if waiting else (check_every if pool.workers else None)
        pool.kill_stopped(stopped_bound)
        for conn in wait_for([wake, *(w.conn for w in pool.workers)], timeout):
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
            if kind == "claim":
                granted = claims.grant(*value) if claims is not None else True
                worker.claimed = value[0] if granted else None
                pool.answer(worker, granted)
                continue
            if kind in ("result", "died") and worker.claimed is not None:
                if claims is not None:
                    claims.release_key(worker.claimed)  # stored, failed, or it died
                worker.claimed = None
            if kind == "result":
                events.put(("result", value))
            elif kind == "died":
                failed_starts += not was_ready
                if value is not None:
                    events.put(("result", _failure(value, worker.killed_because or _DIED)))


def run_parallel(
    cache: ArtifactStore, items: list[WarmupItem], jobs: int, emit: Callable[[ItemResult], None],
    *, isolate: bool, pool: WorkerPool | None, claims: WarmupClaims | None = None,
) -> None:
    """``jobs`` XLA compiles at once: one in this process and ``jobs - 1`` in worker
    processes; with ``isolate``, ``jobs`` workers and none here.

    Why processes, and this one too: XLA's compile releases the GIL, but two compiles
    in one process cost more CPU than in two processes and finished no sooner
    (benchmarks/README.md); one compile alone already keeps most of two cores busy,
    and what leaves a core idle is the Python around it (tracing, lowering,
    exporting, storing) and the start-up. So this process imports JAX while the workers
    (started first: the CLI starts them before it imports JAX) import theirs; it lowers
    its next item while its previous one compiles in a thread; and every process takes
    the next item of the manifest as soon as it is free (a thread here feeds the
    workers, also while this one traces). A manifest done before a worker is ready
    never waits for it. Without ``isolate`` a crash here ends the warm-up, as with
    ``--jobs 1``; a worker that dies fails only its item.

    With ``isolate`` this process only looks up the items that are probably stored
    (lowered) and sends the others to workers, started when the first
    one is needed: a fully cached manifest starts none.

    ``claims``: every compile, here or in a worker, is granted by this process's
    :class:`~aot.cache.warmup.claims.WarmupClaims` first; an item claimed elsewhere
    (another runner, or a process of this warm-up compiling the same key) is
    :class:`~aot.cache.warmup.steps.Deferred`, and waited for once nothing else is
    left; one whose claim then becomes ours runs again like any other item.
    """
    import multiprocessing

    import jax

    from aot.cache.warmup.workers import WorkerPool

    payload = (bool(getattr(jax.config, "jax_enable_x64")), task_options(cache), claims is not None)
    target = jobs if isolate else min(jobs - 1, len(items) - 1)  # worker processes
    if pool is None:
        pool = WorkerPool(0 if isolate else target)
    work = _Work() if isolate else _Work(enumerate(items))
    events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    wake_reader, wake_writer = multiprocessing.Pipe(duplex=False)
    dispatcher = threading.Thread(
        target=_dispatch, args=(pool, work, payload, target, isolate, events, wake_reader, claims),
        name="aot-warmup-dispatch", daemon=True,
    )
    compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aot-warmup-compile")
    lowered: Lowered | None = None  # lowered here, next to compile here
    compiling = False
    left = len(items)
    deferred: list[Deferred] = []  # claimed elsewhere: waited for at the end

    def finish(result: ItemResult) -> None:
        nonlocal left
        left -= 1
        emit(result)

    def compile_here(item: Lowered) -> None:
        nonlocal compiling
        compiling = True
        future = compiler.submit(compile_lowered, item)
        future.add_done_callback(lambda f: events.put(("compiled", (item, f))))

    def handle(kind: str, value: Any) -> None:
        nonlocal compiling, lowered
        if kind == "compiled":
            item, future = value
            compiling = False
            if lowered is not None:  # this process compiles on while it stores
                compile_here(lowered)
                lowered = None
            finish(store_here(cache, item, future, claims.release_key if claims is not None else None))
        elif kind == "crashed":
            raise RuntimeError(f"the warm-up's worker dispatcher failed: {value!r}") from value
        elif kind == "idle":
            if lowered is not None:
                # A worker is free and nothing is left but the item lowered here, which
                # waits for this process's compile: the worker starts it sooner (it
                # lowers it again: a fraction of a compile). Near the end this keeps a
                # long compile from running alone.
                if claims is not None:
                    claims.hand_on(lowered.key)  # the worker asks again
                work.put((lowered.index, lowered.item), first=True)
                wake_writer.send("work")
                lowered = None
        elif isinstance(value, Deferred):
            deferred.append(value)
        else:
            finish(value)

    def again(d: Deferred) -> None:  # its claim is ours now: granted to whoever runs it
        work.put((d.index, d.item))
        wake_writer.send("work")

    dispatcher.start()
    try:
        if isolate:
            stored: dict[str, set[str]] = {}
            for index, item in enumerate(items):
                result = _probe(cache, index, item) if _maybe_stored(cache, item, stored) else None
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
            if claims is not None and deferred and left == len(deferred):  # nothing else to wait for
                waiting = list(deferred)
                deferred.clear()
                claims.settle(waiting, finish, again)
                continue
            if not isolate and lowered is None:
                pair = work.take()
                if pair is not None:
                    outcome: ItemResult | Deferred | Lowered = lower_here(cache, *pair)
                    if claims is not None and isinstance(outcome, Lowered):
                        outcome = claims.claim(outcome) or outcome  # deferred, or stored meanwhile
                    if not isinstance(outcome, Lowered):
                        handle("result", outcome)  # a hit, a failure, or deferred
                    elif compiling:
                        lowered = outcome
                    else:
                        compile_here(outcome)
                    continue
            if left > len(deferred):  # something is running: its result comes as an event
                handle(*events.get())
    finally:
        wake_writer.send("stop")
        dispatcher.join()
        pool.close()  # closed already, unless the dispatcher failed
        compiler.shutdown(wait=True, cancel_futures=True)
        wake_reader.close()
        wake_writer.close()
