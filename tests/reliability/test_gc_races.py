"""gc against writers: deterministic races, clock skew, and kill -9 at every step.

The protocol (docs/reliability.md, "gc and writers"): a writer leases its digests in
the index before it checks or writes the blobs, and releases the lease in the
transaction that commits its row; gc deletes a blob only inside the index's deletion
lock, after re-checking there that no row references it and no live lease claims it.
The invariant: a committed row never names a missing blob.

Every test runs on the four shared-cache backends: SQLite + blob folder, PostgreSQL
with blobs in the database, PostgreSQL + blob folder, PostgreSQL + S3 (a moto server:
the fleet's configuration). Pauses come from the named
points of :mod:`aot.cache.pauses` (a hook in this process; ``kill`` in a child).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aot.cache import pauses
from aot.cache.cache import Cache
from tests.reliability.helpers import check_scaled

BACKENDS = [
    "sqlite-folder",
    pytest.param("postgresql-db", marks=pytest.mark.postgres),
    pytest.param("postgresql-folder", marks=pytest.mark.postgres),
    pytest.param("postgresql-s3", marks=pytest.mark.postgres),
]

WRITER_POINTS = tuple(p for p in pauses.POINTS if p.startswith("put."))
GC_POINTS = tuple(p for p in pauses.POINTS if p.startswith("gc."))


@dataclass
class Backend:
    """Fresh caches of one backend, opened as separate processes would open them."""

    kind: str
    root: Path
    postgres_url: str | None = None
    s3_url: str | None = None
    generation: int = 0
    opened: list[Cache] = field(default_factory=list)

    @property
    def location(self) -> str:
        if self.kind == "sqlite-folder":
            return str(self.root / f"cache{self.generation}")
        assert self.postgres_url is not None
        return self.postgres_url

    @property
    def blob_location(self) -> str | None:
        if self.kind == "postgresql-s3":
            return f"{self.s3_url}{self.generation}"  # a fresh prefix per reset
        return str(self.root / f"blobs{self.generation}") if self.kind == "postgresql-folder" else None

    def open(self) -> Cache:
        cache = Cache(self.location, blob_location=self.blob_location)
        self.opened.append(cache)
        return cache

    def reset(self) -> None:
        """An empty cache: a new folder (SQLite), or every table emptied (PostgreSQL)."""
        self.close_all()
        self.generation += 1
        if self.postgres_url is not None:
            from aot.cache.index.schema import METADATA

            engine = sa.create_engine(self.postgres_url)
            try:
                with engine.begin() as conn:
                    for table in reversed(METADATA.sorted_tables):
                        if table.name != "schema_version" and sa.inspect(conn).has_table(table.name):
                            conn.execute(table.delete())
            finally:
                engine.dispose()

    def close_all(self) -> None:
        for cache in self.opened:
            cache.close()
        self.opened.clear()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    kind = request.param
    url = request.getfixturevalue("postgres_url") if kind.startswith("postgresql") else None
    s3 = request.getfixturevalue("s3_url") if kind == "postgresql-s3" else None
    b = Backend(kind, tmp_path, url, s3)
    try:
        yield b
    finally:
        b.close_all()


def assert_no_row_without_its_blobs(cache: Cache) -> None:
    """The invariant: every committed ok row's blobs are there, intact."""
    report = cache.verify(quarantine=False)
    assert report.problems == (), report.to_dict()
    for entry in cache.entries():
        if entry.ok:
            for digest in (entry.exe_digest, entry.hlo_digest):
                if digest:
                    assert cache.blobs.check(digest) is None, (entry.key[:12], digest[:12])


# ---------------------------------------------------------------- pausing threads


class Pauser:
    """The pause hook: each actor stops at its point (first arrival) until released."""

    def __init__(self, stops: dict[str, str]) -> None:
        self.stops = stops  # point -> actor
        self.arrived = {actor: threading.Event() for actor in stops.values()}
        self.go = {actor: threading.Event() for actor in stops.values()}

    def __call__(self, point: str) -> None:
        actor = self.stops.get(point)
        if actor is not None and not self.go[actor].is_set():
            self.arrived[actor].set()
            assert self.go[actor].wait(120), f"{actor} was never released from {point}"

    def release(self, actor: str) -> None:
        self.go[actor].set()


