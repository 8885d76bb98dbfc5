"""The index's hot reads on PostgreSQL: pooled connections the server dropped are
replaced, and a name's signatures are read in one query."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

import aot
from aot.cache.index import engine as index_module
from aot.cache.index.sql import Index
from aot.errors import CacheError

pytestmark = pytest.mark.postgres


def _terminate_other_backends(url: str) -> int:
    """Kills every other session on the test database (a server restart, a proxy's
    idle timeout), as the server would."""
    admin = sa.create_engine(url, poolclass=NullPool)
    try:
        with admin.connect() as conn:
            return len(conn.execute(sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )).all())
    finally:
        admin.dispose()


def test_a_dropped_idle_connection_is_replaced(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    index = Index(postgres_url)
    try:
        assert index.get("0" * 64) is None  # a pooled connection now exists
        monkeypatch.setattr(index_module, "PING_AFTER_IDLE_S", 0.0)  # idle long enough
        assert _terminate_other_backends(postgres_url) >= 1
        assert index.get("0" * 64) is None  # pinged at checkout, replaced, no error
        assert index.by_name("nothing") == []
    finally:
        index.close()


def test_a_connection_dropped_while_in_use_fails_one_read_only(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Within PING_AFTER_IDLE_S of its last use a connection is taken as alive: if the
    server dropped it meanwhile, that one read fails with a CacheError, and the next
    one reconnects."""
    index = Index(postgres_url)
    try:
        assert index.get("0" * 64) is None
        monkeypatch.setattr(index_module, "PING_AFTER_IDLE_S", 3600.0)
        _terminate_other_backends(postgres_url)
        with pytest.raises(CacheError, match="failed on the cache index"):
            index.get("0" * 64)
        assert index.get("0" * 64) is None
    finally:
        index.close()


def test_load_reads_all_signatures_of_a_name_in_one_query(postgres_url: str) -> None:
    cache = aot.Cache(postgres_url)
    try:
        for n in (2, 4, 8, 16):
            cache.compile(lambda x, y: x * y + 1, f"f32[{n}]", f"f32[{n}]", name="tiny.buckets")
        statements: list[str] = []

        def seen(conn, cursor, statement, *args) -> None:  # noqa: ANN001
            statements.append(" ".join(statement.split()))

        sa.event.listen(cache.index.engine, "before_cursor_execute", seen)
        dispatcher = aot.load("tiny.buckets", cache=cache)
        artifact_reads = [s for s in statements if s.startswith("SELECT") and "FROM artifacts" in s]
        assert len(dispatcher.signatures) == 4
        assert len(artifact_reads) == 1, artifact_reads
    finally:
        cache.close()
