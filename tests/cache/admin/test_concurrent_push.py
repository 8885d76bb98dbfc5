"""Two pushes at once into one shared destination (PostgreSQL index + S3 blobs), as a
fleet's CI runners push into the shared cache: both succeed (no deadlock, no unique
violation reaching the user), every entry is stored once and intact, and the refs end
up those of one push, the one whose refs were written last (docs/reliability.md).

The pushes run in two threads, each with its own ``aot.Cache`` of the destination (as
two processes would); a barrier at ``copy.blobs_ready`` makes their index
transactions start together, and the first one inside its transaction
(``put.before_commit``) waits until the other is seen blocked on its rows."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

import aot
from aot.cache.admin import copy_batches
from aot.cache.admin.transfer import TransferReport, push
from aot.cache.index.refs import RefOrigin
from aot.cache.pauses import set_hook

pytestmark = pytest.mark.postgres

#: Fake entries per source (beside its real ones): three batches of 40 after the first.
N = 120


@pytest.fixture(autouse=True)
def _small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copy_batches, "BATCH", 40)


@pytest.fixture
def shared(postgres_url: str, s3_url: str) -> tuple[str, str]:
    """The shared destination, empty: (index URL, blob location)."""
    return postgres_url, s3_url


def fleet_entries(cache: aot.Cache, n: int, version: str, prefix: str = "fleet") -> None:
    """``n`` more rows in ``cache``, named ``PREFIX.n0000``..., over the blobs of its real
    entries; ``version`` is part of each program: two caches with the same version hold
    the same keys, with another version the same slots (name, signature, environment)
    under other keys. Each row gets a ref, as a warm-up of that version would set."""
    from aot.artifact import Manifest
    from aot.fingerprint import Fingerprint, combined_key

    real = sorted(cache.index.entries(), key=lambda e: e.name)
    rows = []
    for i in range(n):
        base = real[i % len(real)]
        manifest = Manifest.from_json(base.manifest)
        name = f"{prefix}.n{i:04d}"
        program = Fingerprint.of(manifest.program.kind, {**manifest.program.as_dict(), "name": name, "v": version})
        key = combined_key(program, manifest.environment)
        manifest = dataclasses.replace(manifest, name=name, program=program, key=key)
        rows.append(dataclasses.replace(base, key=key, name=name, program_fp=program.digest, manifest=manifest.to_json()))
    cache.index.bulk_insert(rows)
    cache.set_refs(rows, RefOrigin(f"warmup {version}"))


@pytest.fixture
def make_source(tmp_path: Path, compiled) -> Iterator[Callable[..., aot.Cache]]:  # noqa: ANN001
    opened: list[aot.Cache] = []

    def make(label: str, artifacts: Sequence[Any], version: str, prefix: str = "fleet") -> aot.Cache:
        cache = aot.Cache(tmp_path / label)
        opened.append(cache)
        for artifact in artifacts:
            cache.put(artifact)
        fleet_entries(cache, N, version, prefix)
        return cache

    yield make
    for cache in opened:
        cache.close()


def lock_waiters(url: str) -> Callable[[], int]:
    """How many backends of ``url``'s database wait for a lock now."""
    engine = sa.create_engine(url, poolclass=NullPool)

    def count() -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )).scalar_one())

    return count


def push_at_once(sources: Sequence[aot.Cache], shared: tuple[str, str], *, refs: bool = False) -> tuple[list[TransferReport], int]:
    """Pushes each source into ``shared`` at the same time; their reports, and how many
    backends the first to commit rows saw waiting on its locks (0: no row in common)."""
    location, blobs = shared
    barrier = threading.Barrier(len(sources), timeout=60)
    met: set[int] = set()
    seen: list[int] = []
    waiting = lock_waiters(location)

    def hook(point: str) -> None:
        me = threading.get_ident()
        if point == "copy.blobs_ready" and me not in met:
            met.add(me)
            try:
                barrier.wait()  # both batches' rows go in together
            except threading.BrokenBarrierError:  # the other found nothing to commit
                pass
        elif point == "put.before_commit" and me in met and not seen:
            seen.append(0)  # the first inside its transaction: is the other one blocked?
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and not seen[0]:
                seen[0] = waiting()
                time.sleep(0.02)

    previous = set_hook(hook)
    try:
        with ThreadPoolExecutor(len(sources)) as pool:
            futures = [pool.submit(push, s, location, blob_location=blobs, refs=refs, jobs=2) for s in sources]
            reports = [f.result(timeout=300) for f in futures]
    finally:
        set_hook(previous)
    return reports, (seen or [0])[0]


