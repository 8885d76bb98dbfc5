"""A frozen (SIGSTOPped) dependency never hangs a process (issue 23, item 1).

A stopped server keeps its sockets open: the kernel accepts connections and
acknowledges bytes, nothing answers. Server-side bounds (PostgreSQL's
statement_timeout) cannot fire; only the client's bounds do. Each test starts its own
server (never the shared ones) and always thaws and stops it in a finally.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


def _readline(stream: Any, timeout: float) -> str:
    """A line from a child's pipe, or a failure after ``timeout`` s (a hung child must
    fail the test, not hang it)."""
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, f"the child said nothing within {timeout} s"
    return stream.readline()


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
            assert _readline(child.stdout, 60).strip() == "ready"
            frozen = freeze_tree(pg.pid)  # the postmaster and every backend
            child.stdin.write("go\n")
            child.stdin.flush()
            line = _readline(child.stdout, 30)
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
    # once per blob read before the load gives up, plus opening the cache and the load's
    # own work, which take seconds on a CI machine at load 10 (unbounded, it was 254 s).
    bound = READ_TIMEOUT * ATTEMPTS + 2.0 * (ATTEMPTS - 1) + 6.0
    assert outcome["seconds"] < bound, (outcome, bound)
    print(f"frozen S3: a blob read failed in {outcome['seconds']:.2f}s (bound {bound:.1f}s), "
          f"process {wall:.1f}s wall")


def test_a_replica_starts_from_its_populated_tier_when_the_remote_is_frozen(tmp_path: Path) -> None:
    reason = postgres_missing() or moto_missing()
    if reason:
        pytest.skip(reason)
    local = str(tmp_path / "local")
    # Any S3 wait would cost 5 s and more; the index's connect bound is 2 s.
    with private_moto() as s3, private_postgres() as pg:
        env = _s3_env(s3.url)
        env.update(AOT_BLOB_READ_TIMEOUT="5", AOT_BLOB_CONNECT_TIMEOUT="5",
                   AOT_DB_CONNECT_TIMEOUT="2", AOT_STATS_EXIT_TIMEOUT=str(EXIT_TIMEOUT))
        _bucket(s3.url, "frozen")
        blobs = "s3://frozen/blobs"
        subprocess.run([sys.executable, str(WORKER), "populate", pg.url, blobs], env=env,
                       check=True, timeout=120, capture_output=True)

        def start() -> tuple[dict, float, str]:
            began = time.monotonic()
            done = subprocess.run([sys.executable, str(WORKER), "tiered", pg.url, blobs, local],
                                  env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout.strip().splitlines()[-1]), time.monotonic() - began, done.stderr

        warm, _, _ = start()  # fills the tier
        s3.freeze()
        try:
            s3_frozen, s3_wall, _ = start()
        finally:
            s3.thaw()
        frozen = freeze_tree(pg.pid)
        s3.freeze()
        try:
            all_frozen, all_wall, stderr = start()
        finally:
            s3.thaw()
            thaw(frozen)
    # Frozen S3: the tier holds every blob, nothing waits on S3.
    assert s3_frozen["start_s"] < 4.0, s3_frozen
    # Frozen index too: one bounded connect (2 s), then the tier serves, with a warning.
    assert all_frozen["start_s"] < 2.0 + 3.0, all_frozen
    assert "unreachable" in stderr and "serving the local tier" in stderr, stderr
    print(f"tier start: warm {warm['start_s']:.2f}s, S3 frozen {s3_frozen['start_s']:.2f}s "
          f"(process {s3_wall:.1f}s), index and S3 frozen {all_frozen['start_s']:.2f}s "
          f"(process {all_wall:.1f}s)")


def _aot(*args: str, env: dict[str, str], timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "aot", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
    return done, time.monotonic() - began


def test_push_to_a_frozen_s3_fails_within_the_bound_and_a_rerun_resumes(tmp_path: Path) -> None:
    reason = moto_missing()
    if reason:
        pytest.skip(reason)
    source, dest = str(tmp_path / "src"), str(tmp_path / "dest")
    with private_moto() as s3:
        env = _s3_env(s3.url)
        env["AOT_STATS_EXIT_TIMEOUT"] = str(EXIT_TIMEOUT)
        _bucket(s3.url, "frozen")
        subprocess.run([sys.executable, str(WORKER), "populate", source, str(tmp_path / "src-blobs")],
                       env=env, check=True, timeout=120, capture_output=True)
        push = ("--cache", source, "--blobs", str(tmp_path / "src-blobs"), "push", dest,
                "--to-blobs", "s3://frozen/blobs")
        s3.freeze()
        try:
            failed, failed_s = _aot(*push, env=env)
        finally:
            s3.thaw()
        resumed, _ = _aot(*push, env=env)
        again, _ = _aot(*push, env=env)
    assert failed.returncode != 0, failed.stdout
    assert "Traceback" not in failed.stderr and "did not answer" in failed.stderr, failed.stderr
    assert failed_s < 15.0, (failed_s, failed.stderr)
    assert resumed.returncode == 0, resumed.stderr
    assert "pushed 2 entries" in resumed.stdout, resumed.stdout
    assert again.returncode == 0 and "2 already there" in again.stdout, again.stdout
    print(f"frozen S3: push failed in {failed_s:.1f}s; rerun: {resumed.stdout.strip()}; "
          f"again: {again.stdout.strip()}")


def test_the_bounds_given_to_a_cache_beat_the_environment_on_a_frozen_s3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``aot.Cache(..., timeouts=aot.Timeouts(blob_read_s=1, blob_retries=1))``: a blob
    read from a frozen S3 fails in about a second, though the environment allows 8 s x 3."""
    reason = moto_missing()
    if reason:
        pytest.skip(reason)
    import aot
    from aot.errors import CacheError

    with private_moto() as s3:
        for name, value in _s3_env(s3.url).items():
            if name.startswith(("AWS_", "AOT_BLOB_")):
                monkeypatch.setenv(name, value)
        monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        monkeypatch.setenv("AOT_BLOB_READ_TIMEOUT", "8")
        monkeypatch.setenv("AOT_BLOB_RETRIES", "3")
        _bucket(s3.url, "frozen")
        given = aot.Timeouts(blob_connect_s=1, blob_read_s=1, blob_retries=1, stats_exit_s=1)
        cache = aot.Cache(tmp_path / "cache", blob_location="s3://frozen/blobs", timeouts=given)
        try:
            digest = cache.blobs.put(b"a blob on a server about to freeze" * 100)
            s3.freeze()
            try:
                start = time.monotonic()
                with pytest.raises(CacheError, match="did not answer"):
                    cache.blobs.get(digest)
                seconds = time.monotonic() - start
            finally:
                s3.thaw()
        finally:
            cache.close()
    # One request of 1 s x 1 attempt, plus s3fs's and the test's own work on a loaded
    # machine; with the environment's bounds it would wait 8 s x 3.
    assert seconds < 1.0 + 3.0, seconds
    print(f"frozen S3, Cache(timeouts=read 1 s x 1): a blob read failed in {seconds:.2f}s")
