"""Benchmark of the gc/writer protocol: what leases and the deletion lock cost.

    python benchmarks/bench_gc.py [--url POSTGRES_URL] [--puts 40] [--orphans 2000]

For each backend (SQLite + blob folder; with --url also PostgreSQL with blobs in the
database and PostgreSQL + blob folder, in a temporary database):

* ``put_artifact`` latency (p50 / max) of new entries (lease, blobs, commit);
* gc deleting ``--orphans`` unreferenced 16 KiB blobs: wall time, blobs per second,
  and the longest time one batch held the deletion lock (writers wait that long);
* a writer storing entries while that gc runs: its p50 / max put latency.

Figures depend on the machine (disk, fsync, load): read them as orders of magnitude.
Nothing is written outside /tmp and the temporary database.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def artifacts(n: int) -> list[Any]:
    import aot
    from aot.build import build_artifact

    def scaled(x):  # noqa: ANN001, ANN202
        return x * 3.0 - 1.0

    out = []
    for size in range(1, n + 1):
        computation = aot.lower(scaled, aot.spec(f"f32[{size}]"), name="bench.gc")
        executable = computation.compile()
        out.append(build_artifact(executable, computation.portable_hlo(executable)))
    return out


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:6.1f} / {max(values) * 1e3:6.1f} ms"


def bench(label: str, location: str, blob_location: str | None, arts: list[Any], orphans: int) -> list[str]:
    from aot.cache import pauses
    from aot.cache.admin import maintenance
    from aot.cache.cache import Cache

    half = len(arts) // 2
    cache = Cache(location, blob_location=blob_location)
    latencies = []
    for artifact in arts[:half]:
        t = time.perf_counter()
        cache.put_artifact(artifact)
        latencies.append(time.perf_counter() - t)
    rows = [f"{label:22s} put (lease, blobs, commit) p50 / max      {ms(latencies)}"]
    for _ in range(orphans):
        cache.blobs.put(secrets.token_bytes(16 * 1024))
    maintenance.ORPHAN_GRACE_SECONDS = 0.0
    held: list[float] = []
    locked_at = [0.0]

    def hook(point: str) -> None:
        if point == "gc.locked":
            locked_at[0] = time.perf_counter()
        elif point == "gc.deleted":
            held.append(time.perf_counter() - locked_at[0])

    writer_latencies: list[float] = []
    done = threading.Event()

    def writer() -> None:
        other = Cache(location, blob_location=blob_location)
        for artifact in arts[half:]:
            if done.is_set():
                break
            t = time.perf_counter()
            other.put_artifact(artifact)
            writer_latencies.append(time.perf_counter() - t)
        other.close()

    previous = pauses.set_hook(hook)
    thread = threading.Thread(target=writer)
    t = time.perf_counter()
    thread.start()
    plan = cache.gc()
    seconds = time.perf_counter() - t
    done.set()
    thread.join()
    pauses.set_hook(previous)
    rows.append(
        f"{label:22s} gc of {len(plan.blobs)} blobs: {seconds:6.2f} s, {len(plan.blobs) / seconds:7.0f} blobs/s, "
        f"lock held per batch of {maintenance.GC_BATCH} p50 / max {ms(held)}"
    )
    if writer_latencies:
        rows.append(f"{label:22s} put while gc runs ({len(writer_latencies)}) p50 / max  {ms(writer_latencies)}")
    cache.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="PostgreSQL server URL (a temporary database is used)")
    parser.add_argument("--puts", type=int, default=40)
    parser.add_argument("--orphans", type=int, default=2000)
    args = parser.parse_args(argv)
    arts = artifacts(args.puts)
    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="aot-bench-gc-", dir="/tmp") as tmp:
        rows += bench("sqlite + folder", str(Path(tmp) / "cache"), None, arts, args.orphans)
        if args.url:
            import sqlalchemy as sa
            from sqlalchemy.engine import make_url
            from sqlalchemy.pool import NullPool

            for label, blobs in (("postgresql + db blobs", None), ("postgresql + folder", str(Path(tmp) / "pgblobs"))):
                name = f"aot_bench_{secrets.token_hex(4)}"
                admin = sa.create_engine(args.url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
                with admin.connect() as conn:
                    conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
                try:
                    url = make_url(args.url).set(database=name).render_as_string(hide_password=False)
                    rows += bench(label, url, blobs, arts, args.orphans)
                finally:
                    with admin.connect() as conn:
                        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    admin.dispose()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
