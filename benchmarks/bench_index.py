"""Benchmark of the cache storage layer: index lookups at scale and blob store throughput.

    python benchmarks/bench_index.py [--n 100000] [--url URL] [--lookups 2000] [--no-jax]

* Fills an index with N synthetic artifact rows (bulk insert; on PostgreSQL then
  ``VACUUM ANALYZE``, as autovacuum would), then measures the p50 / p99 latency of
  ``get(key)``, ``by_name(name, env_fp)`` and ``touch(key)``, and the time of
  ``entries()`` (all rows) and of ``entries(glob)``.
* Blob stores: write and read throughput of a ContentStore over a FolderObjectStore (zstd at the
  default level, temp file + fsync + rename, verified reads) against the same
  protocol writing raw bytes (the "without zstd" baseline: write + fsync +
  rename; read + sha256), on real XLA executables compiled here.
* The compression ratio of real executables and ``jax.export`` bytes.

Without ``--url`` the index is SQLite in a temporary folder under /tmp. With a
PostgreSQL URL a temporary database ``aot_bench_<random>`` is created on that
server and dropped at the end. Nothing is written outside /tmp (and that database).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from aot.cache.storage.folder import FolderObjectStore
from aot.cache.storage.content import DEFAULT_LEVEL, ContentStore, compress, digest_of
from aot.cache.index.advice import mask_url
from aot.cache.index.entry import IndexEntry
from aot.cache.index.sql import Index

SIGNATURES_PER_NAME = 5
ENVS = ("env-cpu-avx512", "env-cpu-avx2", "env-gpu-h100", "env-tpu-v5e")


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.3f} ms"


# ------------------------------------------------------------------------- index


def synthetic_entries(n: int) -> Iterator[IndexEntry]:
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    per_name = SIGNATURES_PER_NAME * len(ENVS)
    for i in range(n):
        name_i, rest = divmod(i, per_name)
        sig_i, env_i = divmod(rest, len(ENVS))
        name = f"service{name_i % 50:02d}.fn{name_i:06d}"
        signature = f"(f32[{2 ** sig_i},784], f32[784,512], f32[512])"
        program_fp = hashlib.sha256(f"{name}/{signature}".encode()).hexdigest()
        env_fp = hashlib.sha256(ENVS[env_i].encode()).hexdigest()
        manifest = json.dumps(
            {
                "format_version": 1,
                "name": name,
                "signature": signature,
                "in_avals": [{"shape": [2**sig_i, 784], "dtype": "float32", "sharding": None}] * 3,
                "out_avals": [{"shape": [2**sig_i, 10], "dtype": "float32"}],
                "in_tree": {"kind": "tuple", "children": [{"kind": "leaf"}] * 3},
                "devices": [0],
                "environment": {"jaxlib": "0.10.2", "platform": ENVS[env_i]},
                "padding": "x" * 600,
            }
        )
        created = t0 + timedelta(seconds=i)
        yield IndexEntry(
            key=hashlib.sha256(f"{program_fp}/{env_fp}".encode()).hexdigest(),
            name=name,
            program_fp=program_fp,
            env_fp=env_fp,
            signature=signature,
            platform=ENVS[env_i].split("-")[1],
            manifest=manifest,
            exe_digest=hashlib.sha256(f"exe{i}".encode()).hexdigest(),
            hlo_digest=hashlib.sha256(f"hlo{program_fp}".encode()).hexdigest(),
            raw_size=200_000,
            stored_size=60_000,
            compile_seconds=1.5,
            created_at=created,
            last_used_at=created,
        )


@contextmanager
def database(url: str | None, workdir: Path) -> Iterator[str]:
    if url is None:
        yield f"sqlite:///{workdir / 'index.sqlite'}"
        return
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise SystemExit("--url must be a PostgreSQL URL (SQLite runs by default under /tmp)")
    name = f"aot_bench_{secrets.token_hex(4)}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield parsed.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def bench_index(url: str, n: int, lookups: int) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    idx = Index(url)
    entries = list(synthetic_entries(n))
    t = time.perf_counter()
    batch = 10_000
    for i in range(0, n, batch):
        idx.bulk_insert(entries[i : i + batch])
    fill = time.perf_counter() - t
    rows.append((f"fill {n:,} rows (bulk insert)", f"{fill:9.2f} s  ({n / fill:,.0f} rows/s)"))
    assert idx.count() == n
    if idx.dialect == "postgresql":
        # A steady-state index: the autovacuum/analyze that a bulk load of 100,000 rows
        # triggers would otherwise run during the timings.
        with idx.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")

    rng = random.Random(0)
    keys = [e.key for e in rng.sample(entries, min(lookups, n))]
    by_name_args = [(e.name, e.env_fp) for e in rng.sample(entries, min(lookups, n))]
    # The 100,000 rows built to fill the database are not the index's: left alive, every
    # full garbage collection during the timings would walk them.
    del entries
    gc.collect()

    it = iter(keys)
    lat = timed(lambda: idx.get(next(it)), len(keys))
    rows.append(("get(key)            p50 / p99", f"{fmt_ms(pct(lat, 50))} / {fmt_ms(pct(lat, 99))}"))
    it2 = iter(by_name_args)
    found: list[int] = []
    lat = timed(lambda: found.append(len(idx.by_name(*next(it2)))), len(by_name_args))
    rows.append(
        (
            f"by_name(name, env)  p50 / p99 ({statistics.mean(found):.0f} rows)",
            f"{fmt_ms(pct(lat, 50))} / {fmt_ms(pct(lat, 99))}",
        )
    )
    it3 = iter(keys[:500])
    lat = timed(lambda: idx.touch(next(it3)), min(500, len(keys)))
    rows.append(("touch(key)          p50 / p99", f"{fmt_ms(pct(lat, 50))} / {fmt_ms(pct(lat, 99))}"))
    lat = timed(lambda: idx.entries(), 3)
    rows.append((f"entries() all {n:,} rows (best of 3)", fmt_ms(min(lat))))
    got: list[int] = []
    lat = timed(lambda: got.append(len(idx.entries("service07.*"))), 3)
    rows.append((f"entries('service07.*') -> {got[0]:,} rows", fmt_ms(min(lat))))
    idx.close()
    return rows


# ------------------------------------------------------------------------- blobs


def real_executables() -> dict[str, bytes]:
    """Serialized XLA executables and jax.export bytes of a few real models."""
    import jax
    import jax.numpy as jnp

    f32 = jnp.float32

    def mlp(params: list[tuple[jax.Array, jax.Array]], x: jax.Array) -> jax.Array:
        for w, b in params:
            x = jax.nn.relu(x @ w + b)
        return x

    def layer(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        mu = x.mean(-1, keepdims=True)
        h = (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
        b, t, d = x.shape
        q, k, v = (jnp.reshape(h @ p[w], (b, t, 4, d // 4)) for w in ("wq", "wk", "wv"))
        a = jax.nn.softmax(jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(d / 4), -1)
        x = x + jnp.einsum("bhts,bshd->bthd", a, v).reshape(b, t, d) @ p["wo"]
        return x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]

    def stack(ps: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
        for p in ps:
            x = layer(p, x)
        return x

    def layer_params(d: int) -> dict[str, jax.ShapeDtypeStruct]:
        s = jax.ShapeDtypeStruct
        return {
            "wq": s((d, d), f32), "wk": s((d, d), f32), "wv": s((d, d), f32),
            "wo": s((d, d), f32), "w1": s((d, 4 * d), f32), "w2": s((4 * d, d), f32),
        }  # fmt: skip

    def exe(fn: Callable[..., object], *specs: object) -> bytes:
        compiled = jax.jit(fn).lower(*specs).compile()
        x = compiled._executable.xla_executable
        return bytes(x.client.serialize_executable(x))

    def export(fn: Callable[..., object], *specs: object) -> bytes:
        return bytes(jax.export.export(jax.jit(fn))(*specs).serialize())

    dims = [784, 512, 256, 10]
    mlp_specs = [
        (jax.ShapeDtypeStruct((a, b), f32), jax.ShapeDtypeStruct((b,), f32))
        for a, b in zip(dims, dims[1:])
    ]
    out: dict[str, bytes] = {}
    for batch in (1, 32):
        out[f"exe mlp 784-512-256-10 b{batch}"] = exe(mlp, mlp_specs, jax.ShapeDtypeStruct((batch, 784), f32))
    for depth in (1, 4, 8, 32):
        specs = ([layer_params(256)] * depth, jax.ShapeDtypeStruct((8, 128, 256), f32))
        out[f"exe transformer x{depth} d256"] = exe(stack, *specs)
    out["export mlp"] = export(mlp, mlp_specs, jax.ShapeDtypeStruct((32, 784), f32))
    out["export transformer x4"] = export(stack, [layer_params(256)] * 4, jax.ShapeDtypeStruct((8, 128, 256), f32))
    return out


def raw_write(root: Path, data: bytes) -> None:
    """The folder store's write protocol without compression (the baseline)."""
    d = digest_of(data)
    folder = root / d[:2]
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{d}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, folder / d)
    dfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def raw_read(root: Path, digest: str) -> bytes:
    data = (root / digest[:2] / digest).read_bytes()
    assert digest_of(data) == digest
    return data


