"""Every command on the fleet's shared cache: a PostgreSQL index with blobs on S3
(--cache URL --blobs s3://...), and what verify and doctor say about object-store
problems (missing and corrupt objects, an unreachable endpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

import aot
from aot.cache.storage.content import compress
from tests.cli.helpers import MANIFEST, Invoke, one_line_error

pytestmark = pytest.mark.postgres


@pytest.fixture
def fleet(invoke: Invoke, postgres_url: str, s3_url: str) -> Invoke:
    """``fleet("ls")`` runs ``aot --cache POSTGRES --blobs S3 ls``."""

    def run(*args: str, **kwargs):  # noqa: ANN202
        return invoke("--blobs", s3_url, *args, cache=postgres_url, **kwargs)

    return run


def _objects(s3_url: str) -> set[str]:
    bucket, prefix = s3_url[len("s3://"):].split("/", 1)
    client = boto3.client("s3")
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return {o["Key"].rsplit("/", 1)[-1] for page in pages for o in page.get("Contents", [])}


def test_every_command(fleet: Invoke, postgres_url: str, s3_url: str, s3_bucket: str) -> None:
    warm = fleet("warmup", MANIFEST, "--jobs", "1")
    assert warm.exit_code == 0, warm.output
    listing = json.loads(fleet("ls", "--json").stdout)
    assert len(listing["entries"]) == 5
    digests = {e[k] for e in listing["entries"] for k in ("exe_digest", "hlo_digest")}
    assert {f"{d}.zst" for d in digests} <= _objects(s3_url)
    assert fleet("show", "tiny").stdout.startswith("tiny (x: f32[8], y: f32[8])\n")
    assert fleet("show", "tiny", "--hlo").stdout.startswith("module @")
    compiled = fleet("compile", "fixtures.models:tiny", "--arg", "f32[4]", "--arg", "f32[4]", "--name", "tiny4")
    assert compiled.exit_code == 0 and compiled.stdout.startswith("miss: compiled and stored tiny4")
    assert fleet("verify").stdout.endswith(": ok\n")
    doctor = json.loads(fleet("doctor", "--json").stdout)
    assert doctor["ok"] is True and doctor["cache"]["blobs"] == s3_url
    assert doctor["health"]["checked_blobs"] == 12

    bundle = f"s3://{s3_bucket}/ship/all.aotb"
    assert fleet("bundle", "export", bundle).stdout.startswith(f"exported 6 entries to {bundle}")
    tiny4 = json.loads(fleet("ls", "tiny4", "--json").stdout)["entries"][0]
    removed = fleet("rm", "tiny4", "--yes")
    assert removed.exit_code == 0 and removed.stdout.startswith("removed 1 entry")
    assert not {f"{tiny4['exe_digest']}.zst", f"{tiny4['hlo_digest']}.zst"} & _objects(s3_url)
    gc = json.loads(fleet("gc", "--max-size", "0", "--yes", "--json").stdout)
    assert (len(gc["entries"]), len(gc["pinned"])) == (0, 5)  # served entries are pinned
    emptied = fleet("rm", "*", "--yes")
    assert emptied.exit_code == 0 and emptied.stdout.startswith("removed 5 entries"), emptied.output
    assert not any(name.endswith(".zst") for name in _objects(s3_url))
    imported = fleet("bundle", "import", bundle)
    assert imported.stdout == f"imported 6 entries from {bundle} (0 already present)\n"
    assert fleet("verify").exit_code == 0

    served = aot.Cache(postgres_url, blob_location=s3_url, read_only=True)
    assert aot.load("tiny", cache=served, strict=True).signatures == ["f32[8], f32[8]"]
    served.close()


def test_verify_and_doctor_report_object_store_problems(fleet: Invoke, s3_url: str, monkeypatch) -> None:  # noqa: ANN001
    assert fleet("warmup", MANIFEST, "--jobs", "1").exit_code == 0
    entries = {e["name"]: e for e in json.loads(fleet("ls", "--json").stdout)["entries"]}
    bucket, prefix = s3_url[len("s3://"):].split("/", 1)
    client = boto3.client("s3")
    gone, rotten = entries["tiny"]["exe_digest"], entries["allreduce"]["hlo_digest"]
    client.delete_object(Bucket=bucket, Key=f"{prefix}/{gone[:2]}/{gone}.zst")
    client.put_object(Bucket=bucket, Key=f"{prefix}/{rotten[:2]}/{rotten}.zst", Body=compress(b"x"))

    doctor = fleet("doctor")
    assert doctor.exit_code == 1
    assert "  health    2 problems, 0 unreferenced blobs (run `aot verify`)" in doctor.stdout
    verify = fleet("verify", "--read-only", "--json")
    assert verify.exit_code == 1
    problems = {p["name"]: p["problem"] for p in json.loads(verify.stdout)["integrity"]["problems"]}
    assert problems == {
        "tiny": f"executable blob {gone[:12]}: missing",
        "allreduce": f"portable_hlo blob {rotten[:12]}: digest mismatch",
    }

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    line = one_line_error(fleet("verify"))
    assert line.startswith("Error: cannot read blob ") and f"at {s3_url}: the object store did not answer" in line
    assert "http://127.0.0.1:9 (from AWS_ENDPOINT_URL)" in line
    down = json.loads(fleet("doctor", "--json").stdout)
    assert down["ok"] is False and "did not answer" in down["cache"]["error"]
    assert "testing" not in json.dumps(down)  # the (fake) credentials are nowhere


def test_a_replica_with_a_local_tier(fleet: Invoke, postgres_url: str, s3_url: str, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    assert fleet("warmup", MANIFEST, "--jobs", "1").exit_code == 0
    tier = tmp_path / "tier"
    monkeypatch.setenv("AOT_LOCAL", str(tier))
    before = fleet("doctor", "--no-verify")
    assert f"  local tier   {tier}  (environment AOT_LOCAL)\n" in before.stdout
    assert f"local tier\n  location  {tier}\n  entries   0 (0 usable in this environment), 0 B stored\n" in before.stdout
    # a replica serves through it (strict, read-only), and keeps its statistics there
    cache = aot.Cache(postgres_url, blob_location=s3_url, read_only=True, local=tier)
    fn = aot.load("mlp.forward", cache=cache, strict=True)
    assert len(fn.signatures) == 3
    cache.close()
    after = json.loads(fleet("doctor", "--json", "--no-verify").stdout)
    assert after["local"]["entries"] == 3 and after["local"]["error"] is None
    stats = json.loads(fleet("--read-only", "stats", "--json").stdout)
    assert stats["totals"]["loads"] == 3 and stats["location"].endswith(f"{tier}/index.sqlite")
