"""gc's reads of :class:`~aot.cache.index.protocol.IndexReader` with the standard
library (:class:`SqliteGcReads`, a part of :class:`~aot.cache.index.reader.SqliteReader`),
so that ``aot gc --dry-run``, and a gc with nothing to delete, never import SQLAlchemy
(0.4-0.6 s of a 0.7 s command).

Each read here is the SQL index's statement (:mod:`aot.cache.index.queries`,
:mod:`~aot.cache.index.gc_protocol`, :mod:`~aot.cache.index.state`,
:mod:`~aot.cache.index.refs_sql`) in SQLite's text, and the rows go through the same
helpers (:func:`~aot.cache.index.entry.gc_rows_of_sqlite`,
:func:`~aot.cache.index.entry.sqlite_clock`, :func:`~aot.cache.index.refs.pin_reasons`):
tests/cache/admin/test_gc_reads.py checks that both readers plan the same gc.
Deleting rows and blobs stays with the SQL index and its protocol; a gc whose only
work is the expired leases of killed writers drops them here
(:meth:`SqliteGcReads.drop_expired_leases`), with the SQL index's statement
(:data:`DROP_EXPIRED_LEASES`) under the same lock, so that it imports no SQLAlchemy.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from aot.cache.index.entry import GC_COLUMNS, GcRow, gc_rows_of_sqlite, sqlite_clock, sqlite_utc
from aot.cache.index.refs import pin_reasons

__all__ = ["DROP_EXPIRED_LEASES", "SqliteGcReads"]

#: Values per ``IN (...)`` list, five lists a statement: under SQLite's oldest limit
#: of 999 bound variables.
_IN_CHUNK = 190

#: How SQLAlchemy writes a time into the SQLite index (naive UTC): compared as text.
_SQLITE_TIME = "%Y-%m-%d %H:%M:%S.%f"

_GC_SELECT = f"SELECT {', '.join(GC_COLUMNS)} FROM artifacts"

#: The index's clock on SQLite (:func:`aot.cache.index.engine.server_now`): this host's
#: time, the latest last use, the latest ref change.
_NOW_SELECT = (
    "SELECT strftime('%Y-%m-%d %H:%M:%f000', 'now'), (SELECT max(last_used_at) FROM artifacts), "
    "(SELECT set_at FROM ref_history ORDER BY seq DESC LIMIT 1)"
)

#: gc's deletion of the leases killed writers left, ``:now`` the index's clock read in
#: the same transaction: the one statement of both
#: :meth:`~aot.cache.index.gc_protocol.DeletionBatch.drop_expired_leases` (SQLAlchemy,
#: SQLite and PostgreSQL) and :meth:`SqliteGcReads.drop_expired_leases` (sqlite3).
DROP_EXPIRED_LEASES = "DELETE FROM blob_leases WHERE expires_at <= :now"


class SqliteGcReads:
    """gc's reads with :mod:`sqlite3` (the rest of the protocol is
    :class:`~aot.cache.index.reader.SqliteReader`'s)."""

    def _execute(self, query: str, params: Sequence[object] = ()) -> list[Any]:
        raise NotImplementedError  # SqliteReader's

    def _write(self, what: str) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError  # SqliteReader's

    def gc_rows(self) -> list[GcRow]:
        """Every artifact row as gc plans with it, as :meth:`Index.gc_rows`."""
        return gc_rows_of_sqlite(self._execute(_GC_SELECT))

    def now(self) -> datetime:
        """The index's clock, as the SQL index's ``now()`` on SQLite: this host's, never
        before the latest last use or ref change stored, plus a microsecond."""
        ((host, used, ref),) = self._execute(_NOW_SELECT)
        return _index_clock(host, used, ref)

    def drop_expired_leases(self) -> int:
        """Deletes every expired lease (killed writers'), as gc does under the SQL
        index's deletion lock: in one ``BEGIN IMMEDIATE`` transaction (the write lock
        every lease and lease release waits for), on the index's clock read inside it,
        with :data:`DROP_EXPIRED_LEASES`; how many."""
        with self._write("drop expired leases") as conn:
            ((host, used, ref),) = conn.execute(_NOW_SELECT).fetchall()
            now = _index_clock(host, used, ref).replace(tzinfo=None).strftime(_SQLITE_TIME)
            return int(conn.execute(DROP_EXPIRED_LEASES, {"now": now}).rowcount)

    def pinned_keys(self, *, excluding: Collection[str] = ()) -> dict[str, str]:
        """``{key: why}`` of the keys a ref or a live release pins, as the SQL index's."""
        return {key: whys[0] for key, whys in self.pin_reasons(excluding=excluding).items()}

    def pin_reasons(self, *, excluding: Collection[str] = ()) -> dict[str, list[str]]:
        """Every reason for each pinned key, as the SQL index's."""
        def members(ids: list[int]) -> list[Any]:
            marks = ", ".join("?" * len(ids))
            return self._execute(f"SELECT key, release_id FROM release_members WHERE release_id IN ({marks})", ids)

        return pin_reasons(
            self._execute("SELECT key, name FROM refs"),
            self._execute("SELECT label, id, previous FROM releases"),
            members, excluding,
        )

    def leased_digests(self) -> set[str]:
        """Digests under a live lease (writes in progress), on the index's clock."""
        now = self.now().replace(tzinfo=None).strftime(_SQLITE_TIME)
        return {str(d) for (d,) in self._execute("SELECT digest FROM blob_leases WHERE expires_at > ?", [now])}

    def has_expired_leases(self) -> bool:
        """Whether a lease has expired (a killed writer's): an executed gc drops them."""
        now = self.now().replace(tzinfo=None).strftime(_SQLITE_TIME)
        return bool(self._execute("SELECT 1 FROM blob_leases WHERE expires_at <= ? LIMIT 1", [now]))

    def referenced_digests(self) -> set[str]:
        """Every blob digest an artifact, program or jit entry row references."""
        rows = self._execute(
            "SELECT exe_digest FROM artifacts WHERE exe_digest IS NOT NULL "
            "UNION SELECT hlo_digest FROM artifacts WHERE hlo_digest IS NOT NULL "
            "UNION SELECT manifest_digest FROM artifacts WHERE manifest_digest IS NOT NULL "
            "UNION SELECT const_digest FROM artifacts WHERE const_digest IS NOT NULL "
            "UNION SELECT hlo_digest FROM programs WHERE hlo_digest IS NOT NULL "
            "UNION SELECT digest FROM jit_entries"
        )
        return {str(d) for (d,) in rows if d is not None}

    def referenced_among(self, digests: Collection[str]) -> set[str]:
        """Those of ``digests`` a row references, through the digest columns' indexes."""
        ordered = sorted(set(digests))
        out: set[str] = set()
        for i in range(0, len(ordered), _IN_CHUNK):
            chunk = ordered[i : i + _IN_CHUNK]
            marks = ", ".join("?" * len(chunk))
            rows = self._execute(
                f"SELECT exe_digest FROM artifacts WHERE exe_digest IN ({marks}) "
                f"UNION SELECT hlo_digest FROM artifacts WHERE hlo_digest IN ({marks}) "
                f"UNION SELECT manifest_digest FROM artifacts WHERE manifest_digest IN ({marks}) "
                f"UNION SELECT const_digest FROM artifacts WHERE const_digest IN ({marks}) "
                f"UNION SELECT hlo_digest FROM programs WHERE hlo_digest IN ({marks}) "
                f"UNION SELECT digest FROM jit_entries WHERE digest IN ({marks})",
                chunk * 6,
            )
            out.update(str(d) for (d,) in rows if d is not None)
        return out

    def emptiness(self) -> tuple[bool, datetime | None]:
        """Whether the index has no artifact, program or jit entry row and, if so, when a
        deletion of its own left it so (one statement: one snapshot), as the SQL index's."""
        ((empty, emptied_at),) = self._execute(
            "SELECT NOT EXISTS (SELECT 1 FROM artifacts) AND NOT EXISTS (SELECT 1 FROM programs) "
            "AND NOT EXISTS (SELECT 1 FROM jit_entries), (SELECT emptied_at FROM index_state WHERE id = 1)"
        )
        if not empty:
            return False, None
        return True, None if emptied_at is None else sqlite_utc(str(emptied_at))


def _index_clock(host: object, used: object, ref: object) -> datetime:
    """:data:`_NOW_SELECT`'s row as the index's clock (:func:`sqlite_clock`)."""
    marks = [sqlite_utc(str(t)) for t in (used, ref) if t is not None]
    return sqlite_clock(sqlite_utc(str(host)), max(marks) if marks else None)