class Actor(threading.Thread):
    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        super().__init__(name=name, daemon=True)
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def race(
    backend: Backend, artifact: Any, writer_at: str, gc_at: str, first: str,
    gc: Callable[[Cache], Any] = lambda c: c.gc(),
    gc_arrives: bool = False,
) -> tuple[Actor, Actor]:
    """A writer stores ``artifact`` while gc runs; each stops at its point, then one is
    released, then (after it finished or blocked) the other. ``gc_arrives``: gc cannot
    block before its point, so it is waited for however loaded the machine is."""
    writer_cache, gc_cache = backend.open(), backend.open()
    pauser = Pauser({writer_at: "writer", gc_at: "gc"})
    previous = pauses.set_hook(pauser)
    try:
        writer = Actor("writer", lambda: writer_cache.put_artifact(artifact))
        collector = Actor("gc", lambda: gc(gc_cache))
        writer.start()
        assert pauser.arrived["writer"].wait(30), "the writer never reached " + writer_at
        collector.start()
        # gc may block before its point (on the lock a paused writer's transaction holds)
        if gc_arrives:
            assert pauser.arrived["gc"].wait(60), "gc never reached " + gc_at
        else:
            pauser.arrived["gc"].wait(0.3)
        actors = {"writer": writer, "gc": collector}
        second = "gc" if first == "writer" else "writer"
        pauser.release(first)
        actors[first].join(0.3)  # finished, or blocked on the other
        pauser.release(second)
        for actor in actors.values():
            actor.join(120)
            assert not actor.is_alive(), f"{actor.name} is stuck"
    finally:
        pauses.set_hook(previous)
    return writer, collector


def evictable(backend: Backend, artifact: Any) -> str:
    """A fresh cache holding ``artifact``'s entry, quarantined, so gc evicts it."""
    backend.reset()
    cache = backend.open()
    entry = cache.put_artifact(artifact)
    cache.index.quarantine(entry.key, "test: evict me")
    return entry.key


# ---------------------------------------------------------------- the scenario


def test_gc_paused_before_deleting_while_a_writer_stores_the_evicted_entry_again(
    backend: Backend, tiny: Any
) -> None:
    """gc evicts an entry (LRU) and, before it deletes the blobs, a writer
    stores the same entry again: it finds the blobs present, writes nothing and commits
    its row. On the old code gc then deleted both blobs under the committed row."""
    artifact = tiny.by_size[5]
    backend.reset()
    seed = backend.open()
    entry = seed.put_artifact(artifact)
    writer_cache, gc_cache = backend.open(), backend.open()
    pauser = Pauser({"gc.rows_deleted": "gc"})
    previous = pauses.set_hook(pauser)
    try:
        collector = Actor("gc", lambda: gc_cache.gc(max_size=0))  # evicts everything
        collector.start()
        assert pauser.arrived["gc"].wait(30)
        assert gc_cache.index.get(entry.key) is None  # evicted; its blobs not deleted yet
        stored = writer_cache.put_artifact(artifact)  # finds both blobs, writes none
        assert stored.exe_digest == entry.exe_digest
        pauser.release("gc")
        collector.join(60)
    finally:
        pauses.set_hook(previous)
    assert collector.error is None, collector.error
    assert entry.exe_digest not in collector.result.blobs
    cache = backend.open()
    assert cache.index.get(entry.key).ok
    assert_no_row_without_its_blobs(cache)
    check_scaled(cache.load(entry.key), 5)


# ---------------------------------------------------------------- every step, both orders


@pytest.mark.slow
def test_every_pause_of_writer_and_gc_in_both_orders(backend: Backend, tiny: Any) -> None:
    """A writer stores an entry gc is evicting (a quarantined row it heals); the writer
    stops at each of its steps and gc at each of its, and either is released first:
    5 x 5 x 2 interleavings. In every one both succeed, the healed row stays, and no
    committed row lacks a blob."""
    artifact = tiny.by_size[6]
    outcomes: dict[str, int] = {}
    for writer_at in WRITER_POINTS:
        for gc_at in GC_POINTS:
            for first in ("writer", "gc"):
                key = evictable(backend, artifact)
                writer, collector = race(backend, artifact, writer_at, gc_at, first)
                label = f"{writer_at} / {gc_at} / {first} first"
                assert writer.error is None, (label, writer.error)
                assert collector.error is None, (label, collector.error)
                cache = backend.open()
                healed = cache.index.get(key)
                assert healed is not None and healed.ok, label
                assert_no_row_without_its_blobs(cache)
                what = "gc evicted the row first" if collector.result.entries else "the healed row was kept"
                outcomes[what] = outcomes.get(what, 0) + 1
    print(backend.kind, outcomes)
    assert sum(outcomes.values()) == 50
    assert len(outcomes) == 2  # both orders of the row write and the eviction happened
    check_scaled(backend.open().load(key), 6)


# ---------------------------------------------------------------- an expired lease


