"""Serve-time reads of a folder cache's SQLite index with the standard library.

``aot.load`` at start-up needs three things from the index: the rows of one name,
a schema-version check, and a touch of the rows it loads. Importing SQLAlchemy costs
a serving process about half a second, more than loading an executable, so these go
through :mod:`sqlite3` against the schema :mod:`aot.cache.index` creates. Everything
else (writes, gc, verify, PostgreSQL) uses the SQLAlchemy index.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path

from aot.cache.entry import SCHEMA_VERSION, IndexEntry, utcnow
from aot.errors import CacheError

log = logging.getLogger(__name__)

_COLUMNS = tuple(f.name for f in fields(IndexEntry))
_TIMES = {"created_at", "last_used_at"}
_BUSY_TIMEOUT_S = 30.0


def _time(value: object) -> datetime:
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return parsed.replace(tzinfo=timezone.utc) if parsed.tzinfo is None else parsed


class SqliteReader:
    """Read rows by name and touch them; opened only on an existing, current index."""

    def __init__(self, path: Path, *, read_only: bool) -> None:
        self.path = path
        self.read_only = read_only
        mode = "ro" if read_only else "rw"
        try:
            self._conn = sqlite3.connect(
                f"file:{path}?mode={mode}", uri=True, timeout=_BUSY_TIMEOUT_S,
                check_same_thread=False, isolation_level=None,
            )
            self._conn.execute("PRAGMA synchronous=NORMAL")  # as the SQL index: WAL mode
            row = self._conn.execute("SELECT version FROM schema_version WHERE id = 1").fetchone()
        except sqlite3.Error as exc:
            raise CacheError(f"cannot read the cache index {path}: {exc}") from exc
        self.version = int(row[0]) if row else 0
        if self.version != SCHEMA_VERSION:
            self._conn.close()
            raise CacheError(
                f"the cache index {path} has schema version {self.version}; this jax-aot "
                f"reads version {SCHEMA_VERSION} (open it once with a writable Cache to "
                "migrate, or upgrade jax-aot)"
            )

    def by_name(self, name: str, env_fp: str | None = None, state: str | None = "ok") -> list[IndexEntry]:
        query = f"SELECT {', '.join(_COLUMNS)} FROM artifacts WHERE name = ?"
        params: list[object] = [name]
        if env_fp is not None:
            query += " AND env_fp = ?"
            params.append(env_fp)
        if state is not None:
            query += " AND state = ?"
            params.append(state)
        query += " ORDER BY created_at, key"
        try:
            rows = self._conn.execute(query, params).fetchall()
        except sqlite3.Error as exc:
            raise CacheError(f"cannot read the cache index {self.path}: {exc}") from exc
        return [
            IndexEntry(*(_time(v) if c in _TIMES else v for c, v in zip(_COLUMNS, row)))
            for row in rows
        ]

    def touch(self, key: str) -> None:
        """Records a use (last-used time, hit count); never fails a load."""
        if self.read_only:
            return
        now = utcnow().strftime("%Y-%m-%d %H:%M:%S.%f")  # SQLAlchemy's SQLite format
        try:
            self._conn.execute(
                "UPDATE artifacts SET last_used_at = ?, hits = hits + 1 WHERE key = ?", (now, key)
            )
        except sqlite3.Error as exc:
            log.warning("could not record the use of %s in %s: %s", key[:12], self.path, exc)

    def close(self) -> None:
        self._conn.close()
