"""Running a warm-up: compile every item of a manifest into a cache, in parallel.

:func:`run_warmup` compiles :class:`WarmupItem` s into a cache (``jobs > 1``: here
and in ``jobs - 1`` worker processes, :mod:`aot.cache.warmup.parallel`; ``isolate=True``:
in worker processes only), and
:func:`coverage` lists the items a cache is missing for this environment. The
manifest format lives in :mod:`aot.cache.warmup.manifest`, function resolution in
:mod:`aot.cache.warmup.functions`, one item's steps in :mod:`aot.cache.warmup.steps`,
the ``--jobs auto`` rule in
:mod:`aot.cache.warmup.jobs`; their public names are re-exported here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.errors import TargetError
from aot.cache.index.refs import RefOrigin, ReleaseMember
from aot.cache.units import counted
from aot.cache.warmup.claims import (
    CLAIM_SECONDS, WAIT_SECONDS, WarmupClaims, claiming_task, claims_default, warmup_task,
)
from aot.cache.warmup.coverage import find_uncovered
from aot.cache.warmup.jobs import JOB_MEMORY, auto_jobs, available_cores, available_memory, resolve_jobs
from aot.cache.warmup.manifest import (
    FunctionEntry,
    WarmupItem,
    WarmupManifest,
    expand,
    load_manifest,
    parse_manifest,
    parse_mesh,
)
from aot.cache.warmup.following import WarmupFollower, WarmupLeader
from aot.cache.warmup.parallel import run_parallel
from aot.cache.warmup.refresh import RefreshedExport, refresh_entries
from aot.cache.warmup.shard import parse_shard, select_shard
from aot.cache.warmup.steps import (
    SIGNATURE_WIDTH,
    Deferred,
    ItemResult,
    Lowered,
    compile_lowered,
    follow_here,
    lower_here,
    store_here,
    task_options,
)
from aot.cache.warmup.functions import (
    Prepared,
    compile_item,
    compile_function,
    item_environment,
    item_signature,
    make_mesh,
    prepare,
    remembering_specs,
    resolve_args,
    resolve_function,
    search_path,
    x64_mode,
)

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore
    from aot.cache.warmup.workers import WorkerPool

log = logging.getLogger(__name__)

__all__ = [
    "FunctionEntry",
    "ItemResult",
    "Prepared",
    "SIGNATURE_WIDTH",
    "TargetError",
    "WarmupItem",
    "WarmupManifest",
    "WarmupReport",
    "JOB_MEMORY",
    "auto_jobs",
    "available_cores",
    "available_memory",
    "compile_item",
    "compile_function",
    "coverage",
    "expand",
    "item_signature",
    "kept_notice",
    "other_releases_notice",
    "load_manifest",
    "make_mesh",
    "parse_manifest",
    "parse_mesh",
    "prepare",
    "resolve_args",
    "resolve_jobs",
    "resolve_function",
    "declare",
    "follow_warmup",
    "release_cover",
    "release_run",
    "run_warmup",
    "search_path",
    "warmup_task",
]


@dataclass(frozen=True, slots=True)
class WarmupReport:
    """What a warm-up did: one result per item run, in manifest order."""

    location: str
    jobs: int
    results: tuple[ItemResult, ...]
    seconds: float
    shard: tuple[int, int] | None = None  # (i, n): this runner's share of the manifest
    release: str | None = None
    # Members of the label's previous set this warm-up did not compile, kept in its new set.
    carried: tuple[ReleaseMember, ...] = ()
    # Those of them another JAX release compiled (docs/jax-releases.md), and those releases.
    other_releases: tuple[ReleaseMember, ...] = ()
    carried_releases: tuple[str, ...] = ()
    # --refresh-exports: the release the portable HLO was refreshed for, and each entry looked at.
    refresh_release: str | None = None
    refreshed: tuple[RefreshedExport, ...] = ()

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
    def waited(self) -> int:
        """Hits another runner compiled while this one waited for its claim."""
        return sum(1 for r in self.results if r.waited)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and all(r.refreshed for r in self.refreshed)

    @property
    def failures(self) -> tuple[ItemResult, ...]:
        return tuple(r for r in self.results if r.status == "failed")

    def summary(self) -> str:
        """One line; the members a release kept are a warning, logged once when it was
        declared (:func:`kept_notice`), not repeated here."""
        where = f" (shard {self.shard[0]}/{self.shard[1]})" if self.shard else ""
        return (
            f"{counted(len(self.results), 'entry')}{where}: {self.compiled} compiled, {self.hit} hit"
            f"{f' ({self.waited} waited for)' if self.waited else ''}, {self.failed} failed in {self.seconds:.1f}s"
            + (self.refresh_summary() if self.refresh_release is not None else "")
        )

    def refresh_summary(self) -> str:
        """``; 2 exports refreshed for jax 0.12.1`` (and how many could not be)."""
        done = sum(1 for r in self.refreshed if r.refreshed)
        failed = len(self.refreshed) - done
        return (f"; {counted(done, 'export')} refreshed for jax {self.refresh_release}"
                + (f", {failed} could not be" if failed else ""))

    def to_dict(self) -> dict[str, Any]:
        return {
            "cache": self.location,
            "jobs": self.jobs,
            "shard": f"{self.shard[0]}/{self.shard[1]}" if self.shard else None,
            "total": len(self.results),
            "compiled": self.compiled,
            "hit": self.hit,
            "waited": self.waited,
            "failed": self.failed,
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "results": [r.to_dict() for r in self.results],
            "release": self.release,
            "carried": [{"name": m.name, "signature": m.signature, "key": m.key} for m in self.carried],
            "refresh_release": self.refresh_release,
            "refreshed_exports": [r.to_dict() for r in self.refreshed],
        }


# ---------------------------------------------------------------- one after another


def _run_pipelined(
    cache: ArtifactStore, items: list[WarmupItem], emit: Callable[[ItemResult], None], claims: WarmupClaims | None = None,
) -> None:
    """``--jobs 1``: one XLA compile at a time, in a thread (XLA releases the GIL),
    while this thread lowers the next item and exports and stores the previous one;
    the Python around the compiles (tracing, lowering, exporting, storing) then costs
    no wall time where a compile takes longer. At most two executables are held.

    ``claims``: each item is claimed before its compile; one another runner holds is
    passed over, and waited for at the end (:mod:`aot.cache.warmup.claims`)."""
    compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aot-warmup-compile")
    pending: tuple[Lowered, Future[tuple[Any, float]]] | None = None
    deferred: list[Lowered] = []

    def finish(lowered: Lowered, compiled: Future[tuple[Any, float]]) -> None:
        emit(store_here(cache, lowered, compiled, claims.release_key if claims is not None else None))

    try:
        for index, item in enumerate(items):
            outcome = lower_here(cache, index, item)
            if claims is not None and isinstance(outcome, Lowered):
                claimed = claims.claim(outcome)
                if isinstance(claimed, Deferred):
                    deferred.append(outcome)  # lowered already: compiled here if its claim becomes ours
                    continue
                if claimed is not None:  # a hit stored meanwhile
                    emit(claimed)
                    continue
            if isinstance(outcome, ItemResult):
                emit(outcome)
                continue
            compiled = compiler.submit(compile_lowered, outcome)  # starts when the previous ends
            if pending is not None:
                finish(*pending)
            pending = (outcome, compiled)
        if pending is not None:
            finish(*pending)
            pending = None
        if claims is not None:  # compiled by another runner meanwhile, or ours now
            claims.settle(deferred, emit, lambda lowered: finish(lowered, compiler.submit(compile_lowered, lowered)))
    finally:
        compiler.shutdown(wait=True, cancel_futures=True)


def run_warmup(
    location: str | os.PathLike[str] | ArtifactStore | None,
    items: Iterable[WarmupItem],
    jobs: int | str = 1,
    on_result: Callable[[ItemResult], None] | None = None,
    *,
    shard: tuple[int, int] | str | None = None,
    executor: Executor | None = None,
    isolate: bool = False,
    records: bool = False,
    workers: WorkerPool | None = None,
    origin: RefOrigin | None = None,
    release: str | None = None,
    run: str | None = None,
    replace: bool = False,
    claims: bool | None = None,
    claim_seconds: float = CLAIM_SECONDS,
    wait_seconds: float = WAIT_SECONDS,
    leader: WarmupLeader | None = None,
    refresh_exports: str | None = None,
) -> WarmupReport:
    """Compiles every item into the cache at ``location`` (hits cost no compile).

    ``refresh_exports=RELEASE``: then exports again the portable HLO of every entry
    compiled or hit that JAX ``RELEASE`` would refuse or not promise to call
    (:mod:`aot.cache.warmup.refresh`), reported in the summary line.

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

    Every item is lowered (a trace may read files or environment variables no record
    can prove unchanged); a hit is a stored key, and skips only the compile.
    ``records`` is accepted and ignored (warm-up records used to skip the lowering).

    Refs: every item compiled *or hit* becomes the entry served for its (name,
    signature, environment), set in one transaction at the end (``origin``: who sets
    them; default ``warmup`` and the CI commit). ``release=LABEL`` also records them
    in a release set of that label, in the same transaction
    (:meth:`~aot.cache.index.refs_sql.IndexRefs.declare_release`); a failed declaration
    leaves the label as it was. The warm-ups of one run (same ``run``; default: the
    origin's commit, :func:`release_run`) add to one set: their shards, and several
    manifests warmed at one commit; a member of the same (name, signature, environment)
    is replaced by the newer warm-up's. A warm-up of another run opens a new set that
    keeps the members of the label's current one that none of ``items`` (the whole
    manifest, whatever ``shard``) compiles, reported as ``carried``: a second manifest
    never drops the first's members, and the next run's warm-ups replace them one
    manifest at a time. ``replace`` starts the label over with this run's entries.

    ``shard=(i, n)`` (or ``"i/n"``, 1 <= i <= n) compiles only this runner's share of
    the items, chosen by :mod:`aot.cache.warmup.shard` (deterministic, balanced by
    estimated compile time); result indices stay the items' positions.

    ``claims`` (default: on for a shared, PostgreSQL, index): runners of one manifest
    without ``shard`` compile each entry once in total: each claims an entry before its
    compile, passes over one claimed by a live runner and waits for it at the end (at
    most ``wait_seconds``); a claim lasts ``claim_seconds`` past its holder's last
    heartbeat (:mod:`aot.cache.warmup.claims`). At any ``jobs`` and with ``isolate``:
    this process holds the claims and grants each compile, its own and its worker
    processes' (:func:`~aot.cache.warmup.parallel.run_parallel`); every claim still
    held is released when the warm-up ends, whatever happens. On an ``executor`` each
    task claims its own compile (:func:`~aot.cache.warmup.claims.claiming_task`) and
    this process waits for the deferred ones at the end.

    ``executor`` runs the items on any :class:`concurrent.futures.Executor` instead of
    here or in ``jobs`` processes (a thread or process pool, a ``dask.distributed``
    client's ``get_executor()``, ...): each task opens the cache by its location, so
    the executor's workers must reach it. Process pools must not fork a process that
    has JAX loaded: use ``mp_context=multiprocessing.get_context("spawn")``.
    """
    from aot.cache.store import ArtifactStore

    items = list(items)
    manifest_items = items  # results are indexed by manifest position, whatever the shard
    jobs = resolve_jobs(jobs, entries=len(items))
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
        cache = location if isinstance(location, ArtifactStore) else ArtifactStore(location)  # fail early
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
        if leader is not None:
            leader.publish(result)
        log.info("warmup: %s %s", result.status, result.describe())
        if on_result is not None:
            on_result(result)

    covered = None
    refreshed: tuple[RefreshedExport, ...] = ()
    carried: list[ReleaseMember] = []
    releases: dict[str, str] = {}
    try:
        with remembering_specs():
            if release is not None:
                if run is None:
                    run = release_run(origin.commit if origin is not None else None, shard=shard)
                if not replace:  # the whole manifest's, whatever this runner's shard
                    covered = release_cover(cache, items)
            if shard is not None:
                shard = parse_shard(shard)
                chosen = select_shard(items, shard, cache)
                positions = [i for i, _ in chosen]
                items = [item for _, item in chosen]
            if leader is not None:
                leader.plan(positions)
            use_claims = claims_default(cache) if claims is None else claims
            with (
                WarmupClaims(cache, claim_seconds=claim_seconds, wait_seconds=wait_seconds) if use_claims
                else contextlib.nullcontext()
            ) as held:  # every claim still held is released here, whatever happened
                if executor is not None:
                    _run_on_executor(cache, items, executor, emit, held)
                elif isolate or (jobs > 1 and len(items) > 1):
                    pool, workers = workers, None
                    run_parallel(cache, items, jobs, emit, isolate=isolate, pool=pool, claims=held)
                else:
                    _run_pipelined(cache, items, emit, held)
            if refresh_exports is not None:
                refreshed = refresh_entries(cache, manifest_items, [results[i] for i in sorted(results)], refresh_exports)
        carried = declare(cache, list(results.values()), origin or RefOrigin("warmup"), release=release,
                          run=run, covered=covered)
        releases = _other_releases(cache, carried)
        if release is not None:
            _warn_kept(release, carried, releases)
    except BaseException as exc:
        if leader is not None:  # the others stop waiting for what will not come
            leader.abort(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if workers is not None:
            workers.close()
        if not isinstance(location, ArtifactStore):
            cache.close()
    ordered = tuple(results[i] for i in sorted(results))
    return WarmupReport(
        cache.display_location, jobs, ordered, time.perf_counter() - start,
        shard=shard if isinstance(shard, tuple) else None, release=release, carried=tuple(carried),
        other_releases=tuple(m for m in carried if m.key in releases),
        carried_releases=tuple(sorted(set(releases.values()))),
        refresh_release=refresh_exports, refreshed=refreshed,
    )


def _other_releases(cache: ArtifactStore, members: list[ReleaseMember]) -> dict[str, str]:
    """``{key: jax release}`` of the ``members`` another JAX release compiled (their
    manifests' environment ``jax`` part)."""
    from aot.jaxcompat.releases import same_release

    out: dict[str, str] = {}
    manifests = cache.reader.manifests({m.key for m in members}) if members else {}
    for key, text in manifests.items():
        try:
            version = json.loads(text)["environment"]["parts"]["jax"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(version, str) and not same_release(version):
            out[key] = version
    return out


def declare(
    cache: ArtifactStore, results: list[ItemResult], origin: RefOrigin, *, release: str | None = None,
    run: str | None = None, covered: Callable[[ReleaseMember], bool] | None = None,
) -> list[ReleaseMember]:
    """Sets the ref of every entry compiled or hit (and adds them to a set of
    ``release``). ``covered``: what the warm-up's manifest compiles
    (:func:`release_cover`); a new set keeps the label's other members, which are
    returned (a release is never left without members a warm-up did not mean to drop)."""
    import dataclasses as dc

    if release is not None:
        origin = dc.replace(origin, release=release)
    # Sorted: concurrent runners of one manifest (claims, no --shard) set the same refs
    # in one transaction each; one order of row locks keeps PostgreSQL from deadlocking.
    targets = sorted((r.name, r.signature, r.env_fp, r.key) for r in results
                     if r.ok and r.key is not None and r.signature is not None and r.env_fp is not None)
    if release is None:  # a fully cached warm-up whose refs already name its keys writes nothing
        current = {r.slot: r.key for name in {t[0] for t in targets} for r in cache.refs_named(name)}
        targets = [t for t in targets if current.get((t[0], t[1], t[2])) != t[3]]
        if not targets:
            return []
    if release is None:
        cache.index.set_refs(targets, origin)
        return []
    # The set and its members in one transaction, under the label lock: a declaration
    # that fails or is killed leaves the label where it was, and the shards of one run
    # land in one set whatever their order.
    carried: list[ReleaseMember] = []
    keep = None if covered is None else (lambda member: not covered(member))
    cache.index.declare_release(release, targets, origin, run=run, keep=keep, carried=carried)
    return carried


def _warn_kept(release: str, carried: Sequence[ReleaseMember], releases: dict[str, str]) -> None:
    """Says once (a warning: stderr, never the report's summary) which members of the
    label's previous set the new set kept: another JAX release's, which its hosts serve
    during a rolling upgrade, apart from those a later warm-up of this run replaces."""
    stale = [m for m in carried if m.key not in releases]
    if stale:
        log.warning("%s", kept_notice(release, stale))
    others = [m for m in carried if m.key in releases]
    if others:
        log.warning("%s", other_releases_notice(release, others, releases.values()))


def other_releases_notice(release: str, members: Sequence[ReleaseMember], versions: Iterable[str]) -> str:
    """What a warm-up says of the members of other JAX releases its new set kept."""
    return (f"release {release}: kept {counted(len(members), 'member')} of other JAX releases "
            f"({', '.join(sorted(set(versions)))}), which hosts of those releases serve")


def kept_notice(release: str, carried: Sequence[ReleaseMember]) -> str:
    """What a warm-up says of the members of the release's previous set it kept."""
    shown = ", ".join(f"{m.name} ({m.signature})" for m in carried[:3])
    more = f" and {len(carried) - 3} more" if len(carried) > 3 else ""
    return (f"release {release}: kept {counted(len(carried), 'member')} of its previous set that this "
            f"warm-up does not compile: {shown}{more} (a later warm-up of this run replaces them; "
            "--replace starts the label over)")


def release_cover(cache: ArtifactStore, items: Iterable[WarmupItem]) -> Callable[[ReleaseMember], bool]:
    """Whether a release member is one ``items`` compile (same name, signature with
    statics, and environment): a warm-up of them may replace it. An item whose
    signature cannot be resolved (it will fail, and say why) covers its name in its
    environment."""
    slots: set[tuple[str, str, str | None]] = set()
    names: set[tuple[str, str | None]] = set()
    envs: dict[tuple[str | None, bool], str | None] = {}
    for item in items:
        with x64_mode(item):
            where = (item.device_target, bool(item.x64))
            if where not in envs:
                try:
                    envs[where] = item_environment(cache, item).digest
                except Exception:  # noqa: BLE001 - no libtpu, say: its items fail and say why
                    envs[where] = None
            try:
                slots.add((item.name, item_signature(item), envs[where]))
            except Exception:  # noqa: BLE001 - the warm-up reports it with the item
                names.add((item.name, envs[where]))
    return lambda m: ((m.name, m.signature, m.env_fp) in slots or (m.name, m.env_fp) in names
                      or (m.name, None) in names or (m.name, m.signature, None) in slots)


def release_run(commit: str | None, shard: tuple[int, int] | str | None = None) -> str | None:
    """The run id the warm-ups of one CI run share, so that they declare one release
    set: the commit (the shards of a manifest, and several manifests warmed at one
    commit); None (a new set) when no commit is known and the warm-up is not sharded.
    A sharded warm-up without a commit needs ``--run``."""
    if commit is None:
        if shard is not None:
            from aot.errors import UsageError

            raise UsageError(
                "a sharded warm-up with --release needs a run id shared by its shards: give "
                "--commit SHA (or set GIT_COMMIT) or --run ID"
            )
        return None
    return f"commit {commit}"


def follow_warmup(
    cache: ArtifactStore, items: Iterable[WarmupItem], on_result: Callable[[ItemResult], None] | None = None,
) -> WarmupReport:
    """The warm-up of a process other than 0 of a multi-process job whose process 0 runs
    :func:`run_warmup` with a :class:`~aot.cache.warmup.following.WarmupLeader`: the
    items process 0 runs (its shard), each lowered here and loaded from ``cache``
    (process 0's, opened read-only once process 0 has it open); nothing is stored. Its
    report counts hits (``waited``: stored by process 0 while this one waited), items
    compiled here (the cache could not give them) and failures (process 0's, or this
    process's lowering)."""
    items = list(items)
    start = time.perf_counter()
    follower = WarmupFollower()
    results = []
    with remembering_specs():
        for position in follower.plan():
            item = items[position]
            result = follow_here(cache, position, item, functools.partial(follower.key_of, position, item.label))
            log.info("warmup: %s %s", result.status, result.describe())
            results.append(result)
            if on_result is not None:
                on_result(result)
    return WarmupReport(cache.display_location, 1, tuple(results), time.perf_counter() - start)


# ---------------------------------------------------------------- any executor


def _run_on_executor(
    cache: ArtifactStore, items: list[WarmupItem], executor: Executor, emit: Callable[[ItemResult], None],
    claims: WarmupClaims | None = None,
) -> None:
    """Every item as a task of ``executor``. ``claims``: each task claims its compile
    itself; the items another holder compiles come back deferred and are waited for
    here once every task has returned; one whose claim becomes this warm-up's (its
    holder died, or the wait ran out) runs again as a task that claims nothing (this
    process holds its claim, released with its result)."""
    import jax

    options = task_options(cache)
    x64 = bool(getattr(jax.config, "jax_enable_x64"))

    def submit(index: int, item: WarmupItem, claim: bool) -> Future[Any]:
        if claim and claims is not None:
            return executor.submit(claiming_task, options, x64, index, item, claims.claim_seconds)
        return executor.submit(warmup_task, options, x64, index, item)

    def run(futures: dict[Future[Any], tuple[int, WarmupItem]]) -> list[Deferred]:
        deferred = []
        for future in as_completed(futures):
            index, item = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # noqa: BLE001 - a worker that died, a task that did not ship
                result = ItemResult.failed(index, item, exc)
            if isinstance(result, Deferred):
                deferred.append(result)
            else:
                emit(result)
        return deferred

    def again(d: Deferred) -> None:  # its claim is this process's now
        assert claims is not None  # only claims defer
        try:
            run({submit(d.index, d.item, False): (d.index, d.item)})
        finally:
            claims.release_key(d.key)

    deferred = run({submit(index, item, True): (index, item) for index, item in enumerate(items)})
    if claims is not None:  # compiled by another holder meanwhile, or ours now
        claims.settle(deferred, emit, again)


# ---------------------------------------------------------------- coverage


def coverage(cache: ArtifactStore, items: Iterable[WarmupItem]) -> list[WarmupItem]:
    """The items with no intact entry (same name and signature) for this environment
    (:func:`aot.cache.reports.coverage.check_coverage` also says why each is missing)."""
    return [u.item for u in find_uncovered(cache, items)]
