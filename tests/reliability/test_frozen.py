"""A frozen (SIGSTOPped) dependency never hangs a process (issue 23, item 1).

A stopped server keeps its sockets open: the kernel accepts connections and
acknowledges bytes, nothing answers. Server-side bounds (PostgreSQL's
statement_timeout) cannot fire; only the client's bounds do. Each test starts its own
server (never the shared ones) and always thaws and stops it in a finally.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.frozen_servers import (
    freeze_tree,
    moto_missing,
    postgres_missing,
    private_moto,
    private_postgres,
    thaw,
)
from tests.reliability.helpers import child_env

HERE = Path(__file__).resolve().parent
WORKER = HERE / "frozen_worker.py"
EXIT_TIMEOUT = 2.0

pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    env = child_env()
    env["PYTHONPATH"] = str(HERE.parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def test_frozen_index_serving_goes_on_and_the_process_exits_within_the_bound(tmp_path: Path) -> None:
    reason = postgres_missing()
    if reason:
        pytest.skip(reason)
    blobs = str(tmp_path / "blobs")
    env = _env(AOT_STATS_EXIT_TIMEOUT=str(EXIT_TIMEOUT), AOT_DB_CONNECT_TIMEOUT="2")
    with private_postgres() as pg:
        subprocess.run([sys.executable, str(WORKER), "populate", pg.url, blobs], env=env,
                       check=True, timeout=120, capture_output=True)
        child = subprocess.Popen(
            [sys.executable, str(WORKER), "serve", pg.url, blobs], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        frozen: list[int] = []
        try:
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline().strip() == "ready"
            frozen = freeze_tree(pg.pid)  # the postmaster and every backend
            child.stdin.write("go\n")
            child.stdin.flush()
            line = child.stdout.readline()
            said = time.monotonic()
            child.wait(timeout=60)
            exit_s = time.monotonic() - said
            stderr = child.stderr.read() if child.stderr else ""
        finally:
            thaw(frozen)
            if child.poll() is None:
                child.kill()
                child.wait()
    assert child.returncode == 0, stderr
    measured = json.loads(line)
    # Loaded programs are served while the index is frozen, at call speed.
    assert measured["served_200_s"] < 2.0, measured
    # A lazily loaded bucket whose blobs are on a healthy store: its first call returns.
    assert measured["lazy_first_call_s"] < 10.0, measured
    # The exit flush meets the frozen index: dropped after the bound, with one warning.
    assert exit_s < EXIT_TIMEOUT + 10.0, (exit_s, stderr)
    assert stderr.count("dropped") == 1 and "unflushed call statistics" in stderr, stderr
    print(f"frozen index: 200 calls {measured['served_200_s']:.3f}s, lazy first call "
          f"{measured['lazy_first_call_s']:.3f}s, exit {exit_s:.2f}s (bound {EXIT_TIMEOUT}s)")


READ_TIMEOUT, ATTEMPTS = 1.0, 2


def _s3_env(endpoint: str) -> dict[str, str]:
    env = _env(AOT_BLOB_READ_TIMEOUT=str(READ_TIMEOUT), AOT_BLOB_CONNECT_TIMEOUT="1",
               AOT_BLOB_RETRIES=str(ATTEMPTS), AWS_ENDPOINT_URL=endpoint)
    env.pop("AWS_ENDPOINT_URL_S3", None)
    env.setdefault("AWS_ACCESS_KEY_ID", "testing")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    return env


def _bucket(endpoint: str, name: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket=name)


def test_a_blob_read_from_a_frozen_s3_fails_within_read_timeout_times_attempts(tmp_path: Path) -> None:
    reason = moto_missing()
    if reason:
        pytest.skip(reason)
    index = str(tmp_path / "cache")
    with private_moto() as s3:
        env = _s3_env(s3.url)
        _bucket(s3.url, "frozen")
        subprocess.run([sys.executable, str(WORKER), "populate", index, "s3://frozen/blobs"],
                       env=env, check=True, timeout=120, capture_output=True)
        s3.freeze()
        try:
            start = time.monotonic()
            done = subprocess.run([sys.executable, str(WORKER), "read", index, "s3://frozen/blobs"],
                                  env=env, capture_output=True, text=True, timeout=120)
            wall = time.monotonic() - start
        finally:
            s3.thaw()
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert not outcome["ok"]
    assert "CacheError" in outcome["error"] and "did not answer" in outcome["error"], outcome
    # One request: READ_TIMEOUT x ATTEMPTS plus botocore's backoff (< 1 s per retry here),
    # once per blob read before the load gives up.
    bound = READ_TIMEOUT * ATTEMPTS + 2.0 * (ATTEMPTS - 1) + 2.0
    assert outcome["seconds"] < bound, (outcome, bound)
    print(f"frozen S3: a blob read failed in {outcome['seconds']:.2f}s (bound {bound:.1f}s), "
          f"process {wall:.1f}s wall")
