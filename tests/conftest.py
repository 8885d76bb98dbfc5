"""Pins the JAX configuration for every test: 8 virtual CPU devices."""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No environment records in the user's cache folder from the tests' subprocesses
# (tests/cli/test_no_jax_import.py gives its own folder).
os.environ.setdefault("AOT_ENV_RECORD", "off")

import secrets  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import jax  # noqa: E402  (must come after XLA_FLAGS)
import pytest  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

# The test folders are packages (tests.aot, tests.cache.serving, ...), so pytest puts
# the repository root on sys.path, never a test folder: ``aot`` is the real package.
import aot  # noqa: E402

assert hasattr(aot, "lower"), f"imported the wrong aot: {aot!r}"

# On an accelerator (JAX_PLATFORMS=tpu: tests/accelerator on the chip) the host flag
# above does not apply; the CPU suite pins 8 devices.
assert jax.default_backend() != "cpu" or jax.device_count() == 8, (
    "conftest must run before JAX initialises its backend"
)


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


# S3 comes from AOT_TEST_S3_ENDPOINT: an S3-compatible server on loopback (.ci/moto.sh
# starts moto in server mode and prints it). Every test gets a fresh, empty bucket,
# emptied and removed afterwards. Credentials are fake (moto accepts any) unless the
# environment already has some; they, the region and AWS_ENDPOINT_URL are set for the
# test's duration, so subprocesses inherit them.
S3_ENV = "AOT_TEST_S3_ENDPOINT"
S3_SKIP_REASON = (
    "AOT_TEST_S3_ENDPOINT not set: object-store tests need an S3-compatible server "
    "(.ci/run starts moto; or `bash .ci/moto.sh`)"
)


@pytest.fixture(scope="session")
def s3_endpoint() -> str:
    endpoint = os.environ.get(S3_ENV, "").strip()
    if not endpoint:
        pytest.skip(S3_SKIP_REASON)
    return endpoint


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The standard AWS configuration pointed at the test server; returns the endpoint."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", os.environ.get("AWS_ACCESS_KEY_ID", "testing"))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"))
    monkeypatch.setenv("AWS_DEFAULT_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return s3_endpoint


def _s3_client(endpoint: str):  # type: ignore[no-untyped-def]
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
    )


@pytest.fixture
def s3_bucket(s3_env: str) -> Iterator[str]:
    """A fresh, empty bucket on the test server (its name; removed afterwards)."""
    name = f"aot-test-{secrets.token_hex(6)}"
    client = _s3_client(s3_env)
    client.create_bucket(Bucket=name)
    try:
        yield name
    finally:
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=name):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys})
        client.delete_bucket(Bucket=name)


@pytest.fixture
def s3_url(s3_bucket: str) -> str:
    """``s3://BUCKET/PREFIX`` in a fresh bucket."""
    return f"s3://{s3_bucket}/blobs"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def private_moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[object, str]]:
    """An in-process moto server on a free port, for tests that stop it or switch on
    authentication (the shared one is never disturbed); its state survives stop/start.
    The AWS configuration points at it and a bucket ``private`` exists."""
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    port = free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="private")
    try:
        yield server, endpoint
    finally:
        server.stop()
