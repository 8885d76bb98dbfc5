"""The SQL index of a cache (SQLAlchemy): :class:`Index`, over SQLite or PostgreSQL.

The parts of the index live beside this module: the schema and its migrations
(:mod:`~aot.cache.index.schema`), the engine and its transactions
(:mod:`~aot.cache.index.engine`), the reads (:mod:`~aot.cache.index.queries`), the gc
protocol (:mod:`~aot.cache.index.gc_protocol`). A folder cache is read through the
standard library instead (:mod:`~aot.cache.index.reader`); both satisfy
:class:`~aot.cache.index.protocol.IndexReader`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.engine.url import URL

from aot.cache.index.advice import advice_for, mask_url, reason_of
from aot.cache.index.engine import index_now_expr, insert_ignore, make_engine, server_now
from aot.cache.index.entry import INDEX_FILE, IndexEntry, as_utc
from aot.cache.index.gc_protocol import IndexGc
from aot.cache.index.jit import IndexJit
from aot.cache.index.leases import Lease, LeaseLostError
from aot.cache.index.queries import IndexReads
from aot.cache.index.refs_sql import IndexRefs
from aot.cache.index.schema import ARTIFACTS, BLOBS, LEASES, PROGRAMS, ensure_schema, read_version
from aot.cache.index.state import clear_emptied
from aot.cache.index.targets import IndexTargets
from aot.cache.pauses import reached
from aot.cache.timeouts import Timeouts
from aot.errors import AotError, CacheError

logger = logging.getLogger(__name__)

__all__ = ["Index"]


class Index(IndexReads, IndexGc, IndexRefs, IndexJit, IndexTargets):
    """The SQL index of a cache: SQLite (default) or PostgreSQL (shared).

    Its reads (:class:`~aot.cache.index.queries.IndexReads`) and its side of the gc
    protocol (:class:`~aot.cache.index.gc_protocol.IndexGc`) and its refs and releases
    (:class:`~aot.cache.index.refs_sql.IndexRefs`) are defined beside it; the writes of
    rows are here.
    """

    def __init__(
        self, url: str | URL, *, read_only: bool = False, timeouts: Timeouts | None = None,
        create: bool = True,
    ) -> None:
        """``create=False``: an index that exists only (the commands that read): a
        missing file, an empty or foreign database or an older schema is a
        :class:`CacheError` saying what was found; nothing is created or migrated."""
        self.read_only = read_only
        self.url = mask_url(url)
        self._engine = make_engine(url, read_only, timeouts, create=create)
        try:
            self._version = ensure_schema(self._engine, read_only=read_only, create=create)
        except AotError:
            self._engine.dispose()
            raise
        except (sa_exc.SQLAlchemyError, OSError) as e:
            self._engine.dispose()
            reason = reason_of(e)
            raise CacheError(
                f"cannot open the cache index at {self.url}: {reason}"
                + (advice_for(reason, read_only, self._engine.url.database if self._engine.dialect.name == "sqlite"
                              else None)
                   or "; check that the database is reachable and that "
                   "the URL, user and password are right")
            ) from e
        self._autocommit_reads = self._engine.dialect.name == "postgresql"
        logger.debug("opened cache index %s (schema v%d, read_only=%s)", self.url, self._version, read_only)

    @classmethod
    def for_folder(cls, path: str | Path, *, read_only: bool = False, create: bool = True) -> Index:
        """The SQLite index of a folder cache: ``path/index.sqlite``."""
        db = Path(path).expanduser() / INDEX_FILE
        return cls(URL.create("sqlite", database=str(db)), read_only=read_only, create=create)

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Index({self.url!r}, read_only={self.read_only})"

    def schema_version(self) -> int:
        """The schema version recorded in the database."""
        with self._read("read the schema version") as conn:
            return read_version(conn)

    def now(self) -> datetime:
        """The database server's clock: every time compared across machines is on it."""
        with self._read("read the database clock") as conn:
            return server_now(conn)

    # -- writes -------------------------------------------------------------------

    def add(
        self, entry: IndexEntry, *, blob_sizes: Mapping[str, tuple[int, int]],
        lease: Lease | None = None, stamp: bool = False, replace: bool = False,
        created_at: datetime | None = None,
    ) -> bool:
        """Record an artifact: blob rows, its program row and its artifact row, atomically.

        ``blob_sizes`` maps each digest the entry uses to ``(size, stored_size)``;
        call this only after the blobs are durable in the blob store. Returns True
        if the row was inserted, False if an artifact with this key already exists
        (concurrent adders of one key all succeed; one row is kept). A
        ``quarantined`` row with the same key is replaced (healing) -> True; with
        ``replace`` any row of the key is (a row whose blobs were found damaged).

        ``lease``: released in the same transaction; if gc took it (it expired),
        nothing is written and :class:`LeaseLostError` is raised. ``stamp``: the
        row's times come from the database server's clock, not the entry.
        ``created_at`` (with ``stamp``): the row keeps this compile time (a copy keeps
        its source's), its last use is the server's now.
        """
        with self._write(f"add artifact {entry.key}") as conn:
            if lease is not None:
                # First statement: on PostgreSQL it waits for gc's deletion lock.
                _take_back(conn, lease, f"the blobs of {entry.name!r} ({entry.key[:12]})")
            now = server_now(conn) if stamp else None
            added = self._insert(conn, entry, blob_sizes, now=now, replace=replace, created_at=created_at)
            reached("put.before_commit")
            return added

    def add_many(
        self, rows: Sequence[tuple[IndexEntry, Mapping[str, tuple[int, int]], datetime | None]],
        *, lease: Lease | None = None,
    ) -> list[bool]:
        """:meth:`add` of each ``(entry, blob_sizes, created_at)`` (``stamp``: the
        server's clock, ``created_at`` kept when given), all in one transaction that
        also releases ``lease`` (one lease on every digest of the rows): a copy commits
        a batch of rows at once, after every blob of the batch is durable. Per row, as
        :meth:`add` returns; :class:`LeaseLostError` (nothing written) if gc took the lease."""
        if not rows:
            if lease is not None:
                self.release(lease)
            return []
        with self._write(f"add {len(rows)} artifacts") as conn:
            if lease is not None:
                _take_back(conn, lease, f"the blobs of {len(rows)} entries")
            added = self._insert_many(conn, rows, server_now(conn))
            reached("put.before_commit")
            return added

    def _insert_many(
        self, conn: Connection, rows: Sequence[tuple[IndexEntry, Mapping[str, tuple[int, int]], datetime | None]],
        now: datetime,
    ) -> list[bool]:
        """:meth:`_insert` of many rows in three statements (blob rows, program rows,
        artifact rows), each over its rows sorted by key, the order in which gc and
        other writers lock them too (PostgreSQL: no deadlock between batches)."""
        blobs: dict[str, dict[str, Any]] = {}
        programs: dict[str, dict[str, Any]] = {}
        artifacts: dict[str, dict[str, Any]] = {}
        for entry, sizes, created_at in rows:
            for d, (size, stored) in sizes.items():
                blobs.setdefault(d, {"digest": d, "size": int(size), "stored_size": int(stored), "created_at": now})
            program = programs.setdefault(entry.program_fp, {
                "program_fp": entry.program_fp, "name": entry.name, "signature": entry.signature,
                "hlo_digest": entry.hlo_digest, "created_at": now,
            })
            if program["hlo_digest"] is None:  # as the upsert's coalesce
                program["hlo_digest"] = entry.hlo_digest
            row = entry._row()
            row["created_at"] = row["last_used_at"] = now
            if created_at is not None:
                row["created_at"] = as_utc(created_at, "created_at")
            artifacts[entry.key] = row
        if blobs:
            conn.execute(insert_ignore(conn, BLOBS).on_conflict_do_nothing(), [blobs[d] for d in sorted(blobs)])
        prog = insert_ignore(conn, PROGRAMS)
        conn.execute(
            prog.on_conflict_do_update(
                index_elements=[PROGRAMS.c.program_fp],
                set_={"hlo_digest": sa.func.coalesce(PROGRAMS.c.hlo_digest, prog.excluded.hlo_digest)},
            ),
            [programs[fp] for fp in sorted(programs)],
        )
        inserted = set(
            conn.execute(
                insert_ignore(conn, ARTIFACTS).on_conflict_do_nothing().returning(ARTIFACTS.c.key),
                [artifacts[k] for k in sorted(artifacts)],
            ).scalars()
        )
        if inserted:
            clear_emptied(conn)
        added = []
        for entry, _, _ in rows:
            if entry.key in inserted:
                logger.debug("index: added %s (%s)", entry.key, entry.name)
                added.append(True)
                continue
            state = conn.execute(
                sa.select(ARTIFACTS.c.state).where(ARTIFACTS.c.key == entry.key)
            ).scalar_one_or_none()
            if state == "quarantined":
                conn.execute(sa.update(ARTIFACTS).where(ARTIFACTS.c.key == entry.key).values(**artifacts[entry.key]))
                logger.info("index: replaced %s artifact %s (%s)", state, entry.key, entry.name)
            else:
                logger.debug("index: %s already present", entry.key)
            added.append(state == "quarantined")
        return added

    def _insert(
        self, conn: Connection, entry: IndexEntry, blob_sizes: Mapping[str, tuple[int, int]], *,
        now: datetime | None, replace: bool, created_at: datetime | None,
    ) -> bool:
        """The statements of :meth:`add` inside the caller's transaction; ``now``: the
        server's time to stamp the row with (None: the entry's own times)."""
        row = entry._row()
        if now is not None:
            row["created_at"] = row["last_used_at"] = now
            if created_at is not None:
                row["created_at"] = as_utc(created_at, "created_at")
        else:
            now = entry.created_at
        if blob_sizes:
            conn.execute(
                insert_ignore(conn, BLOBS).on_conflict_do_nothing(),
                [
                    {"digest": d, "size": int(s), "stored_size": int(st), "created_at": now}
                    for d, (s, st) in sorted(blob_sizes.items())
                ],
            )
        prog = insert_ignore(conn, PROGRAMS).values(
            program_fp=entry.program_fp,
            name=entry.name,
            signature=entry.signature,
            hlo_digest=entry.hlo_digest,
            created_at=now,
        )
        conn.execute(
            prog.on_conflict_do_update(
                index_elements=[PROGRAMS.c.program_fp],
                set_={"hlo_digest": sa.func.coalesce(PROGRAMS.c.hlo_digest, prog.excluded.hlo_digest)},
            )
        )
        # RETURNING, not rowcount: INSERT rowcount is unreliable across drivers.
        inserted = conn.execute(
            insert_ignore(conn, ARTIFACTS)
            .values(**row)
            .on_conflict_do_nothing()
            .returning(ARTIFACTS.c.key)
        ).scalar_one_or_none()
        if inserted is not None:
            clear_emptied(conn)
            logger.debug("index: added %s (%s)", entry.key, entry.name)
            return True
        state = conn.execute(
            sa.select(ARTIFACTS.c.state).where(ARTIFACTS.c.key == entry.key)
        ).scalar_one_or_none()
        if state == "quarantined" or (replace and state is not None):
            conn.execute(sa.update(ARTIFACTS).where(ARTIFACTS.c.key == entry.key).values(**row))
            logger.info("index: replaced %s artifact %s (%s)", state, entry.key, entry.name)
            return True
        logger.debug("index: %s already present", entry.key)
        return False

    def touch(self, key: str, *, when: datetime | None = None) -> None:
        """Record a use: ``last_used_at = when`` or the server's now, ``hits += 1``.

        Never fails a load: on a read-only index it does nothing, and a database
        error is logged, not raised.
        """
        if self.read_only:
            logger.debug("index: not touching %s: read-only", key)
            return
        try:
            with self._write(f"touch {key}") as conn:
                stamp = as_utc(when, "when") if when is not None else index_now_expr(conn.dialect.name)
                conn.execute(
                    sa.update(ARTIFACTS)
                    .where(ARTIFACTS.c.key == key)
                    .values(last_used_at=stamp, hits=ARTIFACTS.c.hits + 1)
                )
        except CacheError as e:
            logger.warning("index: could not record the use of %s: %s", key, e)

    def quarantine(self, key: str, reason: str, *, expect: IndexEntry | None = None) -> bool:
        """Mark an artifact unusable (bad digest, undeserializable ...). True if it exists.

        With ``expect`` (the row as the caller read it), only while the row still names
        the same blobs and manifest: a reader holding an old snapshot must not condemn
        a row rewritten since (compare-and-set; False when the row changed).
        """
        q = sa.update(ARTIFACTS).where(ARTIFACTS.c.key == key)
        if expect is not None:
            q = q.where(
                ARTIFACTS.c.exe_digest == expect.exe_digest,
                ARTIFACTS.c.hlo_digest.is_(None) if expect.hlo_digest is None
                else ARTIFACTS.c.hlo_digest == expect.hlo_digest,
                ARTIFACTS.c.manifest == expect.manifest,
            )
        with self._write(f"quarantine {key}") as conn:
            n = conn.execute(q.values(state="quarantined", state_reason=reason)).rowcount
        if n:  # the caller, who knows what it refused, tells the user (once)
            logger.debug("index: quarantined %s: %s", key, reason)
        return bool(n)

    def bulk_insert(self, entries: Sequence[IndexEntry]) -> None:
        """Insert many new artifact (and program) rows at once; for benchmarks and imports.

        Unlike :meth:`add` this does not register blobs nor tolerate existing keys.
        """
        with self._write("bulk insert") as conn:
            progs: dict[str, dict[str, Any]] = {}
            for e in entries:
                progs.setdefault(
                    e.program_fp,
                    {
                        "program_fp": e.program_fp,
                        "name": e.name,
                        "signature": e.signature,
                        "hlo_digest": e.hlo_digest,
                        "created_at": e.created_at,
                    },
                )
            if progs:
                conn.execute(insert_ignore(conn, PROGRAMS).on_conflict_do_nothing(), list(progs.values()))
            if entries:
                conn.execute(sa.insert(ARTIFACTS), [e._row() for e in entries])
                clear_emptied(conn)


def _take_back(conn: Connection, lease: Lease, what: str) -> None:
    """Deletes ``lease``'s rows in the caller's transaction; :class:`LeaseLostError`
    if gc took any of them (it expired)."""
    if not lease.digests:
        return
    kept = set(
        conn.execute(sa.delete(LEASES).where(LEASES.c.token == lease.token).returning(LEASES.c.digest)).scalars()
    )
    if kept != lease.digests:
        raise LeaseLostError(f"the lease on {what} expired and gc may have taken them; store it again")
