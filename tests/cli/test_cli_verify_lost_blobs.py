"""Issue 38: verify tells a blob store that lost its blobs (the location the cache
itself names is in use, and it is empty) from a wrong --blobs, and lists the entries
with missing blobs either way (JSON ``problems``), changing nothing."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp

import aot
from tests.cli.helpers import Invoke


def _write(location: str, blobs: str | None) -> None:
    with aot.Cache(location, blob_location=blobs) as writer:
        for scale in (1.0, 2.0):
            writer.compile(lambda x, s=scale: jnp.tanh(x) * s, aot.spec("f32[4]"), name=f"f{int(scale)}")


def _lost(report: dict) -> tuple[list[str], list[str]]:
    integrity = report.get("integrity", report)
    return sorted({p["name"] for p in integrity["problems"]}), integrity["cache_problems"]


def test_an_emptied_s3_store_is_not_called_a_wrong_location(s3_url: str, s3_bucket: str, invoke: Invoke, tmp_path: Path) -> None:
    from tests.conftest import _s3_client  # the test server's client
    import os

    index = f"sqlite:///{tmp_path / 'index.sqlite'}"
    _write(index, s3_url)
    client = _s3_client(os.environ["AWS_ENDPOINT_URL"])
    listed = client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])
    assert listed
    client.delete_objects(Bucket=s3_bucket, Delete={"Objects": [{"Key": o["Key"]} for o in listed]})
    result = invoke("verify", "--json", cache=index)
    assert result.exit_code == 1, result.output
    names, problems = _lost(json.loads(result.stdout))
    assert names == ["f1", "f2"]
    assert "is empty: its blobs were deleted or lost (not a wrong --blobs)" in problems[0]
    assert "is --blobs right?" not in problems[0]
    # A mirror elsewhere (a --blobs the index does not record): a wrong location, listed too.
    other = f"s3://{s3_bucket}/elsewhere"
    result = invoke("--blobs", other, "--blobs-mirror", "verify", "--json", cache=index)
    assert result.exit_code == 1, result.output
    names, problems = _lost(json.loads(result.stdout))
    assert names == ["f1", "f2"] and "is --blobs right?" in problems[0]
    with aot.Cache(index, read_only=True) as cache:
        assert [e.state for e in cache.entries()] == ["ok", "ok"]


def test_an_emptied_blob_folder_is_not_called_a_wrong_location(invoke: Invoke, tmp_path: Path) -> None:
    folder = tmp_path / "c"
    _write(str(folder), None)
    for path in (folder / "blobs").rglob("*.zst"):
        path.unlink()
    result = invoke("verify", "--json", cache=folder)
    assert result.exit_code == 1, result.output
    names, problems = _lost(json.loads(result.stdout))
    assert names == ["f1", "f2"]
    assert "is empty: its blobs were deleted or lost (not a wrong --blobs)" in problems[0]
    result = invoke("--blobs", str(tmp_path / "elsewhere"), "verify", "--json", cache=folder)
    assert result.exit_code == 1, result.output
    names, problems = _lost(json.loads(result.stdout))
    assert names == ["f1", "f2"] and "is --blobs right?" in problems[0]
