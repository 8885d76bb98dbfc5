"""Fixtures of the reliability tests: PostgreSQL databases, tiny artifacts, spies.

The PostgreSQL fixtures are the minimal pieces of tests/cache/conftest.py (fixtures of
a sibling folder are not visible here): ``AOT_TEST_POSTGRES_URL`` names a server,
every test gets a fresh database, and without the variable the PostgreSQL tests skip
with a visible reason.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Iterator
from typing import Any

import jax
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from reliability_helpers import DeserializeSpy, TinyArtifacts

POSTGRES_ENV = "AOT_TEST_POSTGRES_URL"
POSTGRES_SKIP_REASON = (
    "AOT_TEST_POSTGRES_URL not set: PostgreSQL tests need a server (.ci/run starts one)"
)


@pytest.fixture(autouse=True)
def _no_cache_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's AOT_SIGNING_KEY / AOT_CACHE must not change what the tests see."""
    monkeypatch.delenv("AOT_SIGNING_KEY", raising=False)
    monkeypatch.delenv("AOT_CACHE", raising=False)


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    url = os.environ.get(POSTGRES_ENV, "").strip()
    if not url:
        pytest.skip(POSTGRES_SKIP_REASON)
    return url


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test (dropped afterwards)."""
    name = f"aot_test_{secrets.token_hex(6)}"
    admin = sa.create_engine(postgres_admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(postgres_admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


# ---------------------------------------------------------------- shared objects


@pytest.fixture(scope="session")
def tiny() -> TinyArtifacts:
    return TinyArtifacts(24)


@pytest.fixture
def deserialize_spy(monkeypatch: pytest.MonkeyPatch) -> DeserializeSpy:
    client_class = type(jax.devices()[0].client)
    original = client_class.deserialize_executable
    spy = DeserializeSpy()

    def deserialize_executable(self: Any, serialized: Any, *args: Any, **kwargs: Any) -> Any:
        spy.digests.append(hashlib.sha256(bytes(serialized)).hexdigest())
        return original(self, serialized, *args, **kwargs)

    monkeypatch.setattr(client_class, "deserialize_executable", deserialize_executable)
    return spy
