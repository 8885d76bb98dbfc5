"""``Index.add_many`` and ``Index.get_many`` (push and pull commit a batch of rows in one
transaction): as many ``add`` calls would, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from aot.cache.index.leases import LeaseLostError
from aot.cache.index.sql import Index
from tests.cache.index.test_sql import make_entry, sizes

COMPILED = datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)


def test_add_many_commits_every_row_with_its_compile_time_and_releases_the_lease(index: Index) -> None:
    entries = [make_entry(f"batch.n{i}") for i in range(7)]
    shared = make_entry("batch.shared", program_fp=entries[0].program_fp, key="k" * 64)  # one program, two rows
    entries.append(shared)
    index.add(entries[0], blob_sizes=sizes(entries[0]))  # there already: not added again
    index.add(entries[1], blob_sizes=sizes(entries[1]))
    index.quarantine(entries[1].key, "rot")  # quarantined: healed by the copy
    lease = index.lease({d for e in entries for d in sizes(e)})
    before = index.now()
    added = index.add_many([(e, sizes(e), COMPILED) for e in entries], lease=lease)
    assert added == [False, True, True, True, True, True, True, True]
    assert index.leased_digests() == set()
    rows = index.get_many([e.key for e in entries] + ["0" * 64])
    assert sorted(rows) == sorted(e.key for e in entries)  # an absent key is left out
    for e in entries[1:]:
        row = rows[e.key]
        assert (row.name, row.state, row.exe_digest, row.created_at) == (e.name, "ok", e.exe_digest, COMPILED)
        assert row.last_used_at - before < timedelta(minutes=1)  # the server's now
    assert rows[entries[0].key].created_at == entries[0].created_at  # untouched
    assert index.program(shared.program_fp) is not None
    assert set(index.referenced_digests()) >= {d for e in entries for d in sizes(e)}


def test_add_many_writes_nothing_when_gc_took_the_expired_lease(index: Index) -> None:
    entries = [make_entry(f"lost.n{i}") for i in range(3)]
    stale = index.lease({d for e in entries for d in sizes(e)}, seconds=0)
    with index.deletion_lock() as batch:  # gc takes the expired lease
        batch.deletable([entries[0].exe_digest])
    with pytest.raises(LeaseLostError, match="expired"):
        index.add_many([(e, sizes(e), None) for e in entries], lease=stale)
    assert index.get_many([e.key for e in entries]) == {}
    assert index.add_many([], lease=index.lease([entries[0].exe_digest])) == []
    assert index.leased_digests() == set()  # an empty batch gives its lease back
