"""Fixtures of the cache tests: index and blob-store backends, PostgreSQL databases.

PostgreSQL comes from ``AOT_TEST_POSTGRES_URL`` (``.ci/postgres.sh`` starts a
server and prints it). Every PostgreSQL test gets a fresh database
``aot_test_<random>``, dropped afterwards; without the variable those
parametrizations are skipped with a visible reason.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from aot.cache.blobs import (
    BlobStore,
    DatabaseBlobStore,
    FolderBlobStore,
    MemoryBlobStore,
)
from aot.cache.index import BlobDataRow, Index

POSTGRES_ENV = "AOT_TEST_POSTGRES_URL"
POSTGRES_SKIP_REASON = (
    "AOT_TEST_POSTGRES_URL not set: PostgreSQL tests need a server (.ci/run starts one)"
)

_postgres = pytest.mark.postgres


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


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'index.sqlite'}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=_postgres)])
def index_url(request: pytest.FixtureRequest) -> str:
    """URL of a fresh, empty index database of each backend."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("postgres_url"))
    return str(request.getfixturevalue("sqlite_url"))


@pytest.fixture
def index(index_url: str) -> Iterator[Index]:
    idx = Index(index_url)
    try:
        yield idx
    finally:
        idx.close()


@pytest.fixture(
    params=[
        "folder",
        "memory",
        "database-sqlite",
        pytest.param("database-postgresql", marks=_postgres),
    ]
)
def blob_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    """An empty blob store of each kind."""
    kind = request.param
    if kind == "folder":
        yield FolderBlobStore(tmp_path / "blobs")
    elif kind == "memory":
        yield MemoryBlobStore()
    else:
        url = request.getfixturevalue("sqlite_url" if kind == "database-sqlite" else "postgres_url")
        idx = Index(url)
        try:
            yield DatabaseBlobStore(idx.engine)
        finally:
            idx.close()


# ---------------------------------------------------------------- raw-byte access


def read_stored(store: BlobStore, digest: str) -> bytes | None:
    """The compressed bytes as stored (bypassing verification)."""
    if isinstance(store, FolderBlobStore):
        path = store.path_for(digest)
        return path.read_bytes() if path.exists() else None
    if isinstance(store, MemoryBlobStore):
        return store.raw(digest) if store.has(digest) else None
    if isinstance(store, DatabaseBlobStore):
        t = BlobDataRow.__table__
        with store.engine.connect() as conn:
            value = conn.execute(sa.select(t.c.data).where(t.c.digest == digest)).scalar_one_or_none()
        return bytes(value) if value is not None else None
    raise TypeError(store)


def write_stored(store: BlobStore, digest: str, stored: bytes) -> None:
    """Overwrite the stored bytes of a blob, as disk rot or a bad copy would."""
    if isinstance(store, FolderBlobStore):
        path = store.path_for(digest)
        path.chmod(0o644)
        path.write_bytes(stored)
        path.chmod(0o444)
    elif isinstance(store, MemoryBlobStore):
        store.set_raw(digest, stored)
    elif isinstance(store, DatabaseBlobStore):
        t = BlobDataRow.__table__
        with store.engine.begin() as conn:
            conn.execute(sa.update(t).where(t.c.digest == digest).values(data=stored))
    else:
        raise TypeError(store)


def read_only_twin(store: BlobStore) -> BlobStore:
    """The same storage opened read-only."""
    if isinstance(store, FolderBlobStore):
        return FolderBlobStore(store.root, read_only=True)
    if isinstance(store, MemoryBlobStore):
        twin = MemoryBlobStore(read_only=True)
        twin._data = store._data  # shares the storage, like a second process would
        return twin
    if isinstance(store, DatabaseBlobStore):
        return DatabaseBlobStore(store.engine, read_only=True)
    raise TypeError(store)


# Test modules cannot import from conftest.py unambiguously (tests/conftest.py has
# the same module name), so the helpers are handed out as fixtures.


@pytest.fixture
def read_raw() -> Callable[[BlobStore, str], bytes | None]:
    return read_stored


@pytest.fixture
def write_raw() -> Callable[[BlobStore, str, bytes], None]:
    return write_stored


@pytest.fixture
def reopen_read_only() -> Callable[[BlobStore], BlobStore]:
    return read_only_twin
