"""A shared cache describes itself: a PostgreSQL index with blobs on S3 records where
its blobs are, so a client that forgets --blobs serves and verifies correctly, one
that gives another location is refused unless it says it is a mirror, and verify
never quarantines a fleet because of a wrong location."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sqlalchemy as sa

import aot
from aot.errors import BlobLocationError
from tests.cli.helpers import Invoke

pytestmark = pytest.mark.postgres


def _gelu(x):  # noqa: ANN001, ANN202
    return jax.nn.gelu(x) * 3.0


def _relu(x):  # noqa: ANN001, ANN202
    return jax.nn.relu(x) - 1.0


@pytest.fixture
def written(postgres_url: str, s3_url: str) -> str:
    """A cache created by a writer with blobs on S3: two names."""
    with aot.Cache(postgres_url, blob_location=s3_url) as writer:
        writer.compile(_gelu, aot.spec("f32[16]"), name="gelu")
        writer.compile(_relu, aot.spec("f32[16]"), name="relu")
        described = writer.index.description()
    assert described is not None and described.blob_location == s3_url
    return postgres_url


def _states(url: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return sorted(r[0] for r in conn.exec_driver_sql("SELECT state FROM artifacts"))
    finally:
        engine.dispose()


def test_client_without_blobs_serves_the_recorded_location(written: str, s3_url: str, invoke: Invoke) -> None:
    x = jnp.linspace(-3.0, 3.0, 16, dtype=jnp.float32)
    with aot.Cache(written, read_only=True) as client:
        assert client.blob_location == s3_url
        for name, fn in (("gelu", _gelu), ("relu", _relu)):
            served = aot.load(name, cache=client, strict=True)
            np.testing.assert_array_equal(np.asarray(served(x)), np.asarray(jax.jit(fn)(x)))
    verify = invoke("verify", "--json", cache=written)
    assert verify.exit_code == 0, verify.output
    report = json.loads(verify.stdout)
    integrity = report.get("integrity", report)
    assert report["ok"] and integrity["quarantined"] == [] and integrity["checked_entries"] == 2
    assert _states(written) == ["ok", "ok"]


def test_another_location_is_refused_unless_a_mirror(written: str, s3_url: str, s3_bucket: str, invoke: Invoke) -> None:
    other = f"s3://{s3_bucket}/elsewhere"
    with pytest.raises(BlobLocationError) as refused:
        aot.Cache(written, blob_location=other)
    assert s3_url in str(refused.value) and other in str(refused.value)
    assert "--blobs-mirror" in str(refused.value)
    cli = invoke("--blobs", other, "ls", cache=written)
    assert cli.exit_code == 1 and s3_url in cli.output and other in cli.output
    with aot.Cache(written, blob_location=other, blob_mirror=True, read_only=True) as mirror:
        assert mirror.blob_location == other
        assert {e.name for e in mirror.entries()} == {"gelu", "relu"}
    assert invoke("--blobs", other, "--blobs-mirror", "ls", cache=written).exit_code == 0
    # The same location, spelled with a trailing slash, is the recorded one.
    with aot.Cache(written, blob_location=s3_url + "/", read_only=True) as same:
        assert len(same.entries()) == 2


def test_verify_at_a_wrong_location_changes_nothing(written: str, s3_url: str, s3_bucket: str, invoke: Invoke) -> None:
    other = f"s3://{s3_bucket}/elsewhere"
    result = invoke("--blobs", other, "--blobs-mirror", "verify", cache=written)
    assert result.exit_code == 1
    assert f"2 of 2 entries have no blobs at {other}" in result.output
    assert f"records {s3_url}" in result.output
    assert _states(written) == ["ok", "ok"]
    assert invoke("verify", cache=written).exit_code == 0


def test_a_cache_written_before_cache_meta_still_opens(written: str, s3_url: str) -> None:
    engine = sa.create_engine(written)
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM cache_meta")
    engine.dispose()
    # Without --blobs the database holds none of its blobs: nothing is recorded (no guess).
    with aot.Cache(written) as forgetful:
        assert forgetful.blob_location is None and forgetful.index.description() is None
    # The next writable open at the right location records it; then no --blobs is needed.
    with aot.Cache(written, blob_location=s3_url) as right:
        described = right.index.description()
        assert described is not None and described.blob_location == s3_url
    x = jnp.ones(16, jnp.float32)
    with aot.Cache(written, read_only=True) as client:
        np.testing.assert_array_equal(np.asarray(aot.load("relu", cache=client)(x)), np.asarray(jax.jit(_relu)(x)))


def test_pull_without_from_blobs_reads_the_recorded_location(written: str, invoke: Invoke, tmp_path) -> None:  # noqa: ANN001
    pulled = invoke("pull", written, "--json", cache=tmp_path / "replica")
    assert pulled.exit_code == 0, pulled.output
    assert json.loads(pulled.stdout)["copied"] == 2


def test_pull_error_names_the_missing_flag(tmp_path) -> None:  # noqa: ANN001
    from aot.cache.admin.transfer import copy_entries

    source = aot.Cache(tmp_path / "source")
    source.compile(_gelu, aot.spec("f32[16]"), name="gelu")
    for path in (tmp_path / "source" / "blobs").rglob("*.zst"):
        path.unlink()
    report = copy_entries(source, aot.Cache(tmp_path / "replica"))
    assert len(report.failed) == 1 and "--from-blobs" in report.failed[0][1]
    source.close()


def test_a_tier_never_hides_a_wrong_location(written: str, s3_bucket: str, invoke: Invoke, tmp_path) -> None:  # noqa: ANN001
    assert invoke("pull", written, cache=tmp_path / "tier").exit_code == 0  # a filled tier
    with pytest.raises(BlobLocationError):
        aot.Cache(written, blob_location=f"s3://{s3_bucket}/elsewhere", local=tmp_path / "tier")
