"""Reads of a folder cache's SQLite index with the standard library.

``aot.load`` and the cache's own lookups need a few things from the index
(:class:`~aot.cache.index.protocol.IndexReader`): the rows of one name, the row of one
key (to re-read a row whose blobs failed, or before a write), the names (to suggest one
for a mistyped name), a schema-version check, and a touch of the rows it loads.
Importing SQLAlchemy costs a serving process more than loading an executable, so for a
folder cache these go through :mod:`sqlite3` against the schema
:mod:`aot.cache.index.schema` creates. The listing commands, gc's plan
(:mod:`aot.cache.index.gc_reads`) and a copy's check that nothing needs copying
(:mod:`aot.cache.admin.up_to_date`) read through it too, and a gc whose only work is
dropping expired leases drops them through it; everything else (writes, gc's other
deletions, verify, PostgreSQL) uses the SQLAlchemy index (:mod:`aot.cache.index.sql`).
"""

from __future__ import annotations

import fnmatch
import logging
import sqlite3
import threading
from contextlib import contextmanager
from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from aot.cache.index.advice import advice_for, damaged_index_message, reason_of
from aot.cache.index.entry import SCHEMA_VERSION, SQLITE_BUSY_TIMEOUT_MS, IndexEntry, utcnow
from aot.cache.index.gc_reads import SqliteGcReads
from aot.cache.index.globs import glob_to_like, like_escape, name_range
from aot.cache.index.read_only import ReadOnlyOpen, file_stamp, read_only_file_system, read_only_open, stale_immutable
from aot.cache.index.refs import Ref, ReleaseMember
from aot.errors import CacheError, ReadOnlyCacheError

if TYPE_CHECKING:
    from aot.cache.index.jit_records import JitEntry, JitStats

log = logging.getLogger(__name__)

_COLUMNS = tuple(f.name for f in fields(IndexEntry))
_TIMES = {"created_at", "last_used_at"}
_TIME_AT = tuple(i for i, c in enumerate(_COLUMNS) if c in _TIMES)  # their positions
_REF_COLUMNS = tuple(f.name for f in fields(Ref))
_REF_SELECT = ", ".join(f'"{c}"' for c in _REF_COLUMNS)  # quoted: "commit" is a keyword
#: Values per ``IN (...)`` list: under SQLite's oldest limit of 999 bound variables.
_IN_CHUNK = 500
#: (name, signature) pairs per statement: their names and the pairs' two values each.
_PAIR_CHUNK = 300
_CALL_STATS_COLUMNS = (
    "env_fp", "name", "signature_digest", "signature", "calls", "loads", "load_seconds",
    "saved_seconds", "misses", "miss_reason", "recompiles", "recompile_seconds",
    "recompile_reason", "created_at", "updated_at",
)


def _time(value: object) -> datetime:
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return parsed.replace(tzinfo=timezone.utc) if parsed.tzinfo is None else parsed


def _naive_utc_time(value: object) -> datetime:
    """:func:`_time`, with a fast path for the naive UTC text the index writes (``aot
    stats`` parses two per statistics row)."""
    try:
        return datetime.fromisoformat(value + "+00:00")  # type: ignore[operator]
    except (TypeError, ValueError):  # a datetime, an offset already, or not ISO text
        return _time(value)


def _in_lists(keys: Collection[str]) -> Iterator[tuple[list[str], str]]:
    """The distinct ``keys`` (or names), sorted, in chunks for ``IN (...)``, each with its ``?, ?`` list."""
    ordered = sorted(set(keys))
    for i in range(0, len(ordered), _IN_CHUNK):
        chunk = ordered[i : i + _IN_CHUNK]
        yield chunk, ", ".join("?" * len(chunk))


