"""Blobs in the index database (``blobs_data``): one URL is then a whole shared cache.

Apart from :mod:`aot.cache.storage.folder` because it needs SQLAlchemy, whose import a serving
process reading a folder cache should not pay for.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from aot.cache.index.advice import mask_url, reason_of
from aot.cache.index.engine import connection_for, insert_ignore, make_engine, server_now, server_now_expr
from aot.cache.index.schema import BLOBS_DATA, ensure_schema
from aot.cache.storage.objectstore import BlobStat, check_digest, read_only_error
from aot.cache.timeouts import Timeouts
from aot.errors import CacheError

logger = logging.getLogger(__name__)

__all__ = ["SqlObjectStore"]

_CHUNK = 500


class SqlObjectStore:
    """Payloads in the ``blobs_data`` table (digest, data, created_at).

    ``created_at`` is the last write or touch, stamped with the database server's
    clock, and :meth:`now` reads that clock: ages never mix machines' clocks. The
    schema is created by :func:`aot.cache.index.schema.ensure_schema` (a no-op when an
    :class:`~aot.cache.index.sql.Index` has already opened the database). Concurrent
    writes of one digest are safe (``ON CONFLICT DO UPDATE``: the last one wins,
    and every writer writes the same bytes or a repair).
    """

    def __init__(self, engine: Engine, *, read_only: bool = False, owns_engine: bool = False) -> None:
        self.engine = engine
        self.read_only = read_only
        self._owns_engine = owns_engine
        self.url = mask_url(engine.url)
        self._table: sa.Table = BLOBS_DATA  # type: ignore[assignment]
        try:
            ensure_schema(engine, read_only=read_only)
        except sa_exc.SQLAlchemyError as e:
            raise self._fail("open the blob table", e) from e

    @classmethod
    def open(cls, url: str, *, read_only: bool = False, timeouts: Timeouts | None = None) -> SqlObjectStore:
        """A store on its own engine (blobs in another database than the index)."""
        return cls(make_engine(url, read_only, timeouts), read_only=read_only, owns_engine=True)

    def __repr__(self) -> str:
        return f"SqlObjectStore({self.url!r}, read_only={self.read_only})"

    @property
    def location(self) -> str:
        return f"{self.url} table blobs_data"

    def _fail(self, what: str, e: BaseException) -> CacheError:
        return CacheError(f"cannot {what} in the database at {self.url}: {reason_of(e)}")

    def read(self, digest: str) -> bytes | None:
        check_digest(digest)
        t = self._table
        try:
            with connection_for(self.engine, write=False) as conn:
                value = conn.execute(sa.select(t.c.data).where(t.c.digest == digest)).scalar_one_or_none()
        except sa_exc.SQLAlchemyError as e:
            raise self._fail(f"read blob {digest}", e) from e
        return bytes(value) if value is not None else None

    def _rows(self, digests: Iterable[str], *columns: sa.ColumnElement) -> list[sa.Row]:
        wanted = sorted({check_digest(d) for d in digests})
        t = self._table
        rows: list[sa.Row] = []
        try:
            with connection_for(self.engine, write=False) as conn:
                for i in range(0, len(wanted), _CHUNK):
                    rows.extend(
                        conn.execute(sa.select(*columns).where(t.c.digest.in_(wanted[i : i + _CHUNK])))
                    )
        except sa_exc.SQLAlchemyError as e:
            raise self._fail("look up blobs", e) from e
        return rows

    def exists(self, digests: Iterable[str]) -> set[str]:
        return {row[0] for row in self._rows(digests, self._table.c.digest)}

    def stat(self, digests: Iterable[str]) -> dict[str, BlobStat]:
        t = self._table
        rows = self._rows(digests, t.c.digest, sa.func.length(t.c.data), t.c.created_at)
        return {d: BlobStat(d, int(size), modified) for d, size, modified in rows}

    def list(self) -> Iterator[BlobStat]:
        t = self._table
        try:
            with connection_for(self.engine, write=False) as conn:
                rows = conn.execute(
                    sa.select(t.c.digest, sa.func.length(t.c.data), t.c.created_at).order_by(t.c.digest)
                ).all()
        except sa_exc.SQLAlchemyError as e:
            raise self._fail("list blobs", e) from e
        for digest, size, modified in rows:
            yield BlobStat(digest, int(size), modified)

    def now(self) -> datetime:
        try:
            with connection_for(self.engine, write=False) as conn:
                return server_now(conn)
        except sa_exc.SQLAlchemyError as e:
            raise self._fail("read the database clock", e) from e

    def write(self, digest: str, payload: bytes) -> None:
        check_digest(digest)
        if self.read_only:
            raise read_only_error(f"store blob {digest}", self.location)
        t = self._table
        try:
            with connection_for(self.engine, write=True) as conn:
                stmt = insert_ignore(conn, t).values(
                    digest=digest, data=payload, created_at=server_now_expr(conn.dialect.name)
                )
                conn.execute(
                    stmt.on_conflict_do_update(
                        index_elements=[t.c.digest],
                        set_={"data": stmt.excluded.data, "created_at": stmt.excluded.created_at},
                    )
                )
        except sa_exc.SQLAlchemyError as e:
            raise self._fail(f"store blob {digest}", e) from e

    def touch(self, digest: str) -> None:
        check_digest(digest)
        if self.read_only:
            raise read_only_error(f"touch blob {digest}", self.location)
        t = self._table
        try:
            with connection_for(self.engine, write=True) as conn:
                conn.execute(
                    sa.update(t).where(t.c.digest == digest).values(created_at=server_now_expr(conn.dialect.name))
                )
        except sa_exc.SQLAlchemyError as e:
            raise self._fail(f"touch blob {digest}", e) from e

    def delete(self, digests: Iterable[str]) -> int:
        wanted = sorted({check_digest(d) for d in digests})
        if not wanted:
            return 0
        if self.read_only:
            raise read_only_error(f"delete blob {wanted[0]}", self.location)
        t = self._table
        freed = 0
        try:
            with connection_for(self.engine, write=True) as conn:
                for i in range(0, len(wanted), _CHUNK):
                    chunk = wanted[i : i + _CHUNK]
                    freed += sum(
                        int(size) for size in conn.execute(
                            sa.delete(t).where(t.c.digest.in_(chunk)).returning(sa.func.length(t.c.data))
                        ).scalars()
                    )
        except sa_exc.SQLAlchemyError as e:
            raise self._fail("delete blobs", e) from e
        return freed

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()