def test_a_writer_whose_lease_gc_took_starts_over(
    backend: Backend, tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer suspended past its lease: gc deletes the lease and the blobs; the
    writer finds out when it commits, leases again, rewrites the blobs and commits."""
    from aot.cache.index import sql as index_mod
    from aot.cache.admin import maintenance

    artifact = tiny.by_size[7]
    key = evictable(backend, artifact)
    monkeypatch.setattr(maintenance, "ORPHAN_GRACE_SECONDS", 0.0)
    real_lease = index_mod.Index.lease
    leases: list[Any] = []

    def short_lease(self: Any, digests: Any, *, seconds: float | None = None) -> Any:
        lease = real_lease(self, digests, seconds=0.0 if not leases else 3600.0)  # the first expires at once
        leases.append(lease)
        return lease

    monkeypatch.setattr(index_mod.Index, "lease", short_lease)
    writer, collector = race(backend, artifact, "put.blobs_ready", "gc.done", "gc", gc_arrives=True)
    monkeypatch.setattr(index_mod.Index, "lease", real_lease)
    assert collector.error is None and writer.error is None, (collector.error, writer.error)
    assert len(leases) == 2  # started over once
    cache = backend.open()
    # Every blob of the lease: the artifact's and the row's manifest blob.
    manifest_digest = cache.index.get(key).manifest_digest
    assert set(collector.result.blobs) == {ref.digest for ref in artifact.manifest.blobs.values()} | {manifest_digest}
    assert cache.index.get(key).ok
    assert_no_row_without_its_blobs(cache)
    check_scaled(cache.load(key), 7)


# ---------------------------------------------------------------- clock skew


def skew_client_clock(monkeypatch: pytest.MonkeyPatch, delta: dt.timedelta) -> None:
    """This process's clock as jax-aot reads it, ``delta`` off (the database server's
    clock and the kernel's file times are not this process's to change)."""
    import aot.cache.storage.folder
    from aot.cache.index import engine, entry, gc_protocol, queries, schema, sql

    class Skewed(dt.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
            return dt.datetime.now(tz) + delta

    real_time = time.time
    for module in (schema, engine, queries, gc_protocol, sql, entry, aot.cache.storage.folder):
        if hasattr(module, "datetime"):
            monkeypatch.setattr(module, "datetime", Skewed)
    for module in (schema, entry):
        monkeypatch.setattr(module, "utcnow", lambda: dt.datetime.now(dt.timezone.utc) + delta)
    monkeypatch.setattr(time, "time", lambda: real_time() + delta.total_seconds())


@pytest.mark.parametrize("protection", ["lease", "age"])
def test_a_writer_whose_clock_is_15_minutes_behind_keeps_its_blobs(
    backend: Backend, tiny: Any, monkeypatch: pytest.MonkeyPatch, protection: str
) -> None:
    """A writer's clock runs 15 minutes behind the gc host's. Its in-flight
    blobs must survive a gc: every stamp and every comparison uses the database
    server's clock. ``lease``: no orphan grace, leases of 10 minutes (stamped with the
    writer's clock they would have expired 5 minutes ago). ``age``: the reported case,
    blobs in PostgreSQL and an orphan grace of 10 minutes (stamped with the writer's
    clock they looked 15 minutes old and were deleted); leases now protect them too."""
    from aot.cache.index import gc_protocol as index_gc
    from aot.cache.admin import maintenance

    if protection == "age" and backend.kind != "postgresql-db":
        pytest.skip("blob times come from the store (the kernel, the object store), not the writer's clock")
    if protection == "lease":
        monkeypatch.setattr(index_gc, "LEASE_SECONDS", 600.0)
        monkeypatch.setattr(maintenance, "ORPHAN_GRACE_SECONDS", 0.0)
    else:
        monkeypatch.setattr(maintenance, "ORPHAN_GRACE_SECONDS", 600.0)
    artifact = tiny.by_size[8]
    backend.reset()
    backend.open().put_artifact(tiny.by_size[1])  # an index that is not empty
    writer_cache, gc_cache = backend.open(), backend.open()
    pauser = Pauser({"put.blobs_ready": "writer"})
    previous = pauses.set_hook(pauser)
    skewed = pytest.MonkeyPatch()
    try:
        skew_client_clock(skewed, dt.timedelta(minutes=-15))
        writer = Actor("writer", lambda: writer_cache.put_artifact(artifact))
        writer.start()
        assert pauser.arrived["writer"].wait(30)
        skewed.undo()  # gc runs on a host whose clock is right
        plan = gc_cache.gc()
        pauser.release("writer")
        writer.join(60)
    finally:
        skewed.undo()
        pauses.set_hook(previous)
    assert writer.error is None, writer.error
    digests = {ref.digest for ref in artifact.manifest.blobs.values()}
    assert not digests & set(plan.blobs)
    cache = backend.open()
    assert_no_row_without_its_blobs(cache)
    check_scaled(cache.load(artifact.manifest.key), 8)
    # the row's times are the server's too
    assert abs(cache.index.get(artifact.manifest.key).created_at - cache.index.now()) < dt.timedelta(minutes=5)


# ---------------------------------------------------------------- kill -9 at every step


@pytest.mark.slow
def test_kill_9_at_every_step_of_writer_and_gc(
    backend: Backend, tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forked writer SIGKILLs itself at each step of the lease protocol (twice per
    step, at a seeded random put), and a forked gc (evicting everything, one blob per
    deletion transaction) at each of its steps. After every kill: no committed row
    without its blobs; then the cache recovers: the dead writer's leases expire and gc
    takes its orphans, every entry can be stored again, verify is clean."""
    from tests.reliability.test_crashes import Zygote, expire_leases, remove_stale_temp_files

    from aot.cache.admin import maintenance

    monkeypatch.setattr(maintenance, "ORPHAN_GRACE_SECONDS", 0.0)
    backend.reset()
    seed = backend.open()
    for artifact in tiny.all()[:6]:
        seed.put_artifact(artifact)
    seed.close()
    artifact_dir = tiny.save(tmp_path / "artifacts")
    zygote = Zygote(backend.location, backend.blob_location, artifact_dir, tmp_path / "zygote.log")
    rng = random.Random(20261212)
    killed: dict[str, int] = {}
    try:
        trials = [("go", p) for p in WRITER_POINTS for _ in range(2)] + [("gc", p) for p in GC_POINTS]
        for n, (command, point) in enumerate(trials):
            if command == "go":  # give the writer something to write
                cache = backend.open()
                cache.index.delete([e.key for e in cache.entries() if rng.random() < 0.5])
            pid = zygote.start(n, point, command)
            status = zygote.wait_exit(pid)
            assert os.WIFSIGNALED(status) or os.WEXITSTATUS(status) == 0, (point, status)
            if os.WIFSIGNALED(status):
                killed[point] = killed.get(point, 0) + 1
            cache = backend.open()
            assert_no_row_without_its_blobs(cache)  # right after the kill
            entries = cache.entries()
            for entry in rng.sample(entries, min(3, len(entries))):
                cache.load(entry)
            expire_leases(cache)
            # a gc killed after evicting every row leaves an empty index beside blobs,
            # which the next gc refuses to clean without force (it cannot tell that
            # from a lost index)
            cache.gc(force=command == "gc")
            remove_stale_temp_files(cache)
            for artifact in tiny.all()[:6]:  # everything can be stored again
                cache.put_artifact(artifact)
            report = cache.verify()
            assert report.ok, (point, report.to_dict())
            backend.close_all()
    finally:
        zygote.close()
    assert "Traceback" not in (tmp_path / "zygote.log").read_text()
    print(backend.kind, "killed at", killed)
    assert set(killed) == set(WRITER_POINTS) | set(GC_POINTS)


