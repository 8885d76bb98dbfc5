"""The index's reads: the statements the cache, serving, reports and gc run, as a
part of :class:`~aot.cache.index.sql.Index`."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, fields
from datetime import datetime
from collections.abc import Collection
from typing import Any

import sqlalchemy as sa

from aot.cache.index.engine import IndexEngine
from aot.cache.index.entry import BLOB_OWNERS, GC_COLUMNS, GcRow, IndexEntry, collector_paused, gc_rows_of_sqlite, utc_value
from aot.cache.index.globs import glob_to_like, like_escape, name_range
from aot.cache.index.schema import ARTIFACTS, BLOBS, CALL_STATS, DEFAULT_RELEASE, PROGRAMS, RELEASES, blob_reference_columns
from aot.cache.index.state import emptiness_query

__all__ = ["BlobRow", "IndexReads"]


@dataclass(frozen=True, slots=True)
class BlobRow:
    """One row of the blob reference table."""

    digest: str
    size: int
    stored_size: int
    created_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "size": self.size,
            "stored_size": self.stored_size,
            "created_at": self.created_at.isoformat(),
        }


_ENTRY_COLUMNS = tuple(ARTIFACTS.c[f.name] for f in fields(IndexEntry))


_SLIM_COLUMNS = tuple(
    sa.literal_column("''").label("manifest") if c.name == "manifest" else c for c in _ENTRY_COLUMNS
)


# gc's rows: the times as the driver returns them, converted once per value without
# the timestamp type's per-value calls. On SQLite unordered (the ORDER BY walks the
# name index and fetches each row's page at random: twice the time) and sorted in
# Python on the same text SQLite compares; PostgreSQL sorts (its collation decides).
_GC_SELECT = sa.select(
    *(sa.type_coerce(ARTIFACTS.c[n], sa.String) if n in ("created_at", "last_used_at") else ARTIFACTS.c[n]
      for n in GC_COLUMNS)
)
_GC_ROWS = _GC_SELECT.order_by(ARTIFACTS.c.name, ARTIFACTS.c.created_at, ARTIFACTS.c.key)


def _driver_rows(conn: sa.Connection, q: sa.Select[Any]) -> list[tuple[Any, ...]]:
    """The rows of ``q`` as the database driver returns them (plain tuples, values
    unconverted), through the connection's own cursor, in its transaction."""
    cursor = conn.connection.cursor()
    try:
        cursor.execute(str(q.compile(dialect=conn.dialect)))
        return list(cursor.fetchall())
    finally:
        cursor.close()


def _entry(row: sa.Row[Any]) -> IndexEntry:
    return IndexEntry(*tuple(row))  # _ENTRY_COLUMNS are in field order


# The lookups on every load, built once: a statement built per call costs SQLAlchemy
# its construction and cache-key walk each time.
_GET = sa.select(*_ENTRY_COLUMNS).where(ARTIFACTS.c.key == sa.bindparam("key"))


def _by_name_query(with_env: bool, with_state: bool) -> sa.Select[Any]:
    q = sa.select(*_ENTRY_COLUMNS).where(ARTIFACTS.c.name == sa.bindparam("name"))
    if with_env:
        q = q.where(ARTIFACTS.c.env_fp == sa.bindparam("env_fp"))
    if with_state:
        q = q.where(ARTIFACTS.c.state == sa.bindparam("state"))
    return q.order_by(ARTIFACTS.c.created_at, ARTIFACTS.c.key)


#: Values per ``IN (...)`` list (SQLite's oldest limit is 999 bound variables).
_IN_CHUNK = 500


def _owner(column: sa.Column[Any]) -> Any:
    owner = BLOB_OWNERS.get(column.table.name)
    return sa.cast(column.table.c[owner], sa.String) if owner else sa.literal("")


#: (name, signature) pairs per statement: their names and the pairs' two values each.
_PAIR_CHUNK = 300

_BY_NAME = {(env, state): _by_name_query(env, state) for env in (False, True) for state in (False, True)}


