"""Every wait on the index database has a bound: connect and statement timeouts on a
real PostgreSQL server, set by the environment unless the URL sets its own."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from aot.cache.index.engine import IndexEngine, make_engine
from aot.errors import CacheError


def _show(engine: sa.Engine, setting: str) -> str:
    with engine.connect() as conn:
        return str(conn.exec_driver_sql(f"SHOW {setting}").scalar_one())


def test_postgres_sessions_carry_the_default_bounds(
    postgres_admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AOT_DB_STATEMENT_TIMEOUT", raising=False)
    monkeypatch.delenv("AOT_DB_CONNECT_TIMEOUT", raising=False)
    engine = make_engine(postgres_admin_url, read_only=True)
    try:
        assert _show(engine, "statement_timeout") == "30s"
        assert _show(engine, "default_transaction_read_only") == "on"
        with engine.connect() as conn:
            assert conn.connection.dbapi_connection.info.get_parameters()["connect_timeout"] == "5"
    finally:
        engine.dispose()


def test_the_environment_and_the_url_change_the_bounds(
    postgres_admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AOT_DB_STATEMENT_TIMEOUT", "1.5")
    monkeypatch.setenv("AOT_DB_CONNECT_TIMEOUT", "2")
    engine = make_engine(postgres_admin_url, read_only=False)
    try:
        assert _show(engine, "statement_timeout") == "1500ms"
        with engine.connect() as conn:
            assert conn.connection.dbapi_connection.info.get_parameters()["connect_timeout"] == "2"
    finally:
        engine.dispose()
    own = sa.make_url(postgres_admin_url).update_query_dict(
        {"options": "-c statement_timeout=7000", "connect_timeout": "9"}
    )
    engine = make_engine(own, read_only=True)
    try:
        assert _show(engine, "statement_timeout") == "7s"  # the URL's own value wins
        assert _show(engine, "default_transaction_read_only") == "on"
        with engine.connect() as conn:
            assert conn.connection.dbapi_connection.info.get_parameters()["connect_timeout"] == "9"
    finally:
        engine.dispose()


def test_a_statement_past_the_bound_fails_fast_naming_the_setting(
    postgres_admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AOT_DB_STATEMENT_TIMEOUT", "0.2")

    class Probe(IndexEngine):
        def __init__(self) -> None:
            self.read_only, self.url = True, "postgresql://test"
            self._engine = make_engine(postgres_admin_url, read_only=True)
            self._autocommit_reads = True

    probe = Probe()
    try:
        with pytest.raises(CacheError, match="AOT_DB_STATEMENT_TIMEOUT"):
            with probe._read("sleep") as conn:
                conn.exec_driver_sql("SELECT pg_sleep(5)")
    finally:
        probe.close()


def test_a_malformed_bound_is_refused(postgres_admin_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AOT_DB_CONNECT_TIMEOUT", "-1")
    with pytest.raises(CacheError, match="AOT_DB_CONNECT_TIMEOUT='-1' is not a timeout"):
        make_engine(postgres_admin_url, read_only=True)
