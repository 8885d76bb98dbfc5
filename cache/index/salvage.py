"""What a damaged SQLite index can still give, and a new index written from it
(``aot repair``; the plan and the blob checks are :mod:`aot.cache.admin.repair`).

SQLite reads a table through its b-tree: one unreadable page stops a full scan, but
rows on the other pages are still reachable by rowid. So each table is read row by
row: a scan in rowid order, and past an error, probes further and further ahead for
the next readable rowid; the table's own indexes (separate b-trees) name rowids, and
for ``artifacts`` the keys and names, of rows that could not be read. Nothing here
writes the damaged file: it is opened as a read-only reader opens an index
(:func:`aot.cache.index.read_only.read_only_open`: no side file created).
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

log = logging.getLogger(__name__)

__all__ = ["SalvagedTable", "damage_of", "salvage", "write_index"]

_MAX_PROBES = 64  # probes past one unreadable region before giving the rest up


@dataclass(frozen=True, slots=True)
class SalvagedTable:
    """The rows of one table that could be read, and what is known of the others."""

    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    #: Rows an index of the table names but that could not be read: their indexed
    #: values (e.g. ``{"key": ..., "name": ...}`` for ``artifacts``).
    lost: tuple[Mapping[str, Any], ...] = field(default=())
    #: The first read error (None: the table was read whole).
    error: str | None = None

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]


def _uri(path: Path) -> str:
    return f"file:{quote(Path(path).resolve().as_posix())}?mode=ro&immutable=1"


def damage_of(path: Path) -> str | None:
    """What is wrong with the SQLite file ``path`` in a few words, read through SQLite
    only: ``truncated (N of M bytes)``, ``corrupt (<SQLite's words>)``, or None when
    ``PRAGMA quick_check`` finds nothing."""
    path = Path(path)
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if size == 0:
        return "empty (0 bytes)"
    if size % 512:  # every SQLite page size is a multiple of 512
        return f"truncated ({size} bytes: not a whole number of pages)"
    try:
        conn = sqlite3.connect(_uri(path), uri=True)
    except sqlite3.Error as exc:
        return f"corrupt ({exc})"
    try:
        try:
            page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
            pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        except sqlite3.Error as exc:
            return f"corrupt ({exc})"
        if size < page_size * pages or size % page_size:
            return f"truncated ({size} bytes, its header declares {page_size * pages})"
        try:
            found = [str(r[0]) for r in conn.execute("PRAGMA quick_check(5)").fetchall()]
        except sqlite3.Error as exc:
            return f"corrupt ({exc})"
    finally:
        conn.close()
    return None if found == ["ok"] else f"corrupt ({'; '.join(found)})"


def salvage(path: Path, tables: Sequence[str]) -> tuple[int | None, list[SalvagedTable], str | None]:
    """(the schema version read, every table of ``tables`` that exists (repair passes
    :func:`aot.cache.index.schema.salvaged_tables`), the error that kept the file from
    being opened at all or None)."""
    from aot.cache.index.read_only import read_only_open

    try:
        # As a read-only reader opens it: no -wal/-shm created (nobody else has it open).
        conn = sqlite3.connect(read_only_open(path).uri, uri=True, isolation_level=None)
        names = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as exc:
        return None, [], str(exc)
    try:
        version = None
        try:
            row = conn.execute("SELECT version FROM schema_version WHERE id = 1").fetchone()
            version = int(row[0]) if row else None
        except sqlite3.Error as exc:
            log.warning("%s: schema version unreadable: %s", path, exc)
        found = [_salvage_table(conn, t) for t in tables if t in names]
    finally:
        conn.close()
    return version, found, None


def _salvage_table(conn: sqlite3.Connection, table: str) -> SalvagedTable:
    columns = tuple(str(r[1]) for r in conn.execute(f'PRAGMA table_info("{table}")'))
    named = _indexed(conn, table)
    rowids, error = _rowids(conn, table, max(named, default=None))
    rows, unread = [], []
    select = ", ".join(f'"{c}"' for c in columns)
    for rowid in sorted(rowids | set(named)):
        try:
            row = conn.execute(f'SELECT {select} FROM "{table}" WHERE rowid = ?', (rowid,)).fetchone()
        except sqlite3.DatabaseError as exc:
            error = error or str(exc)
            row = None
        if row is not None:
            rows.append(tuple(row))
        elif rowid in named:
            unread.append(named[rowid])
    return SalvagedTable(table, columns, tuple(rows), tuple(unread), error)


def _indexed(conn: sqlite3.Connection, table: str) -> dict[int, dict[str, Any]]:
    """rowid -> the values the table's indexes hold for it (each index read until it fails)."""
    out: dict[int, dict[str, Any]] = {}
    try:
        indexes = [str(r[1]) for r in conn.execute(f'PRAGMA index_list("{table}")')]
    except sqlite3.DatabaseError:
        return out
    for index in indexes:
        try:
            cols = [str(r[2]) for r in conn.execute(f'PRAGMA index_info("{index}")') if r[2] is not None]
            if not cols:
                continue
            shown = ", ".join(f'"{c}"' for c in cols)
            query = f'SELECT rowid, {shown} FROM "{table}" INDEXED BY "{index}" ORDER BY "{cols[0]}"'
            for rowid, *values in conn.execute(query):
                out.setdefault(int(rowid), {}).update(zip(cols, values))
        except sqlite3.DatabaseError as exc:
            log.debug("%s: index %s read in part: %s", table, index, exc)
    return out


def _rowids(conn: sqlite3.Connection, table: str, top: int | None) -> tuple[set[int], str | None]:
    """The rowids a scan can reach: in order, and past each unreadable region by
    probing further and further ahead (up to the highest rowid known, ``top``)."""
    found: set[int] = set()
    error = None
    after = -(2**63)
    try:
        row = conn.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()
        if row and row[0] is not None:
            top = max(int(row[0]), top if top is not None else int(row[0]))
    except sqlite3.DatabaseError:
        pass
    while True:
        try:
            for (rowid,) in conn.execute(f'SELECT rowid FROM "{table}" WHERE rowid > ? ORDER BY rowid', (after,)):
                found.add(int(rowid))
                after = int(rowid)
            return found, error
        except sqlite3.DatabaseError as exc:
            error = error or str(exc)
        step, resumed = 1, False
        for _ in range(_MAX_PROBES):
            probe = max(after, 0) + step
            if top is not None and probe > top:
                return found, error
            try:
                row = conn.execute(
                    f'SELECT rowid FROM "{table}" WHERE rowid >= ? ORDER BY rowid LIMIT 1', (probe,)
                ).fetchone()
            except sqlite3.DatabaseError:
                step *= 2
                continue
            if row is None:
                return found, error
            after, resumed = int(row[0]), True  # strictly ahead: every turn makes progress
            found.add(after)
            break
        if not resumed:
            return found, error


def write_index(path: Path, tables: Iterable[tuple[str, Sequence[str], Iterable[Sequence[Any]]]]) -> dict[str, int]:
    """Inserts rows into the new index ``path`` (its schema already created), in one
    transaction; each ``(table, columns, rows)`` keeps the columns the new schema has.
    Returns the rows written per table."""
    written: dict[str, int] = {}
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for table, columns, rows in tables:
            have = {str(r[1]) for r in conn.execute(f'PRAGMA table_info("{table}")')}
            keep = [i for i, c in enumerate(columns) if c in have]
            names = ", ".join(f'"{columns[i]}"' for i in keep)
            marks = ", ".join("?" * len(keep))
            rows = list(rows)
            if table == "schema_version":
                continue
            if rows and table in ("cache_meta", "index_state", "default_release"):
                conn.execute(f'DELETE FROM "{table}"')  # one row each, created with the schema
            count = 0
            for row in rows:
                cur = conn.execute(
                    f'INSERT OR IGNORE INTO "{table}" ({names}) VALUES ({marks})', [row[i] for i in keep]
                )
                count += cur.rowcount
            written[table] = count
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.close()
    return written
