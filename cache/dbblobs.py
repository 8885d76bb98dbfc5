"""Blobs in the index database (``blobs_data``): one URL is then a whole shared cache.

Apart from :mod:`aot.cache.blobs` because it needs SQLAlchemy, whose import a serving
process reading a folder cache should not pay for.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from aot.cache.blobs import (
    DEFAULT_LEVEL,
    PROBLEM_MISSING,
    REFRESH_AFTER_SECONDS,
    _problem,
    _read_only_error,
    check_digest,
    compress,
    decompress_verified,
    digest_of,
)
from aot.errors import CacheError

logger = logging.getLogger(__name__)


class DatabaseBlobStore:
    """Compressed blobs in the ``blobs_data`` table of the index database.

    With PostgreSQL this makes one URL a complete shared cache. The schema is
    created by :func:`aot.cache.index.ensure_schema` (called here, so the store
    works on its own; it is a no-op when an :class:`~aot.cache.index.Index` has
    already opened the database). Concurrent puts of one digest are safe: the
    insert is ``ON CONFLICT DO NOTHING``.
    """

    def __init__(self, engine: Engine, *, level: int = DEFAULT_LEVEL, read_only: bool = False) -> None:
        from aot.cache.index import BlobDataRow, ensure_schema, mask_url

        self.engine = engine
        self.level = level
        self.read_only = read_only
        self.url = mask_url(engine.url)
        self._table: sa.Table = BlobDataRow.__table__  # type: ignore[assignment]
        try:
            ensure_schema(engine, read_only=read_only)
        except sa_exc.SQLAlchemyError as e:
            raise self._fail("open the blob table", e) from e

    def __repr__(self) -> str:
        return f"DatabaseBlobStore({self.url!r}, read_only={self.read_only})"

    def _fail(self, what: str, e: BaseException) -> CacheError:
        orig = getattr(e, "orig", None) or e
        reason = (str(orig).strip().splitlines() or [type(e).__name__])[0]
        return CacheError(f"cannot {what} in the database at {self.url}: {reason}")

    def _where(self, digest: str) -> str:
        return f"{self.url} table blobs_data"

    def _read(self, digest: str) -> bytes | None:
        check_digest(digest)
        t = self._table
        try:
            with self.engine.connect() as conn:
                value = conn.execute(sa.select(t.c.data).where(t.c.digest == digest)).scalar_one_or_none()
        except sa_exc.SQLAlchemyError as e:
            raise self._fail(f"read blob {digest}", e) from e
        return bytes(value) if value is not None else None

    def get(self, digest: str) -> bytes | None:
        stored = self._read(digest)
        if stored is None:
            return None
        return decompress_verified(digest, stored, self._where(digest))

    def has(self, digest: str) -> bool:
        check_digest(digest)
        t = self._table
        try:
            with self.engine.connect() as conn:
                return conn.execute(sa.select(t.c.digest).where(t.c.digest == digest)).first() is not None
        except sa_exc.SQLAlchemyError as e:
            raise self._fail(f"look up blob {digest}", e) from e

    def stored_size(self, digest: str) -> int | None:
        check_digest(digest)
        t = self._table
        try:
            with self.engine.connect() as conn:
                value = conn.execute(
                    sa.select(sa.func.length(t.c.data)).where(t.c.digest == digest)
                ).scalar_one_or_none()
        except sa_exc.SQLAlchemyError as e:
            raise self._fail(f"look up blob {digest}", e) from e
        return int(value) if value is not None else None

    def check(self, digest: str) -> str | None:
        stored = self._read(digest)
        if stored is None:
            return PROBLEM_MISSING
        return _problem(digest, stored)[0]

    def digests(self) -> Iterator[str]:
        t = self._table
        try:
            with self.engine.connect() as conn:
                found = list(conn.execute(sa.select(t.c.digest).order_by(t.c.digest)).scalars())
        except sa_exc.SQLAlchemyError as e:
            raise self._fail("list blobs", e) from e
        yield from found

    def _refresh(self, digest: str) -> None:
        """The caller is about to reference an existing blob: make it young again, so
        that gc (which spares orphans younger than its grace, by ``created_at``) leaves
        it be even if it is the old orphan of a killed writer."""
        t = self._table
        now = datetime.now(timezone.utc)
        old = t.c.created_at < now - timedelta(seconds=REFRESH_AFTER_SECONDS)
        try:
            with self.engine.connect() as conn:
                if conn.execute(sa.select(t.c.digest).where(t.c.digest == digest, old)).first() is None:
                    return  # young already: no write transaction
            with self.engine.connect() as conn:
                conn.execution_options(aot_write=True)
                with conn.begin():
                    conn.execute(sa.update(t).where(t.c.digest == digest).values(created_at=now))
        except sa_exc.SQLAlchemyError as e:
            raise self._fail(f"store blob {digest}", e) from e

    def put(self, data: bytes) -> str:
        digest = digest_of(data)
        if self.read_only:
            raise _read_only_error(f"store blob {digest}", self.url)
        existing = self._read(digest)
        if existing is not None:
            problem = _problem(digest, existing)[0]
            if problem is None:
                self._refresh(digest)
                return digest
            logger.warning("blob %s in %s is corrupt (%s); rewriting it", digest, self.url, problem)
        payload = compress(data, self.level)
        t = self._table
        try:
            with self.engine.connect() as conn:
                conn.execution_options(aot_write=True)
                with conn.begin():
                    if existing is not None:
                        conn.execute(sa.update(t).where(t.c.digest == digest).values(data=payload))
                    else:
                        if conn.dialect.name == "postgresql":
                            from sqlalchemy.dialects.postgresql import insert
                        else:
                            from sqlalchemy.dialects.sqlite import insert
                        conn.execute(
                            insert(t)
                            .values(digest=digest, data=payload, created_at=datetime.now(timezone.utc))
                            .on_conflict_do_nothing()
                        )
        except sa_exc.SQLAlchemyError as e:
            raise self._fail(f"store blob {digest}", e) from e
        return digest

    def delete(self, digest: str) -> int:
        check_digest(digest)
        if self.read_only:
            raise _read_only_error(f"delete blob {digest}", self.url)
        t = self._table
        try:
            with self.engine.connect() as conn:
                conn.execution_options(aot_write=True)
                with conn.begin():
                    size = conn.execute(
                        sa.select(sa.func.length(t.c.data)).where(t.c.digest == digest)
                    ).scalar_one_or_none()
                    if size is None:
                        return 0
                    conn.execute(sa.delete(t).where(t.c.digest == digest))
        except sa_exc.SQLAlchemyError as e:
            raise self._fail(f"delete blob {digest}", e) from e
        return int(size)
