"""gc of KIND jit entries (JAX's persistent cache through aot.jax_cache): selected by
age, evicted by size in one least-recently-used order with the aot entries, planned
then executed, their blobs deleted only when no entry of either kind uses them; on
every backend (SQLite and PostgreSQL, folder and database blobs)."""

from __future__ import annotations

import datetime as dt
import hashlib
import os

import pytest

import aot
from aot.cache.index.entry import utcnow
from aot.cache.index.jit_records import JitEntry


def _payload(body: bytes, seconds: int = 2) -> bytes:
    from jax._src import compilation_cache as cc  # only to build a payload as JAX does

    return cc.compress_executable(cc.combine_executable_and_time(body, seconds))


def _jit(cache: aot.Cache, name: str, body: bytes, *, hours_ago: float | None = None) -> JitEntry:
    """A jit entry stored as the backend stores JAX's ``put``, last used ``hours_ago``."""
    key = f"jit_{name}-{hashlib.sha256(name.encode() + body).hexdigest()}"
    backend = aot.jax_cache.JaxCacheBackend(cache, compile_once=False)
    try:
        backend.put(key, _payload(body))
        assert backend.counts.puts == 1
    finally:
        backend.close()
    if hours_ago is not None:
        cache.index.jit_touch(key, when=utcnow() - dt.timedelta(hours=hours_ago))
    entry = cache.index.jit_get(key)
    assert entry is not None
    return entry


def _hit(cache: aot.Cache, entry: JitEntry) -> bytes | None:
    backend = aot.jax_cache.JaxCacheBackend(cache, compile_once=False)
    try:
        return backend.get(entry.key)
    finally:
        backend.close()


def test_older_than_selects_an_old_jit_entry_and_keeps_a_fresh_one(cache: aot.Cache) -> None:
    old = _jit(cache, "old_step", b"old" * 300, hours_ago=40 * 24)
    fresh = _jit(cache, "fresh_step", b"fresh" * 300)

    plan = cache.gc(older_than="30d", dry_run=True)
    assert [(v.kind, v.key, v.name) for v in plan.entries] == [("jit", old.key, "old_step")]
    assert plan.entries[0].reason == "unused for more than 30d"
    assert plan.entries[0].describe() == "old_step (jit)"
    assert plan.blobs == (old.digest,) and plan.bytes_freed == old.stored_size
    assert plan.to_dict()["entries"][0]["kind"] == "jit"
    assert {e.key for e in cache.index.jit_entries()} == {old.key, fresh.key}  # a dry run deletes nothing

    done = cache.gc(older_than="30d")
    assert done.executed and [v.key for v in done.entries] == [old.key]
    assert done.blobs == (old.digest,) and done.bytes_freed == old.stored_size
    assert [e.key for e in cache.index.jit_entries()] == [fresh.key]
    assert old.digest not in cache.blobs.digests()
    assert cache.blobs.check(fresh.digest, fresh.size) is None
    assert _hit(cache, fresh) == _payload(b"fresh" * 300)
    assert _hit(cache, old) is None  # evicted: JAX would compile it again
    assert cache.verify().ok


def test_a_blob_shared_with_a_kept_jit_entry_survives(cache: aot.Cache) -> None:
    body = b"the same executable" * 50
    old = _jit(cache, "old_name", body, hours_ago=40 * 24)
    kept = _jit(cache, "new_name", body)
    assert old.digest == kept.digest  # content-addressed: stored once

    done = cache.gc(older_than="30d")
    assert [(v.kind, v.key) for v in done.entries] == [("jit", old.key)]
    assert done.blobs == () and done.bytes_freed == 0
    assert [e.key for e in cache.index.jit_entries()] == [kept.key]
    assert cache.blobs.check(kept.digest, kept.size) is None
    assert _hit(cache, kept) == _payload(body)


