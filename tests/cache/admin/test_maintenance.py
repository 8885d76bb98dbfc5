"""verify (re-hash, report, quarantine, orphans) and gc (plan, dry run, execute; by age
and by size in least-recently-used order) on every backend."""

from __future__ import annotations

import datetime as dt
import json

import pytest

import aot
from aot.cache.index.entry import referenced_digests, utcnow
from aot.cache.admin import maintenance
from aot.cache.admin.maintenance import ORPHAN_GRACE_SECONDS, human_size, parse_age, parse_size
from aot.errors import CacheError


def _flip(cache, digest: str, read_raw, write_raw) -> None:  # noqa: ANN001
    stored = bytearray(read_raw(cache.blobs, digest))
    stored[len(stored) // 2] ^= 0x01
    write_raw(cache.blobs, digest, bytes(stored))


def _age_blob(cache, digest: str, set_blob_age) -> None:  # noqa: ANN001
    """Make a blob older than the orphan grace period, on its store's clock."""
    set_blob_age(cache.blobs, digest, ORPHAN_GRACE_SECONDS + 60)


def _stored(cache) -> int:  # noqa: ANN001
    return sum(cache.blobs.stored_size(d) for d in cache.blobs.digests())


# ---------------------------------------------------------------- verify


def test_verify_a_healthy_cache(cache: aot.Cache, compiled) -> None:  # noqa: ANN001
    for artifact in compiled.all():
        cache.put(artifact)
    report = cache.verify()
    assert report.ok
    assert (report.checked_entries, report.checked_blobs) == (4, 8)
    assert report.problems == report.quarantined == report.orphan_blobs == ()
    json.dumps(report.to_dict())


def test_verify_finds_a_flipped_byte_a_missing_blob_and_orphans(
    cache: aot.Cache, compiled, read_raw, write_raw, set_blob_age  # noqa: ANN001
) -> None:
    entries = {b: cache.put(a) for b, a in compiled.mlp.items()}
    flipped, missing, intact = entries[1], entries[2], entries[4]
    _flip(cache, flipped.exe_digest, read_raw, write_raw)
    assert cache.blobs.delete(missing.hlo_digest) > 0
    orphan = cache.blobs.put(b"bytes no entry refers to")

    looked = cache.verify(quarantine=False)  # report only
    assert not looked.ok and looked.quarantined == ()
    assert all(e.ok for e in cache.entries())

    report = cache.verify()
    by_key = {}
    for problem in report.problems:
        by_key.setdefault(problem.key, []).append(problem.what)
    assert set(by_key) == {flipped.key, missing.key}
    assert len(by_key[flipped.key]) == 1 and by_key[flipped.key][0].startswith("executable blob")
    assert by_key[missing.key] == [f"portable_hlo blob {missing.hlo_digest[:12]}: missing"]
    assert sorted(report.quarantined) == sorted([flipped.key, missing.key])
    assert report.orphan_blobs == (orphan,)
    assert not report.ok
    states = {e.key: e.state for e in cache.entries()}
    assert states == {flipped.key: "quarantined", missing.key: "quarantined", intact.key: "ok"}
    assert "digest mismatch" in cache.index.get(flipped.key).state_reason or "undecodable" in (
        cache.index.get(flipped.key).state_reason or ""
    )

    again = cache.verify()  # still reported, not quarantined twice
    assert {p.key for p in again.problems} == {flipped.key, missing.key}
    assert again.quarantined == ()

    # gc removes the quarantined entries and the orphan; what is left is healthy.
    _age_blob(cache, orphan, set_blob_age)
    plan = cache.gc()
    assert {v.key for v in plan.entries} == {flipped.key, missing.key}
    assert all(v.reason.startswith("quarantined") for v in plan.entries)
    assert orphan in plan.blobs
    assert cache.verify().ok
    assert [e.key for e in cache.entries()] == [intact.key]


def test_verify_on_a_read_only_cache_reports_without_quarantining(
    open_cache, compiled, read_raw, write_raw  # noqa: ANN001
) -> None:
    writer = open_cache()
    entry = writer.put(compiled.tiny)
    _flip(writer, entry.exe_digest, read_raw, write_raw)
    report = open_cache(read_only=True).verify()
    assert [p.key for p in report.problems] == [entry.key]
    assert report.quarantined == ()
    assert writer.index.get(entry.key).ok


# ---------------------------------------------------------------- gc


@pytest.fixture
def aged(cache: aot.Cache, compiled):  # noqa: ANN001, ANN201
    """The three MLP buckets, last used 3 h (batch 1), 2 h (batch 2), 1 h ago (batch 4)."""
    now = utcnow()
    entries = {}
    for batch, hours in ((1, 3), (2, 2), (4, 1)):
        key = cache.put_artifact(compiled.mlp[batch]).key
        cache.index.touch(key, when=now - dt.timedelta(hours=hours))
        entries[batch] = cache.index.get(key)
    digests = {d for e in entries.values() for d in referenced_digests(e)}
    assert len(digests) == 9  # no blob is shared: each entry frees its own bytes (manifests included)
    return cache, entries


def test_gc_by_size_plans_lru_and_dry_run_deletes_nothing(aged) -> None:  # noqa: ANN001
    cache, e = aged
    size = {b: entry.stored_size for b, entry in e.items()}
    before = (sorted(x.key for x in cache.entries()), sorted(cache.blobs.digests()))

    plan = cache.gc(max_size=size[2] + size[4], dry_run=True)
    assert [v.key for v in plan.entries] == [e[1].key]  # the least recently used
    assert plan.dry_run and not plan.executed
    assert plan.bytes_freed == size[1]
    assert plan.size_before == _stored(cache) == sum(size.values())
    assert plan.size_after == size[2] + size[4]
    assert set(plan.blobs) == {e[1].exe_digest, e[1].hlo_digest, e[1].manifest_digest}
    assert "least recently used" in plan.entries[0].reason
    json.dumps(plan.to_dict())

    plan = cache.gc(max_size=size[2] + size[4] - 1, dry_run=True)
    assert [v.key for v in plan.entries] == [e[1].key, e[2].key]  # LRU order
    assert plan.bytes_freed == size[1] + size[2]
    assert cache.gc(max_size=10 * sum(size.values()), dry_run=True).entries == ()

    assert (sorted(x.key for x in cache.entries()), sorted(cache.blobs.digests())) == before

    # Using batch 1 makes batch 2 the least recently used.
    cache.index.touch(e[1].key)
    plan = cache.gc(max_size=size[1] + size[4], dry_run=True)
    assert [v.key for v in plan.entries] == [e[2].key]


def test_gc_by_size_frees_the_planned_bytes(aged, compiled) -> None:  # noqa: ANN001
    cache, e = aged
    size = {b: entry.stored_size for b, entry in e.items()}
    planned = cache.gc(max_size=f"{size[2] + size[4]}B", dry_run=True)
    done = cache.gc(max_size=f"{size[2] + size[4]}B")
    assert done.executed and not done.dry_run
    assert [v.key for v in done.entries] == [v.key for v in planned.entries] == [e[1].key]
    assert done.bytes_freed == planned.bytes_freed == size[1]
    assert _stored(cache) == done.size_after == size[2] + size[4]
    assert {x.key for x in cache.entries()} == {e[2].key, e[4].key}
    assert not any(cache.blobs.has(d) for d in referenced_digests(e[1]))  # the manifest blob too
    assert {r.digest for r in cache.index.blob_rows()} == set(cache.blobs.digests())
    assert cache.verify().ok
    cache.get(e[4].key)  # the survivors still load


def test_gc_by_age(aged) -> None:  # noqa: ANN001
    cache, e = aged
    cache.index.touch(e[1].key, when=utcnow() - dt.timedelta(days=40))
    plan = cache.gc(older_than="30d", dry_run=True)
    assert [v.key for v in plan.entries] == [e[1].key]
    assert "30d" in plan.entries[0].reason
    assert plan.bytes_freed == e[1].stored_size
    assert len(cache.entries()) == 3

    done = cache.gc(older_than=dt.timedelta(days=30))
    assert [v.key for v in done.entries] == [e[1].key]
    assert done.bytes_freed == e[1].stored_size
    assert {x.key for x in cache.entries()} == {e[2].key, e[4].key}
    again = cache.gc(older_than="30d")
    assert again.entries == () and again.bytes_freed == 0

    assert [v.key for v in cache.gc(older_than="90min", dry_run=True).entries] == [e[2].key]


def test_gc_keeps_blobs_another_entry_still_uses(cache: aot.Cache, compiled, foreign) -> None:  # noqa: ANN001
    here = cache.put_artifact(compiled.tiny)
    there = cache.put_artifact(foreign(compiled.tiny, jaxlib="0.0.1"))  # shares both blobs
    cache.index.touch(here.key, when=utcnow() - dt.timedelta(days=2))
    freed = cache.blobs.stored_size(here.manifest_digest)
    plan = cache.gc(older_than="1d")
    assert [v.key for v in plan.entries] == [here.key]
    # Only its manifest goes (the other entry's manifest is another blob).
    assert plan.blobs == (here.manifest_digest,) and plan.bytes_freed == freed
    assert cache.artifact(there).blob("executable")  # intact, and so is the portable HLO
    assert cache.artifact(there).blob("portable_hlo")


def test_gc_collects_orphans_after_a_grace_period(cache: aot.Cache, compiled, set_blob_age) -> None:  # noqa: ANN001
    cache.put(compiled.tiny)
    orphan = cache.blobs.put(b"left by a writer that crashed before its index row")
    assert orphan not in cache.gc().blobs  # young: may be a write in progress
    assert cache.blobs.has(orphan)
    _age_blob(cache, orphan, set_blob_age)
    plan = cache.gc()
    assert plan.blobs == (orphan,) and plan.entries == ()
    assert not cache.blobs.has(orphan)
    assert len(cache.entries()) == 1


# ---------------------------------------------------------------- units


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10G", 10 * 1024**3), ("500M", 500 * 1024**2), ("1.5K", 1536), ("1KiB", 1024),
     ("2kb", 2048), ("123", 123), (123, 123), (None, None)],
)
def test_parse_size(text, expected) -> None:  # noqa: ANN001
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("30d", dt.timedelta(days=30)), ("12h", dt.timedelta(hours=12)), ("2w", dt.timedelta(weeks=2)),
     ("90min", dt.timedelta(minutes=90)), ("45s", dt.timedelta(seconds=45)), (None, None)],
)
def test_parse_age(text, expected) -> None:  # noqa: ANN001
    assert parse_age(text) == expected


