"""The fleet's shared cache: time to ready from PostgreSQL + S3, and push throughput.

    python -m benchmarks.bench_fleet [--postgres URL] [--endpoint URL] [--runs 3]
                                     [--json out.json]

Needs a PostgreSQL server (``--postgres`` or ``AOT_TEST_POSTGRES_URL``: a temporary
database is created there and dropped) and an S3-compatible server (``--endpoint`` or
``AOT_TEST_S3_ENDPOINT``; without either, moto is started on a free loopback port).
Credentials are fake (moto accepts any). moto is a Python server on the same cores:
object-store times are a floor set by moto, not by S3.

``ready``: a fresh process (8 virtual CPU devices) opens the cache and runs
``aot.load("mlp.forward", cache, strict=True)`` (all 8 batch buckets, 1..128, loaded
in parallel) until the dispatcher is ready; imports are timed apart. Variants, run
interleaved:

* ``folder``: the default SQLite index + blob folder on local disk;
* ``postgresql + s3``: the shared cache read directly (read-only);
* ``... cold tier``: through a local tier (``local=``) that starts empty: every blob
  is fetched, verified and kept;
* ``... warm tier``: through the tier the cold run filled (rows from PostgreSQL, no
  blob from S3);
* ``... warm tier, refresh=False``: the same, without asking PostgreSQL for the rows
  (the remote is still opened: one connection and a schema check).

``push``: ``aot push`` (the library call :func:`aot.cache.admin.transfer.push`) from a
folder cache into a fresh PostgreSQL database and S3 prefix, with ``--jobs 1`` and
``--jobs 4``; entries/s and MB/s of stored bytes; then the same push again (everything
skipped: each destination entry's blobs are re-read and verified). Two sets: ``small``,
the 8 MLP buckets and the 12-layer transformer train step (9 entries, tens of KiB
each: latency-bound), and ``large``, 4 programs that embed a random 4 MB constant (an
8 MB entry each, incompressible: bandwidth-bound).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MARK = "FLEET_JSON "
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
NAME = "mlp.forward"

_READY = """
import json, os, sys, time
t0 = time.perf_counter()
import jax
jax.devices()
import aot
import aot.cache.cache, aot.cache.serving.load, aot.cache.tiered, aot.cache.index.sql
# What any variant may need, imported before the clock starts: "ready" is connections,
# queries, blob reads and deserializing; imports are reported apart.
import psycopg, s3fs, sqlalchemy.dialects.postgresql.psycopg, sqlalchemy.dialects.sqlite.pysqlite
t1 = time.perf_counter()
location, blobs, local, refresh = sys.argv[1], sys.argv[2] or None, sys.argv[3] or None, sys.argv[4]
options = {"read_only": True}  # as a replica opens it
if blobs:
    options["blob_location"] = blobs
if local:
    options.update(local=local, refresh=refresh == "1")
cache = aot.Cache(location, **options)
fn = aot.load("mlp.forward", cache=cache, strict=True)
t2 = time.perf_counter()
assert len(fn.signatures) == 8, fn.signatures
print("FLEET_JSON " + json.dumps({"import_s": t1 - t0, "ready_s": t2 - t1}), flush=True)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    flag = "--xla_force_host_platform_device_count=8"
    if flag not in env.get("XLA_FLAGS", ""):
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("AOT_CACHE", None)
    return env


def _ready(location: str, blobs: str | None, local: str | None, refresh: bool = True) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", _READY, location, blobs or "", local or "", "1" if refresh else "0"],
        env=_env(), capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])  # type: ignore[no-any-return]
    raise RuntimeError(f"ready worker failed ({proc.returncode}): {proc.stderr[-2000:]}")


def _large(n: int) -> list[Any]:
    """``n`` programs embedding a random 1M-float constant (executable and portable HLO
    of ~4 MB each; random bytes do not compress)."""
    import numpy as np

    import aot
    from aot.build import build_artifact

    out = []
    for seed in range(n):
        constant = np.random.default_rng(seed).standard_normal(1_000_000).astype(np.float32)

        def scale(x: Any, c: Any = constant) -> Any:
            return x * c

        computation = aot.lower(scale, aot.spec("f32[1000000]"), name=f"large.{seed}")
        executable = computation.compile()
        out.append(build_artifact(executable, computation.portable_hlo(executable)))
    return out


def _artifacts() -> tuple[list[Any], list[Any]]:
    """The 8 MLP buckets, and the transformer train step (compiled once, here)."""
    import jax

    import aot
    from aot.build import build_artifact

    sys.path.insert(0, str(REPO))
    from fixtures import models

    def build(fn: Any, *specs: Any, name: str) -> Any:
        computation = aot.lower(fn, *specs, name=name)
        executable = computation.compile()
        return build_artifact(executable, computation.portable_hlo(executable))

    params = jax.eval_shape(models.mlp_init)
    mlp = [build(models.mlp_forward, params, models.mlp_input_spec(b), name=NAME) for b in BUCKETS]
    step = build(
        models.transformer_train_step, models.transformer_param_specs(),
        models.transformer_batch_spec(), name="transformer.train_step",
    )
    return mlp, [step]


