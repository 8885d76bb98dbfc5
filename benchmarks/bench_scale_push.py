"""``aot push`` of N small entries to S3 (issue 25 goal 5), run by ``bench_scale push``.

The source is a folder cache holding PROGRAMS real tiny programs compiled here (an
elementwise function at f32[1] .. f32[PROGRAMS]) and N - PROGRAMS more index rows that
reuse their blobs under distinct keys, names and signatures (as a fleet's many names
over few distinct executables would; the figure is the per-entry cost of the index, the
existence checks and the verification, plus PROGRAMS distinct uploads). The destination
is a folder index with its blobs in a fresh bucket of the S3 server (moto).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAMS = 20


def source_cache(folder: Path, n: int) -> None:
    import aot
    from aot.cache.cache import Cache

    cache = Cache(str(folder))

    def scaled(x):  # noqa: ANN001, ANN202
        return x * 3.0 - 1.0

    for size in range(1, PROGRAMS + 1):
        cache.compile(scaled, aot.spec(f"f32[{size}]"), name="bench.push")
    from aot.artifact import Manifest
    from aot.fingerprint import Fingerprint, combined_key

    real = cache.index.entries()
    copies = []
    for i in range(n - len(real)):
        # A distinct program (one more fingerprint part) under its own name: its own key
        # and manifest, the executable of the program it copies.
        base = real[i % len(real)]
        manifest = Manifest.from_json(base.manifest)
        program = Fingerprint.of(manifest.program.kind, {**manifest.program.as_dict(), "bench_copy": str(i)})
        name = f"bench.push.n{i // 10:05d}"
        key = combined_key(program, manifest.environment)
        manifest = dataclasses.replace(manifest, name=name, program=program, key=key)
        copies.append(dataclasses.replace(
            base, key=key, name=name, program_fp=program.digest, manifest=manifest.to_json(),
        ))
    for i in range(0, len(copies), 5000):
        cache.index.bulk_insert(copies[i : i + 5000])
    cache.close()


def s3_env(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOT_") and k != "AWS_PROFILE"}
    env.update(
        AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
        AWS_SECRET_ACCESS_KEY=os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
        AWS_DEFAULT_REGION=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"), AWS_EC2_METADATA_DISABLED="true",
        JAX_PLATFORMS="cpu",
    )
    env.pop("AWS_ENDPOINT_URL_S3", None)
    return env


def push_cmd(src: Path, dest: Path, blobs: str) -> list[str]:
    return [sys.executable, "-m", "aot", "--json", "--cache", str(src), "push", str(dest), "--to-blobs", blobs]


def counts(stdout: str) -> str:
    try:
        doc = json.loads(stdout)
    except ValueError:
        return stdout.strip().splitlines()[-1][:200] if stdout.strip() else "(no output)"
    keep = {k: v for k, v in doc.items() if isinstance(v, (int, float, str)) or k in ("copied", "skipped")}
    return json.dumps({k: (len(v) if isinstance(v, list) else v) for k, v in keep.items()})[:300]


def dest_count(dest: Path) -> int:
    import sqlite3

    with sqlite3.connect(f"file:{dest / 'index.sqlite'}?mode=ro", uri=True) as conn:
        return int(conn.execute("SELECT count(*) FROM artifacts").fetchone()[0])


def s3_requests(log: Path | None, bucket: str, start: int) -> tuple[str, int]:
    """The S3 requests on ``bucket`` in the server's access log (moto's, one request a
    line, ``"METHOD /bucket/key HTTP/1.1"``) after byte ``start``, by method; and the
    log's size now. ``("", 0)`` without a log."""
    if log is None or not log.exists():
        return "", 0
    with log.open("rb") as f:
        f.seek(start)
        text = f.read().decode("utf-8", "replace")
    found = re.findall(rf'"(?:\x1b\[[0-9;]*m)*([A-Z]+) /{re.escape(bucket)}[/? ]', text)  # 4xx lines are coloured
    by_method = sorted({m: found.count(m) for m in set(found)}.items())
    return "S3 requests " + " ".join(f"{m} {c:,}" for m, c in by_method), start + len(text.encode())


def log_end(log: Path | None) -> int:
    return log.stat().st_size if log is not None and log.exists() else 0


def bench_push(n: int, endpoint: str | None, moto_log: Path | None = None) -> dict[str, float]:
    import boto3

    if not endpoint:
        raise SystemExit("push needs --endpoint or AOT_TEST_S3_ENDPOINT (the S3 server)")
    env = s3_env(endpoint)
    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name=env["AWS_DEFAULT_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="aot_bench_push_") as tmp:
        src = Path(tmp) / "src"
        t = time.perf_counter()
        source_cache(src, n)
        print(f"  source: {n:,} entries ({PROGRAMS} compiled, the rest reuse their blobs) in {time.perf_counter() - t:.1f} s")
        env["AOT_ENV_RECORD"] = str(Path(tmp) / "env-record")
        buckets = []
        try:
            # 1. a full push
            bucket = f"aot-bench-{secrets.token_hex(4)}"
            client.create_bucket(Bucket=bucket)
            buckets.append(bucket)
            mark = log_end(moto_log)
            t = time.perf_counter()
            done = subprocess.run(push_cmd(src, Path(tmp) / "dest1", f"s3://{bucket}/blobs"),
                                  env=env, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - t
            results["push entries/s"] = n / wall
            results["push wall"] = wall
            print(f"  push {n:,} entries: {wall:.1f} s, {n / wall:,.0f} entries/s (exit {done.returncode}); {counts(done.stdout)}")
            if moto_log is not None:
                print(f"    {s3_requests(moto_log, bucket, mark)[0]}")
            if done.returncode:
                print(done.stderr[-2000:])
            # 2. killed midway (SIGKILL once half the entries are at DEST), then run again
            bucket = f"aot-bench-{secrets.token_hex(4)}"
            client.create_bucket(Bucket=bucket)
            buckets.append(bucket)
            dest = Path(tmp) / "dest2"
            proc = subprocess.Popen(push_cmd(src, dest, f"s3://{bucket}/blobs"), env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            arrived = 0
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    arrived = dest_count(dest)
                except Exception:  # noqa: BLE001 - not created yet, or locked
                    arrived = arrived
                if arrived >= n // 2:
                    break
                time.sleep(0.05)  # polling the destination, not synchronising
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            arrived = dest_count(dest)
            mark = log_end(moto_log)
            t = time.perf_counter()
            again = subprocess.run(push_cmd(src, dest, f"s3://{bucket}/blobs"), env=env,
                                   capture_output=True, text=True, check=False)
            wall = time.perf_counter() - t
            results["entries at DEST after kill -9"] = arrived
            results["resumed push wall"] = wall
            print(f"  kill -9 with {arrived:,} of {n:,} entries at DEST; the next push: {wall:.1f} s (exit {again.returncode}); {counts(again.stdout)}")
            if moto_log is not None:
                print(f"    the next push's {s3_requests(moto_log, bucket, mark)[0]}")
            if again.returncode:
                print(again.stderr[-2000:])
            print(f"  DEST then holds {dest_count(dest):,} entries")
        finally:
            for bucket in buckets:
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                    keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                    if keys:
                        client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
                client.delete_bucket(Bucket=bucket)
    return results


