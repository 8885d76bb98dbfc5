"""gc plans a folder cache through the standard library's reader (no SQLAlchemy import)
and the plan is the one the SQL index makes: the same victims and reasons, kept and
pinned entries, blobs, warnings and ``--json``, for every option set. The SQL index is
opened only when gc deletes rows or blobs."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path
from typing import Any

import pytest

import aot
from aot.cache.admin import maintenance
from aot.cache.index.entry import utcnow
from aot.cache.index.reader import SqliteReader
from aot.cache.index.refs import RefOrigin
from aot.cache.index.sql import Index

MANIFEST = '''
[[function]]
name = "m.tiny"
function = "fixtures.models:tiny"
args = ["f32[{n}]", "f32[{n}]"]
vary = { n = [3] }
'''


def _jit(cache: aot.Cache, name: str, body: bytes, days_ago: float) -> None:
    """A KIND jit entry (JAX's persistent cache through aot.jax_cache), last used ``days_ago``."""
    from jax._src import compilation_cache as cc  # only to build a payload as JAX does

    key = f"jit_{name}-{hashlib.sha256(name.encode() + body).hexdigest()}"
    backend = aot.jax_cache.JaxCacheBackend(cache, compile_once=False)
    try:
        backend.put(key, cc.compress_executable(cc.combine_executable_and_time(body, 2)))
    finally:
        backend.close()
    cache.index.jit_touch(key, when=utcnow() - dt.timedelta(days=days_ago))


@pytest.fixture
def busy(open_folder_cache: Any, set_blob_age: Any) -> aot.Cache:
    """A folder cache with a bit of everything gc looks at: entries of several ages,
    superseded ones (a ref'd older one, a legacy newer one), a quarantined one, a
    release (current and rollback target), jit entries, unreferenced blobs (old and
    young), a live and an expired lease."""
    from fixtures.models import tiny

    cache = open_folder_cache()
    now = utcnow()

    def entry(fn: Any, spec: str, name: str, days: float) -> Any:
        e = cache.compile_entry(fn, spec, spec, name=name).entry
        cache.index.touch(e.key, when=now - dt.timedelta(days=days))
        return e

    old = entry(lambda x, y: x + y, "f32[2]", "m.add", 40)
    new = entry(lambda x, y: x - y, "f32[2]", "m.add", 1)  # its ref supersedes ``old``
    entry(lambda x, y: x * y, "f32[4]", "m.mul", 20)
    entry(lambda x, y: x * y + 1, "f32[4]", "m.mul", 10)  # ref'd when compiled: supersedes the one above
    back = entry(lambda x, y: x / y, "f32[5]", "m.div", 50)
    ahead = entry(lambda x, y: x * 2 + y, "f32[5]", "m.div", 45)
    cache.set_refs([back], RefOrigin("rollback"))  # the older one served: the newer superseded
    bad = entry(lambda x, y: x * 3 + y, "f32[6]", "m.bad", 2)
    cache.index.quarantine(bad.key, "test: corrupt")
    stale = entry(tiny, "f32[2]", "m.tiny", 35)  # a signature the manifest no longer lists
    entry(tiny, "f32[3]", "m.tiny", 3)
    first = cache.index.open_release("prod", RefOrigin("test"))
    cache.index.set_refs([(old.name, old.signature, old.env_fp, old.key)], RefOrigin("t"), release_id=first)
    second = cache.index.open_release("prod", RefOrigin("test"))  # ``first`` is its rollback target
    cache.index.set_refs([(ahead.name, ahead.signature, ahead.env_fp, ahead.key)], RefOrigin("t"), release_id=second)
    cache.set_refs([new, back], RefOrigin("restore"))
    _jit(cache, "old_step", b"old" * 300, days_ago=60)
    _jit(cache, "new_step", b"new" * 400, days_ago=0.5)
    orphan_old = cache.blobs.put(b"orphan, old" * 50)
    cache.blobs.put(b"orphan, young" * 50)  # too young for gc: every plan keeps it
    set_blob_age(cache.blobs, orphan_old, maintenance.ORPHAN_GRACE_SECONDS + 60)
    leased = cache.blobs.put(b"leased" * 50)
    set_blob_age(cache.blobs, leased, maintenance.ORPHAN_GRACE_SECONDS + 60)
    cache.index.lease([leased])
    cache.index.lease([cache.blobs.put(b"expired lease" * 50)], seconds=0.0)
    assert cache.refs_named("m.tiny") and stale.key
    return cache


def _plans(cache: aot.Cache, **options: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The dry-run plan of ``options`` made through the stdlib reader, then through the
    SQL index, each as ``--json`` shows it plus the rows an executed gc would delete."""
    out = []
    for reads in (cache.reader, cache.index):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cache, "reader", reads)
            plan = cache.gc(dry_run=True, **options)
            out.append({**plan.to_dict(), "rows": plan._rows, "jit_rows": plan._jit_rows})
    return out[0], out[1]


@pytest.mark.parametrize("options", [
    {},
    {"older_than": "30d"},
    {"older_than": "10d", "kind": "jit"},
    {"max_size": "1K"},
    {"max_size": 10**9, "older_than": "2h", "kind": "aot"},
    {"superseded": True},
    {"superseded": True, "older_than": "30d", "max_size": "2K"},
    {"manifest": "MANIFEST"},
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_both_readers_plan_the_same_gc(
    busy: aot.Cache, options: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert isinstance(busy.reader, SqliteReader) and isinstance(busy.index, Index)
    if "manifest" in options:
        from tests.cli.helpers import REPO

        monkeypatch.chdir(REPO)
        (tmp_path / "m.toml").write_text(MANIFEST)
        options = {**options, "manifest": str(tmp_path / "m.toml")}
    stdlib, sql = _plans(busy, **options)
    assert stdlib == sql
    assert stdlib["entries"] or stdlib["blobs"]  # a plan with something in it
    if options.get("older_than") == "30d":
        reasons = {v["reason"] for v in stdlib["entries"]}
        assert any(r.startswith("quarantined: test: corrupt") for r in reasons)
        assert any(v["kind"] == "jit" for v in stdlib["entries"])
        pinned = " | ".join(v["reason"] for v in stdlib["pinned"])
        for why in ("pinned: release prod (rollback target)", "pinned: served ref of m.div"):
            assert why in pinned
    if options.get("superseded"):
        assert any(v["reason"].startswith("superseded by") for v in stdlib["entries"])
        assert any("superseded by" in v["reason"] for v in stdlib["pinned"]) or "older_than" in options
    if "manifest" in options:
        assert stdlib["dropped_refs"] == [{"name": "m.tiny", "signature": "f32[2], f32[2]"}]


def test_both_readers_refuse_beside_a_lost_index(busy: aot.Cache) -> None:
    """The lost-index guard: an index file replaced by an empty one beside stored blobs."""
    folder = Path(busy.location)
    busy.close()
    for suffix in ("", "-wal", "-shm"):
        (folder / f"index.sqlite{suffix}").unlink(missing_ok=True)
    with aot.Cache(str(folder)) as cache:
        stdlib, sql = _plans(cache)
        assert stdlib == sql
        assert stdlib["blobs"] == [] and "the index was lost, truncated or replaced" in stdlib["warnings"][0]
        stdlib, sql = _plans(cache, force=True)
        assert stdlib == sql and stdlib["warnings"] == [] and stdlib["blobs"]


def test_gc_opens_the_sql_index_only_to_delete(open_folder_cache: Any) -> None:
    """A dry run, a gc with nothing to delete and one that only drops expired leases
    never open the SQL index (so never import SQLAlchemy: test_gc_leases.py); a gc that
    deletes rows or blobs opens it and deletes through it."""
    writer = open_folder_cache()
    e = writer.compile_entry(lambda x: x + 1.0, "f32[2]", name="g").entry
    writer.index.touch(e.key, when=utcnow() - dt.timedelta(days=40))
    writer.index.drop_refs([(e.name, e.signature, e.env_fp)])

    cache = open_folder_cache()
    assert cache._index is None  # a folder cache is read through the stdlib reader
    plan = cache.gc(older_than="30d", dry_run=True)
    assert [v.key for v in plan.entries] == [e.key] and cache._index is None
    nothing = cache.gc(older_than="60d")
    assert nothing.executed and not nothing.dry_run and (nothing.entries, nothing.blobs) == ((), ())
    assert cache._index is None

    writer.index.lease([writer.blobs.put(b"a killed writer's" * 30)], seconds=0.0)
    assert writer.index.has_expired_leases()
    assert cache.gc(older_than="60d").entries == ()  # nothing to delete but the expired lease
    assert cache._index is None and not writer.index.has_expired_leases()  # dropped by the stdlib reader

    done = open_folder_cache().gc(older_than="30d")
    assert done.executed and [v.key for v in done.entries] == [e.key]
    assert writer.index.get(e.key) is None
