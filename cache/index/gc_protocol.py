"""The index's side of the gc protocol (docs/reliability.md, "gc and writers"):
writers' leases on the blobs they are about to name, gc's deletion lock and the
checks made under it, and deleting rows, as a part of
:class:`~aot.cache.index.sql.Index`."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from aot.cache.index.engine import IndexEngine, joined, server_now
from aot.cache.index.gc_reads import DROP_EXPIRED_LEASES
from aot.cache.index.leases import Lease
from aot.cache.index.schema import ARTIFACTS, BLOBS, JIT_ENTRIES, LEASES, PROGRAMS, UTCDateTime
from aot.cache.index.state import has_no_rows, mark_emptied
from aot.errors import AotError

logger = logging.getLogger(__name__)

__all__ = ["LEASE_SECONDS", "DeletionBatch", "IndexGc"]

#: Rows per statement when deleting by a list of keys (SQLite variable limits).
_CHUNK = 500

#: How long a writer's lease on its blobs lasts (database server's clock). A writer
#: that outlives its lease finds out when it commits and starts over; a killed
#: writer's leases pin its blobs for at most this long.
LEASE_SECONDS = 3600.0

#: PostgreSQL: taken by gc's deletion transaction; conflicts with the ROW EXCLUSIVE
#: lock every INSERT/DELETE on blob_leases takes, and with itself.
_PG_DELETION_LOCK = "LOCK TABLE blob_leases IN SHARE ROW EXCLUSIVE MODE"


class DeletionBatch:
    """gc's view inside :meth:`Index.deletion_lock` (one transaction, under the lock)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.now = server_now(conn)

    def deletable(self, digests: Iterable[str]) -> list[str]:
        """The digests no artifact or program row references and no live lease holds.

        Expired leases on them are deleted, so that their writers, if still alive,
        find out when they commit (:class:`LeaseLostError`) and start over.
        """
        wanted = sorted(set(digests))
        if not wanted:
            return []
        conn = self._conn
        protected: set[str] = set()
        expired: set[str] = set()
        for i in range(0, len(wanted), _CHUNK):
            chunk = wanted[i : i + _CHUNK]
            protected.update(
                conn.execute(
                    sa.union(
                        sa.select(ARTIFACTS.c.exe_digest).where(ARTIFACTS.c.exe_digest.in_(chunk)),
                        sa.select(ARTIFACTS.c.hlo_digest).where(ARTIFACTS.c.hlo_digest.in_(chunk)),
                        sa.select(ARTIFACTS.c.manifest_digest).where(ARTIFACTS.c.manifest_digest.in_(chunk)),
                        sa.select(ARTIFACTS.c.const_digest).where(ARTIFACTS.c.const_digest.in_(chunk)),
                        sa.select(PROGRAMS.c.hlo_digest).where(PROGRAMS.c.hlo_digest.in_(chunk)),
                        sa.select(JIT_ENTRIES.c.digest).where(JIT_ENTRIES.c.digest.in_(chunk)),
                    )
                ).scalars()
            )
            for digest, expires_at in conn.execute(
                sa.select(LEASES.c.digest, LEASES.c.expires_at).where(LEASES.c.digest.in_(chunk))
            ):
                if expires_at > self.now:
                    protected.add(digest)
                else:
                    expired.add(digest)
        doomed = [d for d in wanted if d not in protected]
        stale = sorted(expired - protected)
        for i in range(0, len(stale), _CHUNK):
            conn.execute(
                sa.delete(LEASES).where(
                    LEASES.c.digest.in_(stale[i : i + _CHUNK]), LEASES.c.expires_at <= self.now
                )
            )
        return doomed

    def forget(self, digests: Iterable[str]) -> None:
        """Deletes the blob reference rows of ``digests`` (their blobs are gone)."""
        gone = sorted(set(digests))
        for i in range(0, len(gone), _CHUNK):
            self._conn.execute(sa.delete(BLOBS).where(BLOBS.c.digest.in_(gone[i : i + _CHUNK])))

    def drop_expired_leases(self) -> int:
        """Deletes every expired lease (left by killed writers); how many. The statement
        is shared with the standard library's (:data:`DROP_EXPIRED_LEASES`)."""
        statement = sa.text(DROP_EXPIRED_LEASES).bindparams(sa.bindparam("now", type_=UTCDateTime))
        return int(self._conn.execute(statement, {"now": self.now}).rowcount or 0)