def bench_blobs(samples: dict[str, bytes], workdir: Path, rounds: int) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    exes = [v for k, v in samples.items() if k.startswith("exe")]
    total = sum(len(b) for b in exes)

    for name, data in samples.items():
        rows.append(
            (
                f"ratio {name} ({len(data) / 1024:.0f} KiB)",
                f"{len(data) / len(compress(data, DEFAULT_LEVEL)):5.2f}x at level {DEFAULT_LEVEL}"
                f"   ({len(data) / len(compress(data, 19)):5.2f}x at 19)",
            )
        )
    ratio = total / sum(len(compress(b, DEFAULT_LEVEL)) for b in exes)
    rows.append((f"ratio all executables ({total / 1024:.0f} KiB)", f"{ratio:5.2f}x at level {DEFAULT_LEVEL}"))

    def best(fn: Callable[[int], None]) -> float:
        times = []
        for r in range(rounds):
            t = time.perf_counter()
            fn(r)
            times.append(time.perf_counter() - t)
        return min(times)

    def zstd_write(r: int) -> None:
        store = ContentStore(FolderObjectStore(workdir / f"zstd-{r}"))
        for b in exes:
            store.put(b)

    def plain_write(r: int) -> None:
        for b in exes:
            raw_write(workdir / f"raw-{r}", b)

    digests = [digest_of(b) for b in exes]
    mb = total / 1e6
    w_z = best(zstd_write)
    w_r = best(plain_write)
    store = ContentStore(FolderObjectStore(workdir / "zstd-0"))
    r_z = best(lambda r: [store.get(d) for d in digests] and None)
    r_r = best(lambda r: [raw_read(workdir / "raw-0", d) for d in digests] and None)
    rows.append(
        (f"write {len(exes)} exes, fsync each: zstd-{DEFAULT_LEVEL} / raw", f"{mb / w_z:7.1f} / {mb / w_r:7.1f} MB/s")
    )
    rows.append((f"read + verify sha256: zstd-{DEFAULT_LEVEL} / raw", f"{mb / r_z:7.1f} / {mb / r_r:7.1f} MB/s"))

    # Larger-blob regime (fsync amortised): the biggest real executable.
    big = max(exes, key=len)
    bmb = len(big) / 1e6
    w_z = best(lambda r: ContentStore(FolderObjectStore(workdir / f"big-zstd-{r}")).put(big) and None)
    w_r = best(lambda r: raw_write(workdir / f"big-raw-{r}", big))
    bd = digest_of(big)
    bstore = ContentStore(FolderObjectStore(workdir / "big-zstd-0"))
    r_z = best(lambda r: bstore.get(bd) and None)
    r_r = best(lambda r: raw_read(workdir / "big-raw-0", bd) and None)
    rows.append((f"write the {bmb:.2f} MB exe: zstd-{DEFAULT_LEVEL} / raw", f"{bmb / w_z:7.1f} / {bmb / w_r:7.1f} MB/s"))
    rows.append((f"read the {bmb:.2f} MB exe: zstd-{DEFAULT_LEVEL} / raw", f"{bmb / r_z:7.1f} / {bmb / r_r:7.1f} MB/s"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="artifact rows (default 100000)")
    parser.add_argument("--url", default=None, help="PostgreSQL URL (default: SQLite under /tmp)")
    parser.add_argument("--lookups", type=int, default=2000, help="lookups per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="blob benchmark rounds (best of)")
    parser.add_argument("--no-jax", action="store_true", help="skip the blob benchmark (no compiles)")
    parser.add_argument("--no-index", action="store_true", help="skip the index benchmark")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="aot-bench-", dir="/tmp"))
    table: list[tuple[str, str]] = []
    try:
        if not args.no_index:
            with database(args.url, workdir) as url:
                engine = make_url(url).get_backend_name()
                version = sa.__version__
                table.append(("index backend", f"{engine} ({mask_url(url)}), SQLAlchemy {version}"))
                table += bench_index(url, args.n, args.lookups)
        if not args.no_jax:
            import jax

            samples = real_executables()
            table.append(("blobs", f"jax {jax.__version__}, backend {jax.default_backend()}"))
            table += bench_blobs(samples, workdir, args.rounds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    width = max(len(k) for k, _ in table)
    print(f"# jax-aot storage benchmark on: {machine()}")
    for key, value in table:
        print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