class SqliteReader(SqliteGcReads):
    """The :class:`~aot.cache.index.protocol.IndexReader` of a folder cache's
    ``index.sqlite`` with :mod:`sqlite3` (gc's reads: :class:`SqliteGcReads`); opened
    only on an existing, current index."""

    def __init__(self, path: Path, *, read_only: bool) -> None:
        self.path = path
        self.read_only = read_only
        self._opened: ReadOnlyOpen | None = None
        self._lock = threading.Lock()  # one statement at a time; a reopen swaps _conn
        self._conn, self.version = self._connect()
        if self.version != SCHEMA_VERSION:
            self._conn.close()
            raise CacheError(
                f"the cache index {path} has schema version {self.version}; this jax-aot "
                f"reads version {SCHEMA_VERSION} (open it once with a writable Cache to "
                "migrate, or upgrade jax-aot)"
            )

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of this file, as the SQL index names it."""
        return f"sqlite:///{self.path}"

    def _connect(self) -> tuple[sqlite3.Connection, int]:
        """A connection and the schema version it reads."""
        if not self.read_only:
            uri = f"file:{quote(Path(self.path).resolve().as_posix())}?mode=rw"
            return self._open(uri, pragmas=("PRAGMA synchronous=NORMAL",))  # WAL, as the SQL index
        self._opened = read_only_open(self.path)
        log.debug("reading %s read-only (%s)", self.path, self._opened.reason)
        try:
            return self._open(self._opened.uri)
        except CacheError as exc:
            if self._opened.immutable:
                raise
            # A -shm left by a crashed writer needs a recovery only a writer can run.
            log.warning(
                "%s: cannot read through the existing -shm file (%s); reading the database "
                "file alone, without the transactions still in its -wal", self.path, exc,
            )
            base = self._opened.uri
            self._opened = ReadOnlyOpen(
                base + "&immutable=1", True, "unreadable -shm: immutable", file_stamp(self.path),
                watch_shm=False,
            )
            return self._open(self._opened.uri)

    def _open(self, uri: str, pragmas: tuple[str, ...] = ()) -> tuple[sqlite3.Connection, int]:
        conn = None
        try:
            conn = sqlite3.connect(
                uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000, check_same_thread=False,
                isolation_level=None,
            )
            for pragma in pragmas:
                conn.execute(pragma)
            row = conn.execute("SELECT version FROM schema_version WHERE id = 1").fetchone()
        except sqlite3.Error as exc:
            if conn is not None:
                conn.close()
            raise CacheError(f"cannot read the cache index {self.path}: {exc}{advice_for(str(exc), self.read_only)}") from exc
        return conn, int(row[0]) if row else 0

    def _execute(self, query: str, params: Sequence[object] = ()) -> list[Any]:
        with self._lock:
            if self._opened is not None and stale_immutable(self.path, self._opened):
                log.info("%s: a writer opened the cache; reading through its -shm from now on", self.path)
                self._conn.close()
                self._conn, _ = self._connect()
            try:
                return self._conn.execute(query, params).fetchall()
            except sqlite3.Error as exc:
                raise CacheError(f"cannot read the cache index {self.path}: {exc}{advice_for(str(exc), self.read_only)}") from exc

    @contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction on this connection, begun as the SQL index begins its
        writes (``BEGIN IMMEDIATE``: the database's write lock, waited for up to the busy
        timeout); a failure worded as the SQL index words it."""
        if self.read_only:
            raise ReadOnlyCacheError(
                f"cannot {what}: the cache index at {self.url} was opened read-only; "
                f"open the cache without read_only=True to modify it"
            )
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                    self._conn.execute("COMMIT")
                finally:
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                reason = reason_of(exc)
                raise CacheError(
                    f"{what} failed on the cache index at {self.url}: {reason}{advice_for(reason)}"
                ) from exc

    def by_name(self, name: str, env_fp: str | None = None, state: str | None = "ok") -> list[IndexEntry]:
        """Rows stored under ``name`` (for one environment; ``state=None``: any), oldest first."""
        query = f"SELECT {', '.join(_COLUMNS)} FROM artifacts WHERE name = ?"
        params: list[object] = [name]
        if env_fp is not None:
            query += " AND env_fp = ?"
            params.append(env_fp)
        if state is not None:
            query += " AND state = ?"
            params.append(state)
        # Sorted here, not by SQLite: its ORDER BY copies every row, manifest and all,
        # through a temporary B-tree (a name of 1,000 signatures: 3 ms, not 10-20).
        rows = self._rows(query, params)
        rows.sort(key=lambda e: (e.created_at, e.key))
        return rows

    def get(self, key: str) -> IndexEntry | None:
        """The row of ``key`` as it is now (None: not stored)."""
        rows = self._rows(f"SELECT {', '.join(_COLUMNS)} FROM artifacts WHERE key = ?", [key])
        return rows[0] if rows else None

    def get_many(self, keys: Collection[str]) -> dict[str, IndexEntry]:
        """``{key: row}`` of the stored ``keys`` (absent keys are left out), as the SQL
        index's (a copy's check that nothing needs copying, :mod:`aot.cache.admin.up_to_date`)."""
        out: dict[str, IndexEntry] = {}
        for chunk, marks in _in_lists(keys):
            rows = self._rows(f"SELECT {', '.join(_COLUMNS)} FROM artifacts WHERE key IN ({marks})", chunk)
            out.update((entry.key, entry) for entry in rows)
        return out

    def names(self) -> list[str]:
        """Every name with at least one row (for "did you mean" suggestions)."""
        return sorted(str(r[0]) for r in self._execute("SELECT DISTINCT name FROM artifacts"))

    def refs_named(self, name: str, env_fp: str | None = None) -> list[Ref]:
        """The current refs of ``name`` (of one environment)."""
        query = f"SELECT {_REF_SELECT} FROM refs WHERE name = ?"
        params: list[object] = [name]
        if env_fp is not None:
            query += " AND env_fp = ?"
            params.append(env_fp)
        rows = self._execute(query + " ORDER BY signature, env_fp", params)
        return [_ref(row) for row in rows]

    def release_members(self, label: str, name: str) -> tuple[ReleaseMember, ...] | None:
        """The members of ``name`` in ``label``'s current set (None: no such label)."""
        found = self._execute("SELECT max(id) FROM releases WHERE label = ?", [label])
        if not found or found[0][0] is None:
            return None
        rows = self._execute(
            "SELECT name, signature, env_fp, key FROM release_members WHERE release_id = ? AND name = ?"
            " ORDER BY signature", [found[0][0], name],
        )
        return tuple(ReleaseMember(*row) for row in rows)

    def default_release(self) -> str | None:
        """The cache's declared default release (None: none declared)."""
        rows = self._execute("SELECT label FROM default_release WHERE id = 1", [])
        return rows[0][0] if rows else None

    # The reads of the listing commands (aot ls, show), as the SQL index answers them,
    # so that they import neither SQLAlchemy nor JAX.

    def entries(self, name_glob: str | None = None) -> list[IndexEntry]:
        """All rows, or those whose name matches an fnmatch glob, by name, age, key."""
        query = f"SELECT {', '.join(_COLUMNS)} FROM artifacts"
        params: list[object] = []
        if name_glob is not None and name_glob != "*":
            query += " WHERE name LIKE ? ESCAPE '\\'"
            params.append(glob_to_like(name_glob))
            bounds = name_range(name_glob)
            if bounds is not None:  # the index on name narrows (binary collation)
                query += " AND name >= ? AND name < ?"
                params += list(bounds)
        rows = self._rows(query + " ORDER BY name, created_at, key", params)
        if name_glob is not None and name_glob != "*":  # LIKE ignores case, has no [...]
            rows = [e for e in rows if fnmatch.fnmatchcase(e.name, name_glob)]
        return rows

    def find_key_prefix(self, prefix: str, *, limit: int | None = None) -> list[str]:
        """Keys starting with ``prefix`` (abbreviated keys on the command line)."""
        query = "SELECT key FROM artifacts WHERE key LIKE ? ESCAPE '\\' ORDER BY key"
        params: list[object] = [like_escape(prefix) + "%"]
        if limit is not None:
            query += " LIMIT ?"
            params.append(int(limit))
        return [str(r[0]) for r in self._execute(query, params) if str(r[0]).startswith(prefix)]

    def refs(self, name_glob: str | None = None) -> list[Ref]:
        """Every current ref, or those whose name matches an fnmatch glob, by name and signature."""
        query = f"SELECT {_REF_SELECT} FROM refs"
        params: list[object] = []
        if name_glob is not None and name_glob != "*":
            query += " WHERE name LIKE ? ESCAPE '\\'"
            params.append(glob_to_like(name_glob))
        rows = self._execute(query + " ORDER BY name, signature", params)
        found = [_ref(row) for row in rows]
        return [r for r in found if name_glob in (None, "*") or fnmatch.fnmatchcase(r.name, name_glob)]

    def blob_sizes(self) -> dict[str, int]:
        """``{digest: stored size}`` of every registered blob."""
        return {str(d): int(n) for d, n in self._execute("SELECT digest, stored_size FROM blobs")}

    def release_labels(self) -> list[str]:
        """Every release label, sorted."""
        return [str(r[0]) for r in self._execute("SELECT DISTINCT label FROM releases ORDER BY label")]

    def call_stats(self, name_glob: str | None = None, env_fp: str | None = None) -> list[dict[str, Any]]:
        """The serving statistics rows (names matching an fnmatch glob; of one
        environment) as the columns of ``call_stats``, times in UTC."""
        query = f"SELECT {', '.join(_CALL_STATS_COLUMNS)} FROM call_stats"
        where, params = [], []  # type: ignore[var-annotated]
        if name_glob is not None and name_glob != "*":
            where.append("name LIKE ? ESCAPE '\\'")
            params.append(glob_to_like(name_glob))
        if env_fp is not None:
            where.append("env_fp = ?")
            params.append(env_fp)
        if where:
            query += " WHERE " + " AND ".join(where)
        rows = [dict(zip(_CALL_STATS_COLUMNS, row)) for row in self._execute(query, params)]
        for row in rows:
            for column in ("created_at", "updated_at"):
                if row[column] is not None:
                    row[column] = _naive_utc_time(row[column])
        return [r for r in rows if name_glob is None or fnmatch.fnmatchcase(r["name"], name_glob)]

    def signature_keys(self, names: Collection[str]) -> dict[tuple[str, str], str]:
        """One key (the smallest) per (name, flat signature) stored under ``names``, in
        any state and environment, without reading a manifest, as the SQL index's."""
        out: dict[tuple[str, str], str] = {}
        for chunk, marks in _in_lists(names):
            query = (
                f"SELECT name, signature, MIN(key) FROM artifacts WHERE name IN ({marks}) "
                "GROUP BY name, signature"
            )
            for name, signature, key in self._execute(query, chunk):  # TEXT columns: str already
                out[(name, signature)] = key
        return out

    def signature_manifests(self, pairs: Collection[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """``{(name, flat signature): manifest JSON}`` of the smallest key stored under
        each of ``pairs``, in any state and environment (pairs without an entry are left
        out), as the SQL index's. Every row of the pairs' names is visited (no index
        holds the signature), but only the pairs' rows are grouped, and the manifests
        are then read by rowid (no second search of the key index): ``aot stats`` of
        10,000 rows over 1,000,000 entries reads 0.45 s -> 0.33 s of CPU."""
        ordered = sorted(set(pairs))
        smallest: dict[int, tuple[tuple[str, str], str]] = {}  # rowid -> (pair, key)
        for i in range(0, len(ordered), _PAIR_CHUNK):
            chunk = ordered[i : i + _PAIR_CHUNK]
            names = sorted({name for name, _ in chunk})
            # The rowid is the smallest key's: SQLite takes a bare column of a min()
            # query from the row holding the minimum.
            query = (
                f"SELECT name, signature, MIN(key), rowid FROM artifacts WHERE name IN "
                f"({', '.join('?' * len(names))}) AND (name, signature) IN "
                f"(VALUES {', '.join(['(?, ?)'] * len(chunk))}) GROUP BY name, signature"
            )
            params = [*names, *(value for pair in chunk for value in pair)]
            for name, signature, key, rowid in self._execute(query, params):
                smallest[rowid] = ((name, signature), key)
        out: dict[tuple[str, str], str] = {}
        rowids = sorted(smallest)
        for i in range(0, len(rowids), _IN_CHUNK):
            some = rowids[i : i + _IN_CHUNK]
            marks = ", ".join("?" * len(some))
            for rowid, key, manifest in self._execute(
                f"SELECT rowid, key, manifest FROM artifacts WHERE rowid IN ({marks})", some
            ):
                pair, expected = smallest.pop(rowid)
                if key == expected:
                    out[pair] = manifest
                else:  # a writer came between the two reads (a VACUUM renumbers rowids)
                    smallest[rowid] = (pair, expected)
        if smallest:  # those rows moved or went: by key, as the SQL index reads them
            manifests = self.manifests([key for _, key in smallest.values()])
            out.update((pair, manifests[key]) for pair, key in smallest.values() if key in manifests)
        return out

    def manifests(self, keys: Collection[str]) -> dict[str, str]:
        """``{key: manifest JSON}`` of the stored ``keys`` (absent keys are left out)."""
        out: dict[str, str] = {}
        for chunk, marks in _in_lists(keys):
            rows = self._execute(f"SELECT key, manifest FROM artifacts WHERE key IN ({marks})", chunk)
            out.update(rows)  # (key, manifest) pairs of TEXT columns: str already
        return out

    def environment_keys(self, env_fps: Collection[str]) -> dict[str, str]:
        """One key (the smallest) per environment digest with a stored entry, as the
        SQL index's."""
        out: dict[str, str] = {}
        for chunk, marks in _in_lists(env_fps):
            query = f"SELECT env_fp, MIN(key) FROM artifacts WHERE env_fp IN ({marks}) GROUP BY env_fp"
            out.update(self._execute(query, chunk))
        return out

    def jit_entries(self, name_glob: str | None = None) -> list[JitEntry]:
        """The entries of JAX's persistent cache (KIND ``jit``), as the SQL index's."""
        from aot.cache.index.jit_records import JitEntry  # aot ls / gc only: serving never reads them

        columns = JitEntry.__slots__
        rows = self._execute(f"SELECT {', '.join(columns)} FROM jit_entries ORDER BY name, key")
        entries = [JitEntry(**_with_times(dict(zip(columns, row)), "created_at", "last_used_at")) for row in rows]
        if name_glob is None:
            return entries
        return [e for e in entries if fnmatch.fnmatchcase(e.name, name_glob) or e.key.startswith(name_glob)]

    def jit_stats(self, name_glob: str | None = None) -> list[JitStats]:
        """Hits and misses of JAX's persistent cache per function name, as the SQL index's."""
        from aot.cache.index.jit_records import JitStats

        rows = self._execute("SELECT name, hits, misses, saved_seconds FROM jit_stats ORDER BY name")
        stats = [JitStats(name, int(hits), int(misses), float(saved)) for name, hits, misses, saved in rows]
        return [s for s in stats if name_glob is None or fnmatch.fnmatchcase(s.name, name_glob)]

    def _rows(self, query: str, params: Sequence[object]) -> list[IndexEntry]:
        # Per row, only the time columns are converted (aot.load reads every row of a
        # name at start-up: 1,000 signatures are 1,000 rows).
        entries = []
        for row in self._execute(query, params):
            values = list(row)
            for i in _TIME_AT:
                values[i] = _time(values[i])
            entries.append(IndexEntry(*values))
        return entries

    def touch(self, key: str) -> None:
        """Records a use (last-used time, hit count); never fails a load."""
        if self.read_only:
            return
        now = utcnow().strftime("%Y-%m-%d %H:%M:%S.%f")  # SQLAlchemy's SQLite format
        try:
            self._execute(
                "UPDATE artifacts SET last_used_at = ?, hits = hits + 1 WHERE key = ?", (now, key)
            )
        except CacheError as exc:
            log.warning("could not record the use of %s in %s: %s", key[:12], self.path, exc)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def refuse_foreign(index_file: Path) -> None:
    """Raises :class:`CacheError` when ``index_file`` is an SQLite database without a
    jax-aot schema, before anything (blobs folder, WAL) is added next to it; read with
    the standard library, read-only (an older schema is the readers' to refuse)."""
    uri = f"file:{quote(index_file.resolve().as_posix())}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
        try:
            tables = sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise CacheError(_unreadable(index_file, exc)) from None
    if "schema_version" in tables:
        return
    shown = ", ".join(tables[:5]) + (f", ... ({len(tables)} in all)" if len(tables) > 5 else "")
    found = f"it holds {len(tables)} other table(s) ({shown})" if tables else "it holds no tables"
    raise CacheError(
        f"no jax-aot cache index: {index_file} is not a jax-aot cache index: {found}; "
        "aot compile, aot warmup and aot bundle import create a cache; check the path or AOT_CACHE"
    )


def _unreadable(index_file: Path, exc: sqlite3.DatabaseError) -> str:
    """Why SQLite cannot open ``index_file``, worded for what the user can do: a corrupt
    or truncated index (SQLite says "malformed"; or "not a database" beside a blob
    folder) is named as such, never taken for a wrong path; a file system that cannot
    be written says to read it ``--read-only``."""
    reason = str(exc)
    if read_only_file_system(index_file) or "unable to open" in reason:
        if read_only_file_system(index_file):
            return (
                f"cannot open the cache index {index_file}: the file system is read-only; "
                "read it with --read-only (read_only=True)"
            )
        return f"cannot open the cache index {index_file} ({reason}){advice_for(reason)}"
    if "malformed" in reason or (index_file.parent / "blobs").is_dir():
        return damaged_index_message(index_file, reason)
    return f"no jax-aot cache index at {index_file}: not an SQLite database ({reason}); check the path or AOT_CACHE"


def _with_times(values: dict[str, Any], *columns: str) -> dict[str, Any]:
    """``values`` with the named columns read as times."""
    for column in columns:
        values[column] = _time(values[column])
    return values


def _ref(row: Sequence[Any]) -> Ref:
    """A ``refs`` row of :data:`_REF_COLUMNS`."""
    return Ref(**_with_times(dict(zip(_REF_COLUMNS, row)), "set_at"))
