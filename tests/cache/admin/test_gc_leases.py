"""An executed gc on a folder cache whose only work is dropping expired leases (killed
writers') drops them through the standard library's reader: no SQL index opened, so no
SQLAlchemy; the same statement (``DROP_EXPIRED_LEASES``), the same lock (SQLite's write
lock, ``BEGIN IMMEDIATE``) and the index's clock, as the SQL index's deletion lock
does; the plan returned and the log are gc's as before."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from aot.cache.admin import maintenance
from aot.cache.admin.maintenance import GcPlan
from aot.cache.index.entry import INDEX_FILE, utcnow


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _leases(folder: Path) -> set[str]:
    with sqlite3.connect(folder / INDEX_FILE) as conn:
        return {d for (d,) in conn.execute("SELECT digest FROM blob_leases")}


def test_a_gc_of_expired_leases_only_drops_them_without_the_sql_index(
    open_folder_cache: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    writer = open_folder_cache()
    writer.index.lease([_digest("killed")], seconds=0.0)  # a writer killed after leasing
    writer.index.lease([_digest("alive")])  # a writer still at work
    folder = Path(writer.location)

    cache = open_folder_cache()
    with caplog.at_level(logging.INFO, logger="aot"):
        plan = cache.gc()
    assert plan == GcPlan((), (), 0, 0, dry_run=False, executed=True, pinned=())
    assert cache._index is None  # the stdlib reader did it: SQLAlchemy never opened
    assert _leases(folder) == {_digest("alive")}
    assert [r.getMessage() for r in caplog.records if r.name == maintenance.__name__] == [
        "gc: dropped 1 expired leases of writers that died",
        "gc: removed 0 entries and 0 blobs, freed 0 B",
    ]
    assert cache.gc().executed and _leases(folder) == {_digest("alive")}  # nothing left to drop


@pytest.mark.parametrize("via", ["stdlib", "sqlalchemy"])
def test_both_paths_expire_leases_on_the_index_clock(open_folder_cache: Any, via: str) -> None:
    """A host whose clock is ahead stamped an entry's last use an hour from now: the
    index's clock (never before that mark) has expired a 10-minute lease this host's
    clock has not; a lease taken after the mark is live on both."""
    writer = open_folder_cache()
    entry = writer.compile_entry(lambda x: x + 1.0, "f32[2]", name="g").entry
    writer.index.lease([_digest("ten minutes")], seconds=600)
    writer.index.touch(entry.key, when=utcnow() + dt.timedelta(hours=1))
    writer.index.lease([_digest("after the mark")], seconds=600)

    cache = open_folder_cache()
    dropping = cache.reader if via == "stdlib" else cache.index
    assert dropping.drop_expired_leases() == 1
    assert _leases(Path(cache.location)) == {_digest("after the mark")}
    assert (cache._index is None) == (via == "stdlib")


def test_the_stdlib_path_waits_for_the_write_lock_as_a_lease_does(open_folder_cache: Any) -> None:
    """A writer inside a write transaction (its lease being inserted) holds the lock:
    gc's drop waits for its commit (busy timeout), then sees what it committed."""
    open_folder_cache()  # creates the index
    cache = open_folder_cache()
    folder = Path(cache.location)
    writer = sqlite3.connect(folder / INDEX_FILE, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute(
            "INSERT INTO blob_leases (token, digest, expires_at) VALUES (?, ?, ?)",
            ("t" * 32, _digest("killed"), "2000-01-01 00:00:00.000000"),
        )
        reads = cache.reader
        dropped: list[int] = []
        gc = threading.Thread(target=lambda: dropped.append(reads.drop_expired_leases()))
        gc.start()
        time.sleep(0.3)
        assert gc.is_alive() and not dropped  # waiting on the writer's lock
        writer.execute("COMMIT")
        gc.join(30)
    finally:
        writer.close()
    assert dropped == [1] and _leases(folder) == set()