def keys_of(cache: aot.Cache) -> set[str]:
    return {e.key for e in cache.index.entries()}


def check_destination(shared: tuple[str, str], want: set[str], compiled) -> aot.Cache:  # noqa: ANN001
    """Every key once, intact (``verify`` clean), no lease left; tiny serves right."""
    location, blobs = shared
    dest = aot.Cache(location, blob_location=blobs)
    stored = [e.key for e in dest.index.entries()]
    assert sorted(stored) == sorted(want)  # each once
    report = dest.verify()
    assert report.ok, report.to_dict()
    assert dest.index.leased_digests() == set()
    if any(e.name == "tiny" for e in dest.index.entries()):
        fn = aot.load("tiny", cache=dest, strict=True)
        np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected)
    return dest


def assert_pushed(report: TransferReport, keys: set[str]) -> None:
    assert report.ok, report.to_dict()
    assert set(report.copied) | set(report.skipped) == keys and not report.repaired


def test_disjoint_pushes_both_store_everything(make_source, shared, compiled) -> None:  # noqa: ANN001
    a = make_source("a", [compiled.tiny], "a", prefix="team_a")
    b = make_source("b", list(compiled.mlp.values()), "b", prefix="team_b")  # nothing in common
    (ra, rb), _ = push_at_once([a, b], shared)
    assert_pushed(ra, keys_of(a))
    assert_pushed(rb, keys_of(b))
    assert set(ra.copied) == keys_of(a) and set(rb.copied) == keys_of(b)
    dest = check_destination(shared, keys_of(a) | keys_of(b), compiled)
    try:  # each source's refs, all set (no slot in common)
        assert {(r.slot, r.key) for r in dest.index.refs()} == {(r.slot, r.key) for c in (a, b) for r in c.index.refs()}
    finally:
        dest.close()


def test_overlapping_pushes_store_each_entry_once(make_source, shared, compiled, tmp_path: Path) -> None:  # noqa: ANN001
    a = make_source("a", [compiled.tiny, compiled.mlp[1]], "v1")
    push(a, tmp_path / "b")  # one runner's cache copied to another: the same keys, blobs and refs
    b = aot.Cache(tmp_path / "b")
    try:
        assert keys_of(b) == keys_of(a)
        (ra, rb), waited = push_at_once([a, b], shared)
        assert waited, "the second push's rows never waited on the first's: the pushes did not overlap"
        assert_pushed(ra, keys_of(a))
        assert_pushed(rb, keys_of(a))
        # Each entry stored by exactly one of them; the other found it there.
        assert not set(ra.copied) & set(rb.copied)
        assert set(ra.copied) | set(rb.copied) == keys_of(a)
        dest = check_destination(shared, keys_of(a), compiled)
        try:
            assert {(r.slot, r.key) for r in dest.index.refs()} == {(r.slot, r.key) for r in a.index.refs()}
        finally:
            dest.close()
    finally:
        b.close()


def refs_meet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two pushes' ref writes start together (each waits for the other at the door)."""
    from aot.cache.index.sql import Index

    barrier = threading.Barrier(2, timeout=60)
    real = Index.set_refs

    def set_refs(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        barrier.wait()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Index, "set_refs", set_refs)