def test_max_size_evicts_the_least_recently_used_across_kinds(cache: aot.Cache, compiled) -> None:  # noqa: ANN001
    now = utcnow()
    aot_entries = {}
    for batch, hours in ((1, 5), (2, 3), (4, 1)):
        key = cache.put_artifact(compiled.mlp[batch]).key
        cache.index.touch(key, when=now - dt.timedelta(hours=hours))
        aot_entries[batch] = cache.index.get(key)
    # Incompressible bodies: each jit entry weighs about as much as an aot one.
    oldest_jit = _jit(cache, "warmup", os.urandom(4000), hours_ago=4)
    newer_jit = _jit(cache, "train_step", os.urandom(4000), hours_ago=2)

    def stored(*digests: str | None) -> int:
        return sum(cache.blobs.stored_size(d) for d in digests if d is not None)

    mlp1 = aot_entries[1]
    size = stored(*cache.blobs.digests())
    limit = size - stored(mlp1.exe_digest, mlp1.hlo_digest, mlp1.manifest_digest) - stored(oldest_jit.digest)
    plan = cache.gc(max_size=limit, dry_run=True)
    assert [v.key for v in plan.entries] == [mlp1.key, oldest_jit.key]
    assert [v.kind for v in plan.entries] == ["aot", "jit"]
    assert all(v.reason.startswith("least recently used") for v in plan.entries)
    assert plan.size_after == limit

    # --kind narrows what may go; every entry's bytes still count toward the size.
    only_aot = cache.gc(max_size=limit, dry_run=True, kind="aot")
    assert only_aot.entries and {v.kind for v in only_aot.entries} == {"aot"}
    assert only_aot.entries[0].key == mlp1.key and only_aot.size_after <= limit
    only_jit = cache.gc(max_size=limit, dry_run=True, kind="jit")
    assert [v.key for v in only_jit.entries] == [oldest_jit.key, newer_jit.key]
    assert only_jit.size_after > limit  # the jit entries alone cannot make it fit

    done = cache.gc(max_size=limit)
    assert [v.key for v in done.entries] == [mlp1.key, oldest_jit.key]
    assert stored(*cache.blobs.digests()) == limit
    assert {e.key for e in cache.entries()} == {aot_entries[2].key, aot_entries[4].key}
    assert [e.key for e in cache.index.jit_entries()] == [newer_jit.key]
    assert cache.verify().ok


def test_a_jit_entry_hit_after_the_plan_is_kept(cache: aot.Cache) -> None:
    from aot.cache import pauses

    old = _jit(cache, "step", b"step" * 200, hours_ago=40 * 24)
    assert [v.key for v in cache.gc(older_than="30d", dry_run=True).entries] == [old.key]

    def hit_it(point: str) -> None:
        if point == "gc.planned":
            assert _hit(cache, old) is not None

    previous = pauses.set_hook(hit_it)
    try:
        plan = cache.gc(older_than="30d")
    finally:
        pauses.set_hook(previous)
    assert plan.entries == () and plan.blobs == ()
    assert [e.key for e in cache.index.jit_entries()] == [old.key]
    assert cache.blobs.check(old.digest, old.size) is None


def test_a_program_stored_again_while_gc_runs_keeps_its_blob(cache: aot.Cache) -> None:
    """gc's protocol holds for jit rows: a process storing the same program after the
    rows are deleted leases its blob first, so gc's locked re-check keeps it."""
    from aot.cache import pauses

    body = b"step" * 200
    old = _jit(cache, "step", body, hours_ago=40 * 24)

    def store_again(point: str) -> None:
        if point == "gc.rows_deleted":
            assert cache.index.jit_get(old.key) is None
            _jit(cache, "step", body)

    previous = pauses.set_hook(store_again)
    try:
        done = cache.gc(older_than="30d")
    finally:
        pauses.set_hook(previous)
    assert [v.key for v in done.entries] == [old.key]  # its row went
    assert done.blobs == () and done.bytes_freed == 0  # its blob did not
    assert [e.key for e in cache.index.jit_entries()] == [old.key]
    assert _hit(cache, old) == _payload(body)


def test_gc_goes_on_after_evicting_the_last_jit_entry(cache: aot.Cache) -> None:
    """An index gc emptied of its jit entries is not taken for a lost one."""
    old = _jit(cache, "step", b"step" * 200, hours_ago=40 * 24)
    orphan = cache.blobs.put(b"bytes no entry refers to")
    done = cache.gc(older_than="30d")
    assert [v.key for v in done.entries] == [old.key] and done.warnings == ()
    assert cache.index.jit_entries() == [] and cache.entries() == []
    again = cache.gc(dry_run=True)
    assert again.warnings == ()  # gc emptied it itself: the next gc is not refused
    assert orphan in cache.blobs.digests()  # young: kept for the grace period, not refused


def test_an_unknown_kind_is_refused(open_folder_cache) -> None:  # noqa: ANN001
    from aot.errors import UsageError

    with pytest.raises(UsageError, match="gc kind must be one of all, aot, jit, not 'jax'"):
        open_folder_cache().gc(dry_run=True, kind="jax")