@pytest.mark.parametrize("bad", ["ten gigs", "-1G", "10X"])
def test_bad_size_is_refused(bad: str) -> None:
    with pytest.raises(CacheError, match="500M"):
        parse_size(bad)


@pytest.mark.parametrize("bad", ["30 dayz", "1y", ""])
def test_bad_age_is_refused(bad: str) -> None:
    with pytest.raises(CacheError, match="30d"):
        parse_age(bad)


@pytest.mark.parametrize("huge", ["99999999999d", "1000000000000000000000s", "40000d", "5300w"])
def test_an_age_past_the_largest_is_refused_not_an_overflow(huge: str) -> None:
    with pytest.raises(CacheError, match=r"too large: the largest accepted age is 36500d \(100 years\)") as raised:
        parse_age(huge)
    assert "\n" not in str(raised.value)


def test_the_largest_accepted_age_is_accepted() -> None:
    assert parse_age("36500d") == dt.timedelta(days=36500)


def test_human_size() -> None:
    assert [human_size(n) for n in (0, 1023, 1024, 1536 * 1024, 5 * 1024**4)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 MiB", "5.0 TiB"
    ]


def test_gc_between_a_writers_blobs_and_its_index_row_loses_nothing(
    open_cache, compiled, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """put_artifact writes blobs first and the index row last; a gc in another process
    that runs in between sees unreferenced blobs and must leave young ones alone."""
    writer, collector = open_cache(), open_cache()
    real_add = writer.index.add
    plans = []

    def add_after_a_gc(entry, **kwargs):  # noqa: ANN001, ANN202
        plans.append(collector.gc())
        return real_add(entry, **kwargs)

    monkeypatch.setattr(writer.index, "add", add_after_a_gc)
    entry = writer.put(compiled.tiny)
    assert plans and plans[0].blobs == ()
    assert writer.verify().ok
    assert writer.get(entry.key).key == entry.key


# ---------------------------------------------------------------- ages and empty indexes


def test_a_blob_of_a_store_gc_does_not_know_is_aged_by_its_store(tmp_path, compiled) -> None:  # noqa: ANN001
    """gc used to probe backends with getattr and take every blob of a store it did
    not recognise as old (deletable at once). Every store reports ages through the
    ObjectStore interface; gc knows no store."""
    from aot.cache.storage.folder import MemoryObjectStore
    from aot.cache.storage.content import ContentStore

    class SomeNewStore(MemoryObjectStore):  # no path_for, no engine: nothing to probe
        pass

    cache = aot.Cache(tmp_path / "cache")
    cache.blobs = ContentStore(SomeNewStore())
    cache.put(compiled.tiny)
    orphan = cache.blobs.put(b"a writer's blob, its row not committed yet")
    plan = cache.gc()
    assert orphan not in plan.blobs and cache.blobs.has(orphan)
    raw = cache.blobs.store
    raw._data[orphan] = (raw._data[orphan][0], raw.now() - dt.timedelta(seconds=ORPHAN_GRACE_SECONDS + 1))
    assert cache.gc().blobs == (orphan,)
    assert cache.verify().ok
    cache.close()


def test_a_blob_stamped_in_the_future_is_young(tmp_path) -> None:  # noqa: ANN001
    """A store that cannot tell an age reports now(); a modified time ahead of the
    store's clock (skew) must not make an age negative-and-deletable either."""
    from aot.cache.storage.folder import MemoryObjectStore
    from aot.cache.storage.content import ContentStore

    cache = aot.Cache(tmp_path / "cache")
    cache.blobs = ContentStore(MemoryObjectStore())
    digest = cache.blobs.put(b"orphan from the future")
    raw = cache.blobs.store
    raw._data[digest] = (raw._data[digest][0], raw.now() + dt.timedelta(days=1))
    assert cache.gc(force=True).blobs == ()  # (force: the index is empty)
    assert cache.blobs.has(digest)
    cache.close()


def _forget_every_row(cache) -> None:  # noqa: ANN001
    """The index loses every row behind jax-aot's back (a truncated table, a restored
    empty backup); blobs stay. Not through ``Index.delete``: that is our own deletion."""
    import sqlalchemy as sa

    with cache.index.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM artifacts"))
        conn.execute(sa.text("DELETE FROM programs"))
    assert cache.index.is_empty()


def test_gc_refuses_to_delete_blobs_while_the_index_is_empty(
    cache: aot.Cache, compiled, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    entries = [cache.put(a) for a in compiled.mlp.values()]
    stored = set(cache.blobs.digests())
    _forget_every_row(cache)
    report = cache.verify()
    assert not report.ok and len(report.cache_problems) == 1
    assert "is empty" in report.cache_problems[0] and f"holds {len(stored)} blobs" in report.cache_problems[0]
    plan = cache.gc(dry_run=True)
    assert plan.blobs == () and plan.warnings and "--force" in plan.warnings[0]
    with pytest.raises(CacheError, match="gc refused: .*is empty.*--force"):
        cache.gc()
    assert set(cache.blobs.digests()) == stored
    for entry in entries:  # the index rebuilt: every blob is reused
        assert cache.blobs.has(entry.exe_digest)
    monkeypatch.setattr(maintenance, "ORPHAN_GRACE_SECONDS", 0.0)
    done = cache.gc(force=True)
    assert set(done.blobs) == stored and cache.blobs.digests() == []
    assert cache.verify().ok


def test_gc_goes_on_after_emptying_the_index_itself(cache: aot.Cache, compiled, set_blob_age) -> None:  # noqa: ANN001
    """gc evicts the last entry while a young orphan stays: the next gc (and verify)
    must not take the index it emptied for a lost one, now or once the orphan is old;
    a row added since, then lost behind our back, is a lost index again."""
    cache.put_artifact(compiled.tiny)
    orphan = cache.blobs.put(b"a young blob nothing references")
    assert len(cache.gc(max_size=1).entries) == 1 and cache.index.is_empty()
    assert cache.index.emptied_at() is not None
    again = cache.gc()
    assert again.executed and again.blobs == () and cache.blobs.has(orphan)
    assert cache.verify().cache_problems == ()
    _age_blob(cache, orphan, set_blob_age)
    assert cache.gc().blobs == (orphan,)
    cache.put(compiled.tiny)  # a new row clears the mark
    assert cache.index.emptied_at() is None
    _forget_every_row(cache)
    with pytest.raises(CacheError, match="gc refused: .*is empty"):
        cache.gc()


@pytest.mark.parametrize("damage", ["zero-length", "lost"])
def test_a_lost_or_truncated_index_beside_blobs_is_reported(tmp_path, compiled, damage: str) -> None:  # noqa: ANN001
    from aot.cache.reports.doctor import diagnose

    folder = tmp_path / "cache"
    with aot.Cache(folder) as cache:
        for artifact in compiled.all():
            cache.put(artifact)
        count = len(cache.blobs.digests())
    index_file = folder / "index.sqlite"
    for suffix in ("-wal", "-shm"):
        (folder / f"index.sqlite{suffix}").unlink(missing_ok=True)
    if damage == "zero-length":
        index_file.write_bytes(b"")
    else:
        index_file.unlink()
    # opened read-only (aot doctor, serving): says what is wrong
    diagnosis = diagnose(str(folder), check=True)
    assert not diagnosis.ok and diagnosis.error is not None
    assert f"holds {count} blobs" in diagnosis.error and "lost or truncated" in diagnosis.error
    with pytest.raises(CacheError, match=f"holds {count} blobs"):
        aot.Cache(folder, read_only=True)
    # opened read-write (a writer re-creates the index): verify reports, gc refuses
    with aot.Cache(folder) as cache:
        assert cache.entries() == []
        assert cache.verify().cache_problems
        with pytest.raises(CacheError, match="gc refused"):
            cache.gc()
        assert len(cache.blobs.digests()) == count
    diagnosis = diagnose(str(folder), check=False)
    assert not diagnosis.ok and diagnosis.cache_problems and "is empty" in diagnosis.cache_problems[0]


def test_gc_does_not_evict_an_entry_used_since_its_plan(cache: aot.Cache, compiled) -> None:  # noqa: ANN001
    """An entry planned for eviction but used (or healed) before the rows are deleted
    is kept, and so are its blobs."""
    from aot.cache import pauses

    entry = cache.put(compiled.tiny)
    cache.index.touch(entry.key, when=utcnow() - dt.timedelta(days=40))

    def use_it(point: str) -> None:
        if point == "gc.planned":
            cache.index.touch(entry.key)

    previous = pauses.set_hook(use_it)
    try:
        plan = cache.gc(older_than="30d")
    finally:
        pauses.set_hook(previous)
    assert plan.entries == () and plan.blobs == ()
    assert cache.index.get(entry.key).ok and cache.verify().ok


def test_a_plan_names_its_victims_arguments_only_when_asked(aged, monkeypatch) -> None:  # noqa: ANN001
    """A plan reads no manifest until a victim's arguments are asked for (at a million
    rows, naming half a million victims' arguments took a third of the plan); then all
    of them at once, by argument name, as before."""
    from aot.signatures import Signature

    cache, e = aged
    reads: list[int] = []
    index = cache.reader  # what the plan reads through (a folder cache: the stdlib reader)
    manifests = index.manifests
    monkeypatch.setattr(index, "manifests", lambda keys: reads.append(len(keys)) or manifests(keys))

    plan = cache.gc(older_than="150min", dry_run=True)
    assert [v.key for v in plan.entries] == [e[1].key]
    assert reads == []

    expected = Signature.from_manifest_json(e[1].manifest, e[1].signature)
    assert any(leaf.path for leaf in expected.leaves)  # named: not the flat signature
    assert plan.to_dict()["entries"][0]["arguments"] == expected.to_list()
    assert plan.entries[0].describe() == f"{e[1].name} ({expected.compact(None)})"
    assert reads == [1]


def test_an_executed_gc_names_its_victims_arguments_before_deleting_their_rows(aged) -> None:  # noqa: ANN001
    from aot.signatures import Signature

    cache, e = aged
    done = cache.gc(older_than="150min")
    assert [v.key for v in done.entries] == [e[1].key] and cache.index.get(e[1].key) is None
    expected = Signature.from_manifest_json(e[1].manifest, e[1].signature)
    assert done.entries[0].arguments == expected
    assert any(leaf.path for leaf in done.entries[0].arguments.leaves)


@pytest.mark.parametrize("lookup_max", [0, maintenance.REFERENCED_LOOKUP_MAX])
def test_a_victims_young_blobs_are_planned_by_either_referenced_read(aged, monkeypatch, lookup_max: int) -> None:  # noqa: ANN001
    """The victims' blobs were just written (younger than the orphan grace): they are
    planned because a row references them, whether gc scans every referenced digest
    (many unkept blobs) or looks up only the unkept ones (few)."""
    cache, e = aged
    monkeypatch.setattr(maintenance, "REFERENCED_LOOKUP_MAX", lookup_max)
    plan = cache.gc(older_than="150min", dry_run=True)
    assert [v.key for v in plan.entries] == [e[1].key]
    assert set(plan.blobs) == {e[1].exe_digest, e[1].hlo_digest, e[1].manifest_digest}
