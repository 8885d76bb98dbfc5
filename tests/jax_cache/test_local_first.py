"""aot.jax_cache's warm start from the local tier: no remote opened, digests and
signatures still checked, the hits recorded in the index afterwards (SQLite, and
PostgreSQL + S3)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import aot
from aot.cache.cache import Cache
from aot.cache.jax_cache.local_rows import LocalRows

REPO = Path(__file__).resolve().parents[2]
KEY = "jit_train_step-" + "c" * 64


def _payload(body: bytes, seconds: int = 2) -> bytes:
    from jax._src import compilation_cache as cc  # only to build a payload as JAX does

    return cc.compress_executable(cc.combine_executable_and_time(body, seconds))


@pytest.fixture(params=["sqlite", pytest.param("postgresql+s3", marks=pytest.mark.postgres)])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str | None]:
    """(cache location, blob location) of the shared cache."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'index.db'}", None
    return str(request.getfixturevalue("postgres_url")), str(request.getfixturevalue("s3_url"))


@pytest.fixture
def installed() -> Iterator[None]:
    try:
        yield
    finally:
        aot.jax_cache.uninstall()


def _fill(remote: tuple[str, str | None], local: Path, payload: bytes, **kwargs: object) -> None:
    backend = aot.jax_cache.install(remote[0], blob_location=remote[1], local=local, **kwargs)  # type: ignore[arg-type]
    assert backend.get(KEY) is None
    backend.put(KEY, payload)
    aot.jax_cache.uninstall()


def test_warm_local_start_opens_no_remote_and_records_its_hits(
    remote: tuple[str, str | None], tmp_path: Path, installed: None,
) -> None:
    payload = _payload(b"step" * 200)
    _fill(remote, tmp_path / "local", payload)
    backend = aot.jax_cache.install(remote[0], blob_location=remote[1], local=tmp_path / "local")
    assert backend.get(KEY) == payload
    assert backend.counts.hits == 1
    assert not backend.remote_open  # neither the index nor the blob store was opened
    aot.jax_cache.uninstall()  # records the local hit in the shared index
    cache = Cache(remote[0], blob_location=remote[1])
    try:
        [stats] = cache.index.jit_stats("train_step")
        assert (stats.hits, stats.misses) == (1, 1)
        assert cache.index.jit_get(KEY) is not None
    finally:
        cache.close()


def test_another_local_tier_fetches_from_the_remote_and_keeps_a_row(
    remote: tuple[str, str | None], tmp_path: Path, installed: None,
) -> None:
    payload = _payload(b"eval" * 200)
    _fill(remote, tmp_path / "one", payload)
    backend = aot.jax_cache.install(remote[0], blob_location=remote[1], local=tmp_path / "two")
    assert backend.get(KEY) == payload
    assert backend.remote_open
    row = LocalRows(tmp_path / "two").get(KEY)
    assert row is not None and row.name == "train_step"
    aot.jax_cache.uninstall()
    again = aot.jax_cache.install(remote[0], blob_location=remote[1], local=tmp_path / "two")
    assert again.get(KEY) == payload and not again.remote_open


def test_corrupt_local_blob_is_refetched_from_the_remote(
    remote: tuple[str, str | None], tmp_path: Path, installed: None, caplog: pytest.LogCaptureFixture,
) -> None:
    payload = _payload(b"loss" * 200)
    _fill(remote, tmp_path / "local", payload)
    row = LocalRows(tmp_path / "local").get(KEY)
    assert row is not None
    [blob] = (tmp_path / "local").glob(f"{row.digest[:2]}/{row.digest}.zst")
    blob.write_bytes(blob.read_bytes()[:-7] + b"garbage")
    backend = aot.jax_cache.install(remote[0], blob_location=remote[1], local=tmp_path / "local")
    with caplog.at_level(logging.WARNING, logger="aot.cache.jax_cache"):
        assert backend.get(KEY) == payload  # the verified remote copy, never the corrupt one
    assert backend.remote_open
    assert "unusable" in caplog.text
    aot.jax_cache.uninstall()
    again = aot.jax_cache.install(remote[0], blob_location=remote[1], local=tmp_path / "local")
    assert again.get(KEY) == payload and not again.remote_open  # the local copy was repaired


def test_unsigned_local_row_is_not_served_under_a_signing_key(tmp_path: Path, installed: None) -> None:
    remote = (str(tmp_path / "c"), None)
    _fill(remote, tmp_path / "local", _payload(b"step" * 200))
    backend = aot.jax_cache.install(remote[0], local=tmp_path / "local", signing_key="k" * 32, compile_once=False)
    assert backend.get(KEY) is None  # refused locally and by the index: compiled again
    assert backend.remote_open and backend.counts.hits == 0


@pytest.mark.postgres
def test_warm_local_start_imports_no_remote_client(
    postgres_url: str, s3_url: str, tmp_path: Path, installed: None,
) -> None:
    payload = _payload(b"step" * 200)
    _fill((postgres_url, s3_url), tmp_path / "local", payload)
    code = (
        "import sys, aot\n"
        f"b = aot.jax_cache.install({postgres_url!r}, blob_location={s3_url!r}, local={str(tmp_path / 'local')!r})\n"
        f"hit = b.get({KEY!r}) is not None\n"
        "import json; print(json.dumps([hit, sorted(m for m in ('sqlalchemy', 's3fs', 'psycopg') if m in sys.modules)]))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == [True, []]