class Servers:
    """A temporary PostgreSQL database and an S3 bucket (moto started if needed)."""

    def __init__(self, postgres: str, endpoint: str | None) -> None:
        import sqlalchemy as sa
        from sqlalchemy.engine import make_url
        from sqlalchemy.pool import NullPool

        self._moto: subprocess.Popen[bytes] | None = None
        if endpoint is None:
            from benchmarks.bench_object_store import _start_moto

            self._moto, endpoint = _start_moto()
        self.endpoint = endpoint
        os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_DEFAULT_REGION="us-east-1")
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        import boto3

        self.bucket = f"aot-bench-{secrets.token_hex(4)}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=self.bucket)
        self._admin = sa.create_engine(postgres, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        self._base = make_url(postgres)
        self._databases: list[str] = []

    def database(self) -> str:
        name = f"aot_bench_{secrets.token_hex(5)}"
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        self._databases.append(name)
        return self._base.set(database=name).render_as_string(hide_password=False)

    def prefix(self) -> str:
        return f"s3://{self.bucket}/{secrets.token_hex(4)}"

    def close(self) -> None:
        for name in self._databases:
            with self._admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._admin.dispose()
        if self._moto is not None:
            self._moto.kill()


def _median(values: list[float]) -> str:
    if not values:
        return "-"
    text = f"{statistics.median(values):.3f}"
    return text if len(values) == 1 else f"{text} ({min(values):.3f}-{max(values):.3f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", default=os.environ.get("AOT_TEST_POSTGRES_URL"))
    parser.add_argument("--endpoint", default=os.environ.get("AOT_TEST_S3_ENDPOINT"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not args.postgres:
        parser.error("a PostgreSQL server is needed: --postgres URL or AOT_TEST_POSTGRES_URL")
    os.environ.update({k: v for k, v in _env().items() if k in ("XLA_FLAGS", "JAX_PLATFORMS")})

    from benchmarks.run import busy_warning, describe, loadavg, machine

    info = machine()
    print(f"machine: {describe(info)}")
    warning = busy_warning(info["loadavg"], info.get("cpus_usable", info.get("cpu_count")))
    if warning:
        print(warning)
    print(f"command: python -m benchmarks.bench_fleet {' '.join(argv if argv is not None else sys.argv[1:])}\n",
          flush=True)

    import aot
    from aot.cache.admin.transfer import push

    servers = Servers(args.postgres, args.endpoint)
    root = Path(tempfile.mkdtemp(prefix="aot-fleet-"))
    results: dict[str, Any] = {"machine": info, "ready": {}, "push": {}}
    try:
        mlp, big = _artifacts()
        folder = aot.Cache(root / "folder")
        for artifact in mlp + big:
            folder.put(artifact)
        large = aot.Cache(root / "large")
        for artifact in _large(4):
            large.put(artifact)
        shared_url, shared_blobs = servers.database(), servers.prefix()
        first = push(folder, shared_url, [NAME], blob_location=shared_blobs, jobs=4)
        assert len(first.copied) == len(BUCKETS), first.to_dict()
        stored = sum(e.stored_size for e in folder.entries(NAME))

        # ---------------------------------------------------------------- ready
        variants = [
            "folder", "postgresql + s3", "postgresql + s3, cold tier", "postgresql + s3, warm tier",
            "postgresql + s3, warm tier, refresh=False",
        ]
        ready: dict[str, list[float]] = {v: [] for v in variants}
        imports: list[float] = []
        for run in range(args.runs):
            tier = str(root / f"tier{run}")
            for variant in variants:  # interleaved; cold before warm (it fills the tier)
                if variant == "folder":
                    sample = _ready(str(root / "folder"), None, None)
                elif variant == "postgresql + s3":
                    sample = _ready(shared_url, shared_blobs, None)
                else:
                    sample = _ready(shared_url, shared_blobs, tier, refresh="False" not in variant)
                ready[variant].append(sample["ready_s"])
                imports.append(sample["import_s"])
        base = statistics.median(ready["folder"])
        print(f"### ready: aot.load({NAME!r}, strict=True), 8 buckets "
              f"({stored / 1024:.1f} KiB stored), fresh process, seconds (median, min-max of {args.runs})\n")
        print("| variant | ready (s) | / folder |")
        print("|---|---|---|")
        for variant in variants:
            ratio = statistics.median(ready[variant]) / base
            print(f"| {variant} | {_median(ready[variant])} | {ratio:.2f}x |")
        print(f"\nimports before the clock (jax, aot, sqlalchemy, s3fs): {_median(imports)} s\n")
        results["ready"] = {"samples": ready, "import_s": imports, "stored_bytes": stored}

        # ---------------------------------------------------------------- push
        print("### push: folder -> PostgreSQL + S3 (fresh database and prefix per run)\n")
        print("| entries | jobs | first push (s) | entries/s | MB/s | second push, all skipped (s) |")
        print("|---|---|---|---|---|---|")
        for label, source in (("small", folder), ("large", large)):
            entries = source.entries()
            total = sum(e.stored_size for e in entries)
            what = f"{label}: {len(entries)}, {total / 2**20:.2f} MiB"
            for jobs in (1, 4):
                times, again = [], []
                for _ in range(args.runs):
                    url, blobs = servers.database(), servers.prefix()
                    with aot.Cache(url, blob_location=blobs):
                        pass  # the schema exists before the clock starts, as in a fleet
                    start = time.perf_counter()
                    report = push(source, url, blob_location=blobs, jobs=jobs)
                    times.append(time.perf_counter() - start)
                    assert len(report.copied) == len(entries), report.to_dict()
                    start = time.perf_counter()
                    report = push(source, url, blob_location=blobs, jobs=jobs)
                    again.append(time.perf_counter() - start)
                    assert len(report.skipped) == len(entries), report.to_dict()
                t = statistics.median(times)
                print(f"| {what} | {jobs} | {_median(times)} | {len(entries) / t:.1f} | "
                      f"{total / t / 1e6:.2f} | {_median(again)} |")
                results["push"][f"{label}.{jobs}"] = {
                    "seconds": times, "again_seconds": again, "entries": len(entries), "stored_bytes": total,
                }
        print(f"\nload average at end: {loadavg()}")
        if args.json:
            args.json.write_text(json.dumps(results, indent=2, default=str))
    finally:
        servers.close()
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