def test_pushes_with_refs_for_the_same_slots_leave_one_push_refs(
    make_source, shared, compiled, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """Two versions of every program (the same slots, other keys), each declared by its
    runner, pushed at once with ``--refs``: the destination serves one version
    throughout, the one whose refs were written last, and the history has both."""
    a = make_source("a", [compiled.tiny], "v1")
    b = make_source("b", [compiled.tiny], "v2")
    fleet = {c: {r.slot: r.key for r in c.index.refs() if r.name.startswith("fleet.")} for c in (a, b)}
    assert fleet[a].keys() == fleet[b].keys() and not set(fleet[a].values()) & set(fleet[b].values())
    refs_meet(monkeypatch)
    (ra, rb), _ = push_at_once([a, b], shared, refs=True)
    assert_pushed(ra, keys_of(a))
    assert_pushed(rb, keys_of(b))
    dest = check_destination(shared, keys_of(a) | keys_of(b), compiled)
    try:
        served = {r.slot: r.key for r in dest.index.refs() if r.name.startswith("fleet.")}
        winner = a if served == fleet[a] else b
        assert served == fleet[winner], "the refs mix the two pushes"
        loser = b if winner is a else a
        for slot, key in served.items():
            history = dest.index.ref_history(slot[0], signature=slot[1], env_fp=slot[2])
            # Both pushes recorded, the served one last (the history and the ref agree).
            assert [h.key for h in history] == [key, fleet[loser][slot]], slot
            assert all(h.source.startswith("push to ") for h in history)
    finally:
        dest.close()


@pytest.mark.parametrize("keep_existing", [False, True], ids=["--refs", "fill-empty-slots"])
def test_two_ref_writers_interleaved_leave_one_writer_refs(postgres_url: str, keep_existing: bool) -> None:
    """The interleaving that can mix two pushes' ``--refs`` (deterministic): writer B
    records its first slot's history (a lower ``seq``), then writer A records and sets
    that slot before B sets it. Each writer's refs must land whole: one writer's refs
    for every slot, the newest history record of each slot being the ref. Without
    ``--refs`` (``keep_existing``), B fills the empty slots and A keeps them."""
    from aot.cache.index.sql import Index

    slots = [("fleet.n0", "f32[2]"), ("fleet.n1", "f32[2]")]
    writers = {w: [(n, s, "env", f"{w}{i}" * 32) for i, (n, s) in enumerate(slots)] for w in "ab"}
    Index(postgres_url).close()  # the schema
    b_recorded, a_moved = threading.Event(), threading.Event()
    waiting = lock_waiters(postgres_url)
    calls = {"a": 0, "b": 0}
    who = threading.local()

    def hook(point: str) -> None:
        if point != "refs.recorded":
            return
        calls[who.name] += 1
        if who.name == "b" and calls["b"] == 1:
            b_recorded.set()  # B holds a seq for slot 0, its ref not written yet
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not a_moved.is_set() and not waiting():
                time.sleep(0.02)
        elif who.name == "a" and calls["a"] == 2:
            a_moved.set()  # A has written slot 0's ref

    def write(name: str) -> None:
        who.name = name
        if name == "a":
            assert b_recorded.wait(30)
        with Index(postgres_url) as index:
            index.set_refs(writers[name], RefOrigin(f"push {name}"), keep_existing=keep_existing)

    previous = set_hook(hook)
    try:
        with ThreadPoolExecutor(2) as pool:
            for f in [pool.submit(write, "b"), pool.submit(write, "a")]:
                f.result(timeout=60)
    finally:
        set_hook(previous)
    with Index(postgres_url) as index:
        served = {r.name: r.key for r in index.refs()}
        assert sorted(served.values()) in ([k for *_, k in writers["a"]], [k for *_, k in writers["b"]]), served
        for name, sig in slots:
            history = index.ref_history(name, signature=sig)
            assert history[0].key == served[name]
            if keep_existing:  # the first writer filled the slot, the second kept it
                assert [h.key for h in history] == [served[name]] and served[name].startswith("b")
