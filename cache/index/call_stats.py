"""The serving statistics' rows in the index (``call_stats``, the ``hits`` and last use
of the called entries): their columns, and the statements that write them, through
the SQL index (:class:`IndexSink`) or, for a folder cache's serving process that never
imported SQLAlchemy, with the standard library (:class:`SqliteFileSink`). The recorder
that batches them is :mod:`aot.cache.stats_recorder`; the reads are the index's
``call_stats`` (:class:`~aot.cache.index.protocol.IndexReader`)."""

from __future__ import annotations

import fnmatch
import os
import sqlite3
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aot.errors import CacheError

if TYPE_CHECKING:
    from aot.cache.index.sql import Index

__all__ = ["COUNTERS", "REASONS", "IndexSink", "SqliteFileSink", "delete_call_stats"]

#: The counted columns of ``call_stats`` (added to on every flush), and the reasons
#: (the last one kept).
COUNTERS = (
    "calls", "loads", "load_seconds", "saved_seconds", "misses", "recompiles", "recompile_seconds",
)
REASONS = ("miss_reason", "recompile_reason")


class IndexSink:
    """Writes through the SQLAlchemy index (PostgreSQL, SQLite URLs)."""

    def __init__(self, index: Index) -> None:
        self.index = index
        self.location = index.url

    def write(self, rows: list[dict[str, Any]], touches: Mapping[str, int]) -> None:
        import sqlalchemy as sa

        from aot.cache.index.engine import server_now
        from aot.cache.index.schema import ARTIFACTS, CALL_STATS

        artifacts, call_stats = ARTIFACTS, CALL_STATS
        with self.index._write("record call statistics") as conn:
            now = server_now(conn)
            if rows:
                stmt = _upsert(conn, call_stats)
                updates: dict[str, Any] = {
                    c: call_stats.c[c] + stmt.excluded[c] for c in COUNTERS
                }
                for reason in REASONS:
                    updates[reason] = sa.func.coalesce(stmt.excluded[reason], call_stats.c[reason])
                updates["updated_at"] = stmt.excluded.updated_at
                stmt = stmt.on_conflict_do_update(
                    index_elements=[call_stats.c.env_fp, call_stats.c.name, call_stats.c.signature_digest],
                    set_=updates,
                )
                for row in rows:
                    conn.execute(stmt, {**row, "created_at": now, "updated_at": now})
            if touches:
                conn.execute(
                    sa.update(artifacts)
                    .where(artifacts.c.key == sa.bindparam("k"))
                    .values(hits=artifacts.c.hits + sa.bindparam("n"), last_used_at=now),
                    [{"k": key, "n": n} for key, n in sorted(touches.items())],
                )


def _upsert(conn: Any, table: Any) -> Any:
    """An INSERT that takes ``on_conflict_do_update``, in the connection's dialect."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table)
    from sqlalchemy.dialects import sqlite

    return sqlite.insert(table)


_SQLITE_UPSERT = (
    "INSERT INTO call_stats (env_fp, name, signature_digest, signature, "
    + ", ".join(COUNTERS) + ", " + ", ".join(REASONS) + ", created_at, updated_at) VALUES ("
    + ", ".join("?" * (4 + len(COUNTERS) + len(REASONS) + 2)) + ") "
    "ON CONFLICT (env_fp, name, signature_digest) DO UPDATE SET "
    + ", ".join(f"{c} = {c} + excluded.{c}" for c in COUNTERS) + ", "
    + ", ".join(f"{r} = coalesce(excluded.{r}, {r})" for r in REASONS)
    + ", updated_at = excluded.updated_at"
)
# The SQL index's own text format for SQLite timestamps (see aot.cache.index.engine.server_now_expr).
_SQLITE_NOW = "SELECT strftime('%Y-%m-%d %H:%M:%f000', 'now')"


def _pause_point(point: str) -> None:
    """:func:`aot.cache.pauses.reached`, without importing that module into a serving
    process that no test pauses (serving imports only what it needs: tests check it)."""
    if os.environ.get("AOT_TEST_PAUSE") or "aot.cache.pauses" in sys.modules:
        from aot.cache.pauses import reached

        reached(point)


class SqliteFileSink:
    """Writes a folder cache's ``index.sqlite`` with the standard library, so that a
    serving process that never imported SQLAlchemy does not import it to count calls."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.location = str(path)

    def write(self, rows: list[dict[str, Any]], touches: Mapping[str, int]) -> None:
        try:
            conn = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise CacheError(f"cannot open {self.path} to record call statistics: {exc}") from exc
        try:
            conn.execute("BEGIN IMMEDIATE")
            (now,) = conn.execute(_SQLITE_NOW).fetchone()
            for row in rows:
                values = [row["env_fp"], row["name"], row["signature_digest"], row["signature"]]
                values += [row[c] for c in COUNTERS] + [row[r] for r in REASONS] + [now, now]
                conn.execute(_SQLITE_UPSERT, values)
            conn.executemany(
                "UPDATE artifacts SET hits = hits + ?, last_used_at = ? WHERE key = ?",
                [(n, now, key) for key, n in sorted(touches.items())],
            )
            _pause_point("stats.flushing")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise CacheError(f"cannot record call statistics in {self.path}: {exc}") from exc
        finally:
            conn.close()


def delete_call_stats(index: Index, name_glob: str | None = None, env_fp: str | None = None) -> int:
    """Deletes the statistics rows whose name matches ``name_glob`` (None: every row),
    of environment ``env_fp`` (None: all); how many."""
    import sqlalchemy as sa

    from aot.cache.index.schema import CALL_STATS

    with index._read("read call statistics") as conn:
        columns = (CALL_STATS.c.env_fp, CALL_STATS.c.name, CALL_STATS.c.signature_digest)
        rows = conn.execute(sa.select(*columns)).all()
    doomed = [
        r for r in rows
        if (name_glob is None or fnmatch.fnmatchcase(r.name, name_glob)) and env_fp in (None, r.env_fp)
    ]
    if doomed:
        with index._write("reset call statistics") as conn:
            for r in doomed:
                conn.execute(sa.delete(CALL_STATS).where(
                    CALL_STATS.c.env_fp == r.env_fp, CALL_STATS.c.name == r.name,
                    CALL_STATS.c.signature_digest == r.signature_digest,
                ))
    return len(doomed)
