"""JAX's persistent compilation cache, three backends side by side (issue 24).

    python -m benchmarks.bench_jax_cache [--postgres URL] [--endpoint URL] [--runs 3]
                                         [--baseline CHECKOUT] [--json out.json]

Needs a PostgreSQL server (``--postgres`` or ``AOT_TEST_POSTGRES_URL``: a temporary
database is created there and dropped) and an S3-compatible server (``--endpoint`` or
``AOT_TEST_S3_ENDPOINT``: a temporary bucket). moto is a Python server on the same
cores: object-store times are a floor set by moto, not by S3.

The workload is a multi-program Flax/Optax training script (benchmarks/jax_cache_worker.py:
init, optimizer init, a train step and an eval step; ~7 jit programs). Each run is a
fresh process with 8 virtual CPU devices; ``first_step`` is the time from the start of
the script's ``main`` (imports done, the cache installed) to the first train step's
result; ``cpu`` the process's user+system seconds.

* ``warm``: time to first step with every program in the cache, for JAX's cache in a
  folder (``jax_compilation_cache_dir=DIR``), JAX's cache on ``s3://`` through
  etils/fsspec, and ours (``aot.jax_cache``: PostgreSQL + S3 + a warm local tier).
* ``cold N``: N processes started together on an empty cache (ours, PostgreSQL + S3,
  compile once per fleet): total CPU seconds, with and without the imports each process
  pays (Python, JAX, Flax), against one cold start; and the compiles counted by JAX's
  events (once per program in total when the claims work). Side by side: N plain JAX
  processes with no shared cache (each compiles everything: a node-local cache on a
  cold fleet), and the floor no cache can go below when JAX computes its key, one cold
  start plus N-1 warm starts of JAX's folder cache (each process still imports, traces,
  lowers and deserializes: JAX's key is a digest of the lowered program).
* ``--baseline CHECKOUT``: another checkout of jax-aot (its ``aot/cache`` and ``aot/cli``
  linked to its ``cache`` and ``cli``, so that ``PYTHONPATH=CHECKOUT`` imports it) run
  as one more variant, interleaved with the others: before/after figures in one run.
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("jax_cache_worker.py")
MARK = "JAXCACHE_JSON "


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PYTHONPATH"] = str(REPO)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env.update(extra)
    return env


def _start(extra: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER)], env=_env(extra), cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed ({proc.returncode}): {err[-2000:]}")
    line = next(x for x in out.splitlines() if x.startswith(MARK))
    result: dict[str, Any] = json.loads(line[len(MARK):])
    return result


def run(extra: dict[str, str]) -> dict[str, Any]:
    return _result(_start(extra))


def _median(values: list[float]) -> float:
    return statistics.median(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", default=os.environ.get("AOT_TEST_POSTGRES_URL"))
    parser.add_argument("--endpoint", default=os.environ.get("AOT_TEST_S3_ENDPOINT"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--baseline", help="a checkout of jax-aot to compare with (see above)")
    args = parser.parse_args(argv)
    if not args.postgres or not args.endpoint:
        parser.error("needs --postgres and --endpoint (or AOT_TEST_POSTGRES_URL and AOT_TEST_S3_ENDPOINT)")
    import boto3
    import sqlalchemy as sa
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ["AWS_ENDPOINT_URL"] = args.endpoint
    bucket = f"aot-bench-{secrets.token_hex(4)}"
    s3 = boto3.client("s3", endpoint_url=args.endpoint)
    s3.create_bucket(Bucket=bucket)
    admin = sa.create_engine(args.postgres, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    databases: list[str] = []

    def database() -> str:
        name = f"aot_bench_{secrets.token_hex(4)}"
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        databases.append(name)
        return make_url(args.postgres).set(database=name).render_as_string(hide_password=False)

    results: dict[str, Any] = {"warm": {}, "cold": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="aot-bench-jax-cache-") as tmp:
            root = Path(tmp)
            db = database()
            variants = {
                "jax folder": {"JAX_COMPILATION_CACHE_DIR": str(root / "jax")},
                "jax s3:// (fsspec)": {"JAX_COMPILATION_CACHE_DIR": f"s3://{bucket}/jax"},
                "aot pg+s3+local": {
                    "AOT_JAX_CACHE": db, "AOT_JAX_CACHE_BLOBS": f"s3://{bucket}/aot",
                    "AOT_JAX_CACHE_LOCAL": str(root / "local"),
                },
            }
            if args.baseline:
                variants["aot baseline"] = {
                    "AOT_JAX_CACHE": db, "AOT_JAX_CACHE_BLOBS": f"s3://{bucket}/aot",
                    "AOT_JAX_CACHE_LOCAL": str(root / "local-baseline"), "PYTHONPATH": args.baseline,
                }
            for env in variants.values():
                run(env)  # fill the cache (and the local tier)
            times: dict[str, list[float]] = {k: [] for k in variants}
            cpus: dict[str, list[float]] = {k: [] for k in variants}
            cpus_main: dict[str, list[float]] = {k: [] for k in variants}
            installs: dict[str, list[float]] = {k: [] for k in variants}
            remote: dict[str, bool] = {}
            for _ in range(args.runs):  # interleaved
                for label, env in variants.items():
                    r = run(env)
                    assert r["hits"] == r["requests"], (label, r)
                    times[label].append(r["first_step"])
                    cpus[label].append(r["cpu"])
                    cpus_main[label].append(r["cpu_main"])
                    installs[label].append(r["install"])
                    remote[label] = remote.get(label, False) or r.get("remote_imported", False)
            folder = _median(times["jax folder"])
            for label, values in times.items():
                results["warm"][label] = {"first_step_median": _median(values), "runs": values,
                                          "install_median": _median(installs[label]),
                                          "cpu_median": _median(cpus[label]),
                                          "cpu_main_median": _median(cpus_main[label]),
                                          "remote_imported": remote.get(label, False),
                                          "ratio_to_jax_folder": _median(values) / folder}
            sides = {"": {}} | ({" baseline": {"PYTHONPATH": args.baseline}} if args.baseline else {})
            sides[" jax alone"] = {}
            for n in (1, 2, 4):
                for side, extra in sides.items():  # interleaved
                    if side == " jax alone":  # no shared cache: every process compiles everything
                        env = {"JAX_COMPILATION_CACHE_DIR": str(root / f"alone{n}-{secrets.token_hex(4)}"),
                               "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": str(1 << 40)}
                    else:
                        env = {"AOT_JAX_CACHE": database(),
                               "AOT_JAX_CACHE_BLOBS": f"s3://{bucket}/cold{n}{side.strip()}", **extra}
                    procs = [_start(env) for _ in range(n)]
                    found = [_result(p) for p in procs]
                    results["cold"][f"{n}{side}"] = {
                        "cpu_total": sum(r["cpu"] for r in found),
                        "cpu_main_total": sum(r["cpu_main"] for r in found),
                        "compiles": sum(r["writes"] for r in found),
                    }
            warm_floor = results["warm"]["jax folder"]
            for side in sides:
                one = results["cold"][f"1{side}"]
                for n in (1, 2, 4):
                    r = results["cold"][f"{n}{side}"]
                    r["ratio_to_one"] = r["cpu_total"] / one["cpu_total"]
                    r["main_ratio_to_one"] = r["cpu_main_total"] / one["cpu_main_total"]
                    r["ratio_to_floor"] = r["cpu_total"] / (one["cpu_total"] + (n - 1) * warm_floor["cpu_median"])
                    r["ratio_to_jax_alone"] = r["cpu_total"] / results["cold"][f"{n} jax alone"]["cpu_total"]
    finally:
        with admin.connect() as conn:
            for name in databases:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
        objects = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
        while objects:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": o["Key"]} for o in objects]})
            objects = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
        s3.delete_bucket(Bucket=bucket)
    results["loadavg"] = os.getloadavg()
    sys.stdout.write("warm start-up, time to first step (median of %d):\n" % args.runs)
    for label, r in results["warm"].items():
        sys.stdout.write(
            f"  {label:22s} {r['first_step_median'] * 1000:8.1f} ms   x{r['ratio_to_jax_folder']:.2f} of jax folder"
            f"   (of which installing the cache {r['install_median'] * 1000:.0f} ms"
            f"{'; SQLAlchemy/s3fs imported' if r['remote_imported'] else ''}); CPU {r['cpu_median']:.2f} s"
            f" ({r['cpu_main_median']:.2f} s after imports)\n"
        )
    sys.stdout.write(
        "concurrent cold starts, total CPU (aot: PostgreSQL + S3, compile once; jax alone: no\n"
        "shared cache; floor: one cold start + N-1 warm starts of JAX's folder cache):\n"
    )
    for n, r in results["cold"].items():
        sys.stdout.write(
            f"  {n:>14s}: {r['cpu_total']:7.2f} s with imports (x{r['ratio_to_one']:.2f} of one, "
            f"x{r['ratio_to_floor']:.2f} of the floor, x{r['ratio_to_jax_alone']:.2f} of jax alone), "
            f"{r['cpu_main_total']:6.2f} s after imports (x{r['main_ratio_to_one']:.2f} of one); "
            f"{r['compiles']} cache misses\n"
        )
    sys.stdout.write(f"load average {results['loadavg']}\n")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
