"""Pins the JAX configuration for every test: 8 virtual CPU devices."""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import sys  # noqa: E402

import secrets  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import jax  # noqa: E402  (must come after XLA_FLAGS)
import pytest  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

# pytest puts this folder on sys.path, and its tests/aot subfolder (the mirror of the
# aot package) would then be imported as a namespace package named ``aot`` that
# shadows the real one under an editable install (setuptools' editable finder runs
# after the path finder): ``aot.spec`` & co. would be missing. Import the real
# package first, with this folder off the path.
_TESTS = os.path.dirname(os.path.abspath(__file__))
_saved_path = sys.path[:]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _TESTS]
try:
    import aot  # noqa: E402,F401
finally:
    sys.path[:] = _saved_path
assert hasattr(aot, "lower"), f"imported the wrong aot: {aot!r}"

assert jax.device_count() == 8, "conftest must run before JAX initialises its backend"


@pytest.fixture(autouse=True)
def _no_x64_leak():
    """Tests that flip x64 must not leak the mode into other tests."""
    before = jax.config.jax_enable_x64
    yield
    jax.config.update("jax_enable_x64", before)


# PostgreSQL comes from AOT_TEST_POSTGRES_URL (.ci/postgres.sh starts a server and
# prints it); every test gets a fresh database, dropped afterwards.
POSTGRES_ENV = "AOT_TEST_POSTGRES_URL"
POSTGRES_SKIP_REASON = (
    "AOT_TEST_POSTGRES_URL not set: PostgreSQL tests need a server (.ci/run starts one)"
)


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
