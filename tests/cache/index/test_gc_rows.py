"""gc's slim rows (``Index.gc_rows``): the entries' columns gc plans with, read without
the manifest, IndexEntry or the timestamp type, in the entries' order; and the
narrowed look-up of referenced digests (``Index.referenced_among``)."""

from __future__ import annotations

import datetime as dt
import gc
import sqlite3
from pathlib import Path

import aot
from aot.cache.index.entry import GcRow, collector_paused, utcnow

_PLANNED = GcRow._fields


def _as_planned(rows) -> list[tuple]:  # noqa: ANN001
    return [tuple(getattr(r, f) for f in _PLANNED) for r in rows]


def test_gc_rows_are_the_entries_columns_in_the_entries_order(cache: aot.Cache, compiled) -> None:  # noqa: ANN001
    keys = [cache.put_artifact(a).key for a in compiled.mlp.values()]
    cache.index.touch(keys[0], when=utcnow() - dt.timedelta(days=3, microseconds=7))
    cache.index.quarantine(keys[1], "bad digest")

    rows = cache.index.gc_rows()
    entries = cache.index.entries()
    assert _as_planned(rows) == _as_planned(entries)
    assert {r.key: r.ok for r in rows} == {keys[0]: True, keys[1]: False, keys[2]: True}
    assert all(r.last_used_at.tzinfo is dt.timezone.utc for r in rows)


def test_times_not_written_by_the_index_are_read_as_the_entries_read_them(
    open_folder_cache, compiled,  # noqa: ANN001
) -> None:
    """SQLite stores text: a row written by another tool (an offset, no fraction, a
    'T') is read like SQLAlchemy's DateTime reads it, in the same order."""
    cache = open_folder_cache()
    keys = [cache.put_artifact(a).key for a in compiled.mlp.values()]
    db = sqlite3.connect(Path(cache.location) / "index.sqlite")
    with db:
        db.execute("UPDATE artifacts SET last_used_at = '2024-01-01T02:00:00+02:00' WHERE key = ?", (keys[0],))
        db.execute("UPDATE artifacts SET created_at = '2024-01-01 00:00:00' WHERE key = ?", (keys[1],))
    db.close()

    rows = {r.key: r for r in cache.index.gc_rows()}
    assert rows[keys[0]].last_used_at == dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    assert rows[keys[1]].created_at == dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    assert _as_planned(cache.index.gc_rows()) == _as_planned(cache.index.entries())


def test_referenced_among_is_referenced_digests_narrowed(cache: aot.Cache, compiled) -> None:  # noqa: ANN001
    entry = cache.put_artifact(compiled.mlp[1])
    stranger = "f" * 64
    candidates = [entry.exe_digest, entry.hlo_digest, stranger]
    assert cache.index.referenced_among(candidates) == {entry.exe_digest, entry.hlo_digest}
    assert cache.index.referenced_among(candidates) == cache.index.referenced_digests() & set(candidates)
    assert cache.index.referenced_among([]) == set()


def test_collector_paused_restores_the_collector_as_it_was() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a caller's own choice is left alone
    finally:
        gc.enable()