# ---------------------------------------------------------------- gc loops and writers


@pytest.mark.parametrize(
    "kind", ["sqlite-folder", pytest.param("postgresql-folder", marks=pytest.mark.postgres)]
)
def test_gc_loops_racing_writers_never_refuse_and_lose_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, tiny: Any,
) -> None:
    """Two gc loops evicting everything while two writers store the entry again, beside
    a young orphan blob: the index is empty (gc emptied it) while blobs remain again and
    again. gc must never take that for a lost index, and no row may lack its blobs."""
    url = request.getfixturevalue("postgres_url") if kind.startswith("postgresql") else None
    backend = Backend(kind, tmp_path, url)
    backend.reset()
    try:
        first = backend.open()
        first.put_artifact(tiny.by_size[1])  # a cache in use, not a fresh one
        first.blobs.put(b"a young blob no row references")
        rounds = 6

        def write() -> None:
            cache = backend.open()
            for n in range(rounds):
                cache.put_artifact(tiny.by_size[1 + n % 3])

        def collect() -> None:
            cache = backend.open()
            for _ in range(rounds):
                cache.gc(max_size=1)

        actors = [Actor(f"writer{i}", write) for i in range(2)] + [Actor(f"gc{i}", collect) for i in range(2)]
        for actor in actors:
            actor.start()
        for actor in actors:
            actor.join(120)
            assert not actor.is_alive(), f"{actor.name} is stuck"
        assert [(a.name, a.error) for a in actors if a.error is not None] == []
        last = backend.open()
        last.gc(max_size=1)  # once more after everyone: an emptied index, not a lost one
        assert_no_row_without_its_blobs(last)
        entry = last.put_artifact(tiny.by_size[1])
        last.load(entry)  # stored again after all that, and it loads
    finally:
        backend.close_all()