class IndexReads(IndexEngine):
    """Reads of the index, each one statement in a short transaction."""

    def get(self, key: str) -> IndexEntry | None:
        """The row of ``key`` (None: not stored)."""
        with self._read(f"get {key}") as conn:
            row = conn.execute(_GET, {"key": key}).first()
        return _entry(row) if row is not None else None

    def get_many(self, keys: Collection[str]) -> dict[str, IndexEntry]:
        """``{key: row}`` of the stored ``keys`` (absent keys are left out), one
        statement per :data:`_IN_CHUNK` keys: a copy looks up a batch of entries at once."""
        ordered = sorted(set(keys))
        out: dict[str, IndexEntry] = {}
        with self._read("look up artifacts") as conn:
            for i in range(0, len(ordered), _IN_CHUNK):
                q = sa.select(*_ENTRY_COLUMNS).where(ARTIFACTS.c.key.in_(ordered[i : i + _IN_CHUNK]))
                out.update((entry.key, entry) for entry in map(_entry, conn.execute(q).all()))
        return out

    def by_name(
        self, name: str, env_fp: str | None = None, state: str | None = "ok"
    ) -> list[IndexEntry]:
        """Artifacts stored under ``name`` (for one environment; ``state=None``: any),
        oldest first, in one query."""
        q = _BY_NAME[env_fp is not None, state is not None]
        with self._read(f"look up {name}") as conn:
            rows = conn.execute(q, {"name": name, "env_fp": env_fp, "state": state}).all()
        return [_entry(r) for r in rows]

    def by_program(self, program_fp: str) -> list[IndexEntry]:
        """Every artifact of one program (all environments and states)."""
        q = (
            sa.select(*_ENTRY_COLUMNS)
            .where(ARTIFACTS.c.program_fp == program_fp)
            .order_by(ARTIFACTS.c.created_at, ARTIFACTS.c.key)
        )
        with self._read(f"look up program {program_fp}") as conn:
            return [_entry(r) for r in conn.execute(q).all()]

    def entries(self, name_glob: str | None = None, *, manifests: bool = True) -> list[IndexEntry]:
        """All artifacts, or those whose name matches an fnmatch glob (case-sensitive).
        ``manifests=False``: each entry's ``manifest`` is ``""`` (gc plans a million rows
        without reading their manifests: :meth:`manifests` reads the victims')."""
        q = sa.select(*(_ENTRY_COLUMNS if manifests else _SLIM_COLUMNS))
        if name_glob is not None and name_glob != "*":
            q = q.where(ARTIFACTS.c.name.like(glob_to_like(name_glob), escape="\\"))
            bounds = name_range(name_glob) if self.dialect == "sqlite" else None
            if bounds is not None:  # SQLite's index on name narrows (binary collation)
                q = q.where(ARTIFACTS.c.name >= bounds[0], ARTIFACTS.c.name < bounds[1])
        q = q.order_by(ARTIFACTS.c.name, ARTIFACTS.c.created_at, ARTIFACTS.c.key)
        with self._read("list artifacts") as conn:
            out = [_entry(r) for r in conn.execute(q).all()]
        if name_glob is not None and name_glob != "*":
            # LIKE is case-insensitive on SQLite and has no [...] classes.
            out = [e for e in out if fnmatch.fnmatchcase(e.name, name_glob)]
        return out

    def gc_rows(self) -> list[GcRow]:
        """Every artifact row as gc plans with it (:class:`GcRow`: no manifest), in
        :meth:`entries`' order; a million rows in seconds, not the tens of seconds that
        :class:`IndexEntry` and the timestamp type's conversions cost."""
        sqlite = self.dialect == "sqlite"
        with collector_paused():
            with self._read("list artifacts for gc") as conn:
                rows = _driver_rows(conn, _GC_SELECT if sqlite else _GC_ROWS)
            if not sqlite:
                return [
                    GcRow(key, name, sig, program, exe, hlo, size, utc_value(created), utc_value(used), state, why, md, cd)
                    for key, name, sig, program, exe, hlo, size, created, used, state, why, md, cd in rows
                ]
            return gc_rows_of_sqlite(rows)  # sorted there, as SQLite compares text

    def signature_keys(self, names: Collection[str]) -> dict[tuple[str, str], str]:
        """One key (the smallest) per (name, flat signature) stored under ``names``, in
        any state and environment, without reading a manifest."""
        ordered = sorted(set(names))
        out: dict[tuple[str, str], str] = {}
        with self._read("list the signatures of names") as conn:
            for i in range(0, len(ordered), _IN_CHUNK):
                q = (
                    sa.select(ARTIFACTS.c.name, ARTIFACTS.c.signature, sa.func.min(ARTIFACTS.c.key))
                    .where(ARTIFACTS.c.name.in_(ordered[i : i + _IN_CHUNK]))
                    .group_by(ARTIFACTS.c.name, ARTIFACTS.c.signature)
                )
                out.update(((n, sig), k) for n, sig, k in conn.execute(q).all())
        return out

    def signature_manifests(self, pairs: Collection[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """``{(name, flat signature): manifest JSON}`` of the smallest key stored under
        each of ``pairs``, in any state and environment (pairs without an entry are left
        out): :meth:`signature_keys` narrowed to the pairs, then :meth:`manifests`."""
        ordered = sorted(set(pairs))
        keys: dict[tuple[str, str], str] = {}
        with self._read("list the keys of signatures") as conn:
            for i in range(0, len(ordered), _PAIR_CHUNK):
                chunk = ordered[i : i + _PAIR_CHUNK]
                q = (
                    sa.select(ARTIFACTS.c.name, ARTIFACTS.c.signature, sa.func.min(ARTIFACTS.c.key))
                    .where(
                        ARTIFACTS.c.name.in_(sorted({name for name, _ in chunk})),  # the name index
                        sa.tuple_(ARTIFACTS.c.name, ARTIFACTS.c.signature).in_(chunk),
                    )
                    .group_by(ARTIFACTS.c.name, ARTIFACTS.c.signature)
                )
                keys.update(((n, sig), k) for n, sig, k in conn.execute(q).all())
        manifests = self.manifests(keys.values())
        return {pair: manifests[key] for pair, key in keys.items() if key in manifests}

    def manifests(self, keys: Collection[str]) -> dict[str, str]:
        """``{key: manifest JSON}`` of the stored ``keys`` (absent keys are left out)."""
        ordered = sorted(set(keys))
        out: dict[str, str] = {}
        with self._read("read manifests") as conn:
            for i in range(0, len(ordered), _IN_CHUNK):
                q = sa.select(ARTIFACTS.c.key, ARTIFACTS.c.manifest).where(
                    ARTIFACTS.c.key.in_(ordered[i : i + _IN_CHUNK])
                )
                out.update((k, m) for k, m in conn.execute(q).all())
        return out

    def environment_keys(self, env_fps: Collection[str]) -> dict[str, str]:
        """One key (the smallest) per environment digest of ``env_fps`` with a stored
        entry, without reading a manifest: whose manifest names the environment."""
        ordered = sorted(set(env_fps))
        out: dict[str, str] = {}
        with self._read("find an entry of each environment") as conn:
            for i in range(0, len(ordered), _IN_CHUNK):
                q = (
                    sa.select(ARTIFACTS.c.env_fp, sa.func.min(ARTIFACTS.c.key))
                    .where(ARTIFACTS.c.env_fp.in_(ordered[i : i + _IN_CHUNK]))
                    .group_by(ARTIFACTS.c.env_fp)
                )
                out.update((e, k) for e, k in conn.execute(q).all())
        return out

    def names(self) -> list[str]:
        """Every name with at least one artifact row."""
        with self._read("list names") as conn:
            return sorted(conn.execute(sa.select(ARTIFACTS.c.name).distinct()).scalars())

    def count(self) -> int:
        """How many artifact rows (all environments and states)."""
        with self._read("count artifacts") as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(ARTIFACTS)).scalar_one())

    def program(self, program_fp: str) -> dict[str, Any] | None:
        """The programs row as a dict (name, signature, hlo_digest, created_at)."""
        with self._read(f"look up program {program_fp}") as conn:
            row = conn.execute(sa.select(PROGRAMS).where(PROGRAMS.c.program_fp == program_fp)).first()
        return dict(row._mapping) if row is not None else None

    def find_key_prefix(self, prefix: str, *, limit: int | None = None) -> list[str]:
        """Keys starting with ``prefix`` (for abbreviated keys on the command line)."""
        q = (
            sa.select(ARTIFACTS.c.key)
            .where(ARTIFACTS.c.key.like(like_escape(prefix) + "%", escape="\\"))
            .order_by(ARTIFACTS.c.key)
        )
        if limit is not None:
            q = q.limit(limit)
        with self._read("look up a key prefix") as conn:
            keys = list(conn.execute(q).scalars())
        return [k for k in keys if k.startswith(prefix)]  # SQLite LIKE ignores case

    def referenced_digests(self) -> set[str]:
        """Every blob digest that a row references (:data:`~aot.cache.index.entry.BLOB_COLUMNS`)."""
        q = sa.union(*(sa.select(c.label("d")).where(c.is_not(None)) for c in blob_reference_columns()))
        with self._read("list referenced blobs") as conn:
            return {d for d in conn.execute(q).scalars() if d is not None}

    def referenced_among(self, digests: Collection[str]) -> set[str]:
        """Those of ``digests`` that a row references: :meth:`referenced_digests`
        narrowed to a few candidates, through the digest columns' indexes, instead of a
        scan of every row."""
        ordered = sorted(set(digests))
        out: set[str] = set()
        with self._read("look up referenced blobs") as conn:
            for i in range(0, len(ordered), _IN_CHUNK):
                chunk = ordered[i : i + _IN_CHUNK]
                q = sa.union(*(sa.select(c.label("d")).where(c.in_(chunk)) for c in blob_reference_columns()))
                out.update(d for d in conn.execute(q).scalars() if d is not None)
        return out

    def referencing(self, digests: Collection[str]) -> set[tuple[str, str, str]]:
        """(digest, table, owner) of each row referencing one of ``digests``: owner the
        row's key for the tables of :data:`~aot.cache.index.entry.BLOB_OWNERS`, else ''."""
        ordered = sorted(set(digests))
        out: set[tuple[str, str, str]] = set()
        with self._read("look up the rows referencing blobs") as conn:
            for i in range(0, len(ordered), _IN_CHUNK):
                chunk = ordered[i : i + _IN_CHUNK]
                q = sa.union(*(
                    sa.select(c.label("d"), sa.literal(c.table.name).label("t"), _owner(c).label("o")).where(c.in_(chunk))
                    for c in blob_reference_columns()
                ))
                out.update((str(d), str(t), str(o)) for d, t, o in conn.execute(q) if d is not None)
        return out

    def blob_rows(self) -> list[BlobRow]:
        """The blob reference table, by digest."""
        with self._read("list blob rows") as conn:
            rows = conn.execute(sa.select(BLOBS).order_by(BLOBS.c.digest)).all()
        return [BlobRow(**r._mapping) for r in rows]

    def blob_sizes(self) -> dict[str, int]:
        """``{digest: stored size}`` of every registered blob."""
        return {row.digest: row.stored_size for row in self.blob_rows()}

    def release_labels(self) -> list[str]:
        """Every release label, sorted."""
        with self._read("list releases") as conn:
            return list(conn.execute(sa.select(RELEASES.c.label).distinct().order_by(RELEASES.c.label)).scalars())

    def default_release(self) -> str | None:
        """The cache's declared default release (None: none declared)."""
        with self._read("read the default release") as conn:
            return conn.execute(sa.select(DEFAULT_RELEASE.c.label).where(DEFAULT_RELEASE.c.id == 1)).scalar()

    def call_stats(self, name_glob: str | None = None, env_fp: str | None = None) -> list[dict[str, Any]]:
        """The serving statistics rows (names matching ``name_glob``; of one environment),
        as the columns of ``call_stats``."""
        query = sa.select(CALL_STATS)
        if name_glob is not None and name_glob != "*":
            query = query.where(CALL_STATS.c.name.like(glob_to_like(name_glob), escape="\\"))
        if env_fp is not None:
            query = query.where(CALL_STATS.c.env_fp == env_fp)
        with self._read("read call statistics") as conn:
            rows = [dict(row._mapping) for row in conn.execute(query).all()]
        return [r for r in rows if name_glob is None or fnmatch.fnmatchcase(r["name"], name_glob)]

    def total_stored_size(self) -> int:
        """Bytes the registered blobs occupy in the blob store (each digest once)."""
        with self._read("sum blob sizes") as conn:
            return int(
                conn.execute(sa.select(sa.func.coalesce(sa.func.sum(BLOBS.c.stored_size), 0))).scalar_one()
            )

    def emptiness(self) -> tuple[bool, datetime | None]:
        """Whether the index has no artifact or program row and, if so, when a deletion
        of its own (gc's eviction, ``aot rm``) left it so (None: never emptied that way,
        or a row was added since: new, lost, truncated or replaced)."""
        with self._read("read the index state") as conn:
            row = conn.execute(emptiness_query()).one()
        is_empty = bool(row.empty)
        return is_empty, (row.emptied_at if is_empty else None)

    def emptied_at(self) -> datetime | None:
        """:meth:`emptiness`'s time: when the index's own deletion left it empty."""
        return self.emptiness()[1]

    def is_empty(self) -> bool:
        """No artifact and no program row (a new, lost or emptied index)."""
        with self._read("count rows") as conn:
            for table in (ARTIFACTS, PROGRAMS):
                if conn.execute(sa.select(sa.literal(1)).select_from(table).limit(1)).first() is not None:
                    return False
        return True
