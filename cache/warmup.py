"""Running a warm-up: compile every item of a manifest into a cache, in parallel.

:func:`run_warmup` compiles :class:`WarmupItem` s into a cache (``jobs > 1``: worker
processes started with "spawn", never fork, since JAX is imported), and
:func:`coverage` lists the items a cache is missing for this environment. The
manifest format lives in :mod:`aot.cache.warmup_manifest`, target resolution in
:mod:`aot.cache.targets`; their public names are re-exported here.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Executor, ProcessPoolExecutor, as_completed, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.errors import AotError, SpecError, TargetError
from aot.cache.failures import Failure
from aot.cache.signatures import Signature
from aot.cache.targets import (
    Prepared,
    compile_item,
    compile_target,
    item_signature,
    make_mesh,
    prepare,
    resolve_args,
    resolve_target,
    search_path,
    x64_hint,
    x64_mode,
)
from aot.cache.warmup_shard import parse_shard, select_shard
from aot.cache.warmup_manifest import (
    FunctionEntry,
    WarmupItem,
    WarmupManifest,
    expand,
    load_manifest,
    parse_manifest,
    parse_mesh,
)

if TYPE_CHECKING:
    from aot.cache.cache import Cache

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
    "available_cores",
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


def _done(index: int, item: WarmupItem, entry: Any, status: str, seconds: float) -> ItemResult:
    return ItemResult(
        index, item.name, item.label, status, seconds, key=entry.key,
        signature=entry.signature, compile_seconds=entry.compile_seconds,
        raw_size=entry.raw_size, stored_size=entry.stored_size, source=item.source,
        arguments=Signature.from_manifest_json(entry.manifest, entry.signature),
    )


def _run_one(cache: Cache, index: int, item: WarmupItem) -> ItemResult:
    start = time.perf_counter()
    try:
        result = compile_item(cache, item)
    except Exception as exc:  # noqa: BLE001 - every item is tried; failures are recorded
        log.debug("warmup: %s failed", item.label, exc_info=True)
        return ItemResult.failed(index, item, exc, time.perf_counter() - start)
    return _done(index, item, result.entry, "hit" if result.hit else "compiled",
                 time.perf_counter() - start)


# ---------------------------------------------------------------- worker processes

_WORKER: dict[str, Any] = {}


def _cache_options(cache: Cache) -> dict[str, Any]:
    """How a worker process opens the same cache (signing key included)."""
    return {
        "location": cache.location,
        "signing_key": cache.signing_key,
        "require_signatures": cache.require_signatures,
        "blob_location": cache.blob_location,
    }


def _worker_init(
    env: dict[str, str], x64: bool, log_level: int, cache_options: dict[str, Any], parent_pid: int,
) -> None:
    _exit_with_parent(parent_pid)
    os.environ.update(env)
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    import jax

    jax.config.update("jax_enable_x64", x64)
    _WORKER["options"] = cache_options


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_WATCHDOG_SECONDS = 1.0


def _exit_with_parent(parent_pid: int) -> None:
    """A worker must not outlive the warm-up that started it (``kill -9`` of the CLI
    included): nothing would collect its result, and it holds CPU, memory and the
    resource tracker's pipe (so the tracker outlives everyone too).

    On Linux the kernel kills the worker when its parent dies (``PR_SET_PDEATHSIG``;
    the pool forks workers from the thread that submits, which lives until the pool
    is shut down). Everywhere, a watchdog thread exits once the parent is gone (the
    worker is re-parented, so ``getppid()`` changes).
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


def _worker_run(index: int, item: WarmupItem) -> ItemResult:
    from aot.cache.cache import Cache

    cache = _WORKER.get("cache")
    if cache is None:
        options = dict(_WORKER["options"])
        try:
            cache = _WORKER["cache"] = Cache(options.pop("location"), **options)
        except Exception as exc:  # noqa: BLE001
            return ItemResult.failed(index, item, exc)
    return _run_one(cache, index, item)


_INHERITED_ENV = ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_ENABLE_X64", "TF_CPP_MIN_LOG_LEVEL")