class IndexGc(IndexEngine):
    """Leases, gc's deletion lock, and deleting rows."""

    def lease(self, digests: Iterable[str], *, seconds: float | None = None) -> Lease:
        """Claims ``digests`` for a row about to be written: gc deletes none of them
        until the lease is released (by :meth:`add` or :meth:`release`) or expires
        (``seconds`` on the database server's clock). Take it *before* checking or
        writing the blobs; it serializes with gc's deletion lock."""
        wanted = frozenset(digests)
        token = secrets.token_hex(16)
        with self._write("lease blobs") as conn:
            expires_at = server_now(conn) + timedelta(seconds=LEASE_SECONDS if seconds is None else seconds)
            if wanted:
                conn.execute(
                    sa.insert(LEASES),
                    [{"token": token, "digest": d, "expires_at": expires_at} for d in sorted(wanted)],
                )
        return Lease(token, wanted, expires_at)

    def release(self, lease: Lease) -> None:
        """Gives a lease up (a writer that failed). Never raises: an unreleased lease
        only pins its blobs until it expires."""
        if not lease.digests:
            return
        try:
            with self._write("release a lease") as conn:
                conn.execute(sa.delete(LEASES).where(LEASES.c.token == lease.token))
        except AotError as e:
            logger.warning("index: could not release lease %s: %s", lease.token[:8], e)

    def leased_digests(self) -> set[str]:
        """Digests under a live lease (writes in progress)."""
        with self._read("list leases") as conn:
            now = server_now(conn)
            return set(conn.execute(sa.select(LEASES.c.digest).where(LEASES.c.expires_at > now)).scalars())

    def has_expired_leases(self) -> bool:
        """Whether a lease has expired (a killed writer's): an executed gc drops them."""
        with self._read("look for expired leases") as conn:
            now = server_now(conn)
            expired = sa.select(sa.literal(1)).select_from(LEASES).where(LEASES.c.expires_at <= now).limit(1)
            return conn.execute(expired).first() is not None

    def drop_expired_leases(self) -> int:
        """Deletes every expired lease (killed writers') under :meth:`deletion_lock`;
        how many."""
        with self.deletion_lock() as batch:
            return batch.drop_expired_leases()

    @contextmanager
    def deletion_lock(self) -> Iterator[DeletionBatch]:
        """gc's deletion step: one transaction under the lock every lease and every
        lease release waits for (SQLite: ``BEGIN IMMEDIATE``, the database's write
        lock; PostgreSQL: ``SHARE ROW EXCLUSIVE`` on blob_leases). Delete the blobs
        :meth:`DeletionBatch.deletable` returns *inside* the block; a SQL blob store on
        this engine joins the transaction."""
        with self._write("delete blobs") as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(_PG_DELETION_LOCK)
            with joined(self._engine, conn):
                yield DeletionBatch(conn)

    def drop_unreferenced(self, digests: Iterable[str], delete: Callable[[list[str]], object]) -> list[str]:
        """Those of ``digests`` that no row references and no lease holds, deleted with
        ``delete`` under the deletion lock, as gc deletes: the manifest blob a writer
        wrote for a key another writer committed first (its own compile's), or that of
        the damaged row it replaced, instead of orphans left to gc's grace period."""
        with self.deletion_lock() as batch:
            doomed = batch.deletable(digests)
            if doomed:
                delete(doomed)
                batch.forget(doomed)
        return doomed

    def delete(self, keys: Iterable[str], *, keep_programs: bool = False) -> int:
        """Delete artifact rows; return how many existed.

        Programs rows left without any artifact are deleted too (unless
        ``keep_programs``), so their portable-HLO blob becomes unreferenced and
        ``gc`` can free it: deleting every artifact of a program deletes the
        program. Blob rows are not touched (see :meth:`delete_blob_rows`).
        """
        return self._delete(sorted(set(keys)), keep_programs, None)[0]

    def delete_unchanged(self, planned: Mapping[str, tuple[str, datetime]]) -> list[str]:
        """gc's eviction: deletes each row still as planned (key -> state,
        last_used_at); a row used, healed or replaced since the plan is kept. The
        keys deleted."""
        keys = sorted(planned)
        kept = set(self._delete(keys, False, planned)[1])
        return [k for k in keys if k not in kept]

    def _delete(
        self, keys: list[str], keep_programs: bool, unchanged: Mapping[str, tuple[str, datetime]] | None,
    ) -> tuple[int, list[str]]:
        if not keys:
            return 0, []
        deleted = 0
        kept: list[str] = []
        with self._write("delete artifacts") as conn:
            programs: set[str] = set()
            for i in range(0, len(keys), _CHUNK):
                chunk = keys[i : i + _CHUNK]
                query = sa.select(ARTIFACTS.c.program_fp).where(ARTIFACTS.c.key.in_(chunk)).distinct()
                programs.update(conn.execute(query).scalars())
            if conn.dialect.name == "postgresql" and programs:
                # Lock programs rows before artifacts rows, as a writer does (its upsert
                # of the program comes first): the opposite order deadlocks with it, and
                # the NOT EXISTS below then sees a row the writer committed meanwhile.
                progs = sorted(programs)
                for i in range(0, len(progs), _CHUNK):
                    conn.execute(
                        sa.select(PROGRAMS.c.program_fp)
                        .where(PROGRAMS.c.program_fp.in_(progs[i : i + _CHUNK]))
                        .order_by(PROGRAMS.c.program_fp)
                        .with_for_update()
                    ).all()
            if unchanged is None:
                for i in range(0, len(keys), _CHUNK):
                    chunk = keys[i : i + _CHUNK]
                    deleted += conn.execute(sa.delete(ARTIFACTS).where(ARTIFACTS.c.key.in_(chunk))).rowcount
            else:
                for key in keys:
                    state, last_used_at = unchanged[key]
                    if conn.execute(
                        sa.delete(ARTIFACTS).where(
                            ARTIFACTS.c.key == key,
                            ARTIFACTS.c.state == state,
                            ARTIFACTS.c.last_used_at == last_used_at,
                        )
                    ).rowcount:
                        deleted += 1
                    else:
                        kept.append(key)
            if not keep_programs and programs:
                still_used = sa.select(ARTIFACTS.c.program_fp).where(
                    ARTIFACTS.c.program_fp == PROGRAMS.c.program_fp
                )
                progs = sorted(programs)
                for i in range(0, len(progs), _CHUNK):
                    conn.execute(
                        sa.delete(PROGRAMS).where(
                            PROGRAMS.c.program_fp.in_(progs[i : i + _CHUNK]), ~still_used.exists()
                        )
                    )
            if deleted and has_no_rows(conn):
                mark_emptied(conn)
        logger.debug("index: deleted %d artifact rows", deleted)
        return deleted, kept

    def delete_blob_rows(self, digests: Iterable[str]) -> int:
        """Delete rows of the blob reference table; return how many existed."""
        digests = sorted(set(digests))
        n = 0
        if not digests:
            return 0
        with self._write("delete blob rows") as conn:
            for i in range(0, len(digests), _CHUNK):
                n += conn.execute(
                    sa.delete(BLOBS).where(BLOBS.c.digest.in_(digests[i : i + _CHUNK]))
                ).rowcount
        return n