def _probe(cache: Cache, index: int, item: WarmupItem) -> ItemResult | None:
    """Lowers ``item`` here and loads it if the cache has it: a hit (or a failure to
    prepare or lower it) needs no worker process. ``None``: it must be compiled."""
    from aot.lowering import lower, lower_pmap

    start = time.perf_counter()
    with x64_mode(item):
        try:
            prepared = prepare(item)
            options = dict(prepared.options)
            pmap = options.pop("pmap", False)
            computation = (lower_pmap if pmap else lower)(prepared.fn, *prepared.args, **options)
            entry = cache.index.get(computation.fingerprint)
        except Exception as exc:  # noqa: BLE001 - recorded like a worker's failure
            log.debug("warmup: %s failed", item.label, exc_info=True)
            if isinstance(exc, SpecError):
                exc = x64_hint(item, exc)
            return ItemResult.failed(index, item, exc, time.perf_counter() - start)
        if entry is None or not entry.ok:
            return None
        try:
            if not computation.symbolic:  # a symbolic entry has no executable to load
                cache.load(entry)
        except AotError:
            return None  # the worker's compile_entry quarantines it and compiles again
    return _done(index, item, entry, "hit", time.perf_counter() - start)


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


def _collect(
    futures: dict[Any, tuple[int, WarmupItem]], emit: Callable[[ItemResult], None],
    broken: list[tuple[int, WarmupItem]], *, block: bool,
) -> None:
    """Emits the results of finished futures; with ``block``, waits for all of them."""
    if not block:
        for future in [f for f in futures if f.done()]:
            _emit_future(future, futures.pop(future), emit, broken)
        return
    pending = set(futures)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        for future in done:
            _emit_future(future, futures.pop(future), emit, broken)


def _emit_future(
    future: Any, pair: tuple[int, WarmupItem], emit: Callable[[ItemResult], None],
    broken: list[tuple[int, WarmupItem]],
) -> None:
    index, item = pair
    try:
        result = future.result()
    except BrokenProcessPool:
        broken.append(pair)
        return
    except Exception as exc:  # noqa: BLE001 - e.g. a result that did not pickle
        result = ItemResult.failed(index, item, exc)
    emit(result)


def _run_parallel(
    cache: Cache, items: list[WarmupItem], jobs: int, emit: Callable[[ItemResult], None]
) -> None:
    """Finds the hits here; sends the misses to ``jobs`` spawned workers.

    The pool starts a worker only when one is needed, so a fully cached run starts
    none. A worker that dies (crash, out of memory) breaks the pool: the unfinished
    items are retried in a fresh single-worker pool, in order, so the item that
    kills it is identified and every other item is still tried.
    """
    import jax

    env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
    initargs = (
        env, bool(jax.config.jax_enable_x64), logging.getLogger("aot").getEffectiveLevel(),
        _cache_options(cache), os.getpid(),
    )
    context = multiprocessing.get_context("spawn")

    def pool(workers: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_worker_init, initargs=initargs
        )

    broken: list[tuple[int, WarmupItem]] = []
    futures: dict[Any, tuple[int, WarmupItem]] = {}
    stored: dict[str, set[str]] = {}
    with pool(jobs) as executor:
        # An item with no entry of its name and input signature for this environment
        # is certainly a miss: it goes straight to a worker and is lowered only there.
        # The others are probably hits: they are lowered and looked up here (exactly,
        # by key) while the workers start.
        probable_hits = []
        for index, item in enumerate(items):
            if _maybe_stored(cache, item, stored):
                probable_hits.append((index, item))
            else:
                futures[executor.submit(_worker_run, index, item)] = (index, item)
        for index, item in probable_hits:
            result = _probe(cache, index, item)
            if result is not None:
                emit(result)
            else:
                futures[executor.submit(_worker_run, index, item)] = (index, item)
            _collect(futures, emit, broken, block=False)
        _collect(futures, emit, broken, block=True)
    while broken:
        broken.sort(key=lambda pair: pair[0])
        log.warning("warmup: a worker process died; retrying %d entries one at a time", len(broken))
        pending, broken = broken, []
        with pool(1) as executor:
            futures = {
                executor.submit(_worker_run, i, item): (i, item) for i, item in pending
            }
            _collect(futures, emit, broken, block=True)
        if broken:
            # One worker runs items in order: the first unfinished one killed it.
            broken.sort(key=lambda pair: pair[0])
            index, item = broken.pop(0)
            emit(ItemResult(
                index, item.name, item.label, "failed", 0.0, source=item.source,
                error="the worker process died while compiling it (crash or out of memory)",
            ))


def run_warmup(
    location: str | os.PathLike[str] | Cache | None,
    items: Iterable[WarmupItem],
    jobs: int = 1,
    on_result: Callable[[ItemResult], None] | None = None,
    *,
    shard: tuple[int, int] | str | None = None,
    executor: Executor | None = None,
) -> WarmupReport:
    """Compiles every item into the cache at ``location`` (hits cost no compile).

    ``jobs > 1`` compiles in that many worker processes (started with "spawn"; they
    inherit ``XLA_FLAGS`` and the x64 mode). Every item is tried; a failure is recorded
    in the report with the item and the error. ``on_result`` is called with each
    :class:`ItemResult` as it completes (in completion order); the report lists them
    in item order.

    ``shard=(i, n)`` (or ``"i/n"``, 1 <= i <= n) compiles only this runner's share of
    the items, chosen by :mod:`aot.cache.warmup_shard` (deterministic, balanced by
    estimated compile time); result indices stay the items' positions.

    ``executor`` runs the items on any :class:`concurrent.futures.Executor` instead of
    here or in ``jobs`` processes (a thread or process pool, a ``dask.distributed``
    client's ``get_executor()``, ...): each task opens the cache by its location, so
    the executor's workers must reach it. Process pools must not fork a process that
    has JAX loaded: use ``mp_context=multiprocessing.get_context("spawn")``.
    """
    from aot.cache.cache import Cache

    items = list(items)
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if executor is not None and jobs != 1:
        raise ValueError("give either jobs or executor, not both")
    cores = available_cores()
    if jobs > cores and len(items) > 1:
        log.warning(
            "--jobs %d exceeds the %d core%s available to this process: the workers will "
            "compete for them (XLA's compiler already uses several threads); --jobs %d "
            "or fewer is usually faster", jobs, cores, "s" if cores != 1 else "", cores,
        )
    start = time.perf_counter()
    cache = location if isinstance(location, Cache) else Cache(location)  # fail early
    if cache.read_only:
        from aot.errors import ReadOnlyCacheError

        raise ReadOnlyCacheError(
            f"cannot warm up the cache at {cache.display_location}: it is opened read-only; "
            "warm up a writable cache (in CI) and ship it or a bundle"
        )
    results: dict[int, ItemResult] = {}
    positions = list(range(len(items)))  # the manifest position of each item run

    def emit(result: ItemResult) -> None:
        if positions[result.index] != result.index:
            result = dataclasses.replace(result, index=positions[result.index])
        results[result.index] = result
        log.info("warmup: %s %s", result.status, result.describe())
        if on_result is not None:
            on_result(result)

    try:
        if shard is not None:
            shard = parse_shard(shard)
            chosen = select_shard(items, shard, cache)
            positions = [i for i, _ in chosen]
            items = [item for _, item in chosen]
        if executor is not None:
            _run_on_executor(cache, items, executor, emit)
        elif jobs == 1 or len(items) <= 1:
            for index, item in enumerate(items):
                emit(_run_one(cache, index, item))
        else:
            _run_parallel(cache, items, jobs, emit)
    finally:
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


def warmup_task(cache_options: dict[str, Any], x64: bool, index: int, item: WarmupItem) -> ItemResult:
    """Compiles one item into the cache ``cache_options`` names; what an executor runs.

    A module-level function of plain data, so any executor can ship it (pickled by a
    process pool, cloudpickled by dask). Each worker process (and thread) opens the
    cache once and keeps it.
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
    return _run_one(cache, index, item)


def _run_on_executor(
    cache: Cache, items: list[WarmupItem], executor: Executor, emit: Callable[[ItemResult], None]
) -> None:
    import jax

    options = _cache_options(cache)
    x64 = bool(jax.config.jax_enable_x64)
    futures = {
        executor.submit(warmup_task, options, x64, index, item): (index, item)
        for index, item in enumerate(items)
    }
    for future in as_completed(futures):
        index, item = futures[future]
        try:
            result = future.result()
        except Exception as exc:  # noqa: BLE001 - a worker that died, a task that did not ship
            result = ItemResult.failed(index, item, exc)
        emit(result)


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where there is one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ---------------------------------------------------------------- coverage


def coverage(cache: Cache, items: Iterable[WarmupItem]) -> list[WarmupItem]:
    """The items with no intact entry (same name and signature) for this environment
    (:func:`aot.cache.coverage.check_coverage` also says why each is missing)."""
    from aot.cache.coverage import check_coverage

    return [m.item for m in check_coverage(cache, items).missing]
