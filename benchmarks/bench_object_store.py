"""Object-store clients side by side on an S3-compatible server: fsspec+s3fs vs obstore.

    python benchmarks/bench_object_store.py [--endpoint URL] [--small 200] [--large 3]
                                            [--runs 3] [--json out.json]

What it measures, per client, on the same server and bucket (median of ``--runs``):

* write / read of ``--small`` blobs of 16 KiB and ``--large`` blobs of 5 MiB, one
  call after the other (as a cache reads blobs on a load) and concurrently (as a
  push or a pull does);
* ``exists``/``stat`` of all small blobs (concurrent HEADs) and one full listing;
* import time of each client in a fresh process (median of 5), up to a client
  object ready to use;
* dependency weight: the installed distributions each client pulls in, and their
  size on disk.

``fsspec`` is measured through :class:`aot.cache.storage.fsspec_store.FsspecObjectStore`
(the store the cache uses) plus s3fs's own batched ``pipe``/``cat``; ``obstore``
through its ``put``/``get``/``head``/``list`` and their async forms under asyncio.

Without ``--endpoint`` (or ``AOT_TEST_S3_ENDPOINT``) a moto server is started in a
subprocess on a free loopback port and stopped at the end. moto is a Python server
on the same cores: absolute numbers are a floor set by moto, the ratios are what
matter. Credentials are fake (moto accepts any).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from importlib import metadata
from typing import Any

SMALL = 16 * 1024
LARGE = 5 * 1024 * 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            with urllib.request.urlopen(endpoint + "/moto-api/data.json", timeout=1):
                return proc, endpoint
        except OSError:
            time.sleep(0.25)
    proc.kill()
    raise SystemExit("moto did not start")


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _blobs(n: int, size: int, seed: str) -> dict[str, bytes]:
    out = {}
    for i in range(n):
        data = hashlib.sha256(f"{seed}{i}".encode()).digest() * (size // 32)
        out[hashlib.sha256(data + seed.encode()).hexdigest()] = data
    return out


# ---------------------------------------------------------------- fsspec


def bench_fsspec(bucket: str, small: dict[str, bytes], large: dict[str, bytes]) -> dict[str, float]:
    from aot.cache.storage.fsspec_store import FsspecObjectStore

    prefix = f"fsspec-{secrets.token_hex(4)}"
    store = FsspecObjectStore(f"s3://{bucket}/{prefix}")
    fs = store._fs
    r: dict[str, float] = {}
    r["write_small_seq"] = _timed(lambda: [store.write(d, b) for d, b in small.items()])
    r["read_small_seq"] = _timed(lambda: [store.read(d) for d in small])
    r["exists_small_batch"] = _timed(lambda: store.exists(small))
    r["stat_small_batch"] = _timed(lambda: store.stat(small))
    r["list_all"] = _timed(lambda: list(store.list()))
    r["write_large_seq"] = _timed(lambda: [store.write(d, b) for d, b in large.items()])
    r["read_large_seq"] = _timed(lambda: [store.read(d) for d in large])
    paths = {f"{bucket}/{prefix}-b/{d[:2]}/{d}.zst": b for d, b in small.items()}
    r["write_small_concurrent"] = _timed(lambda: fs.pipe(paths))
    r["read_small_concurrent"] = _timed(lambda: fs.cat(list(paths)))
    return r


# ---------------------------------------------------------------- obstore


def bench_obstore(bucket: str, endpoint: str, small: dict[str, bytes], large: dict[str, bytes]) -> dict[str, float]:
    import obstore
    from obstore.store import S3Store

    prefix = f"obstore-{secrets.token_hex(4)}"
    store = S3Store(
        bucket, endpoint=endpoint, region="us-east-1", access_key_id="testing",
        secret_access_key="testing", client_options={"allow_http": True},
    )

    def key(d: str, sub: str = "") -> str:
        return f"{prefix}{sub}/{d[:2]}/{d}.zst"

    async def gather(coros: list[Any], limit: int = 32) -> list[Any]:
        sem = asyncio.Semaphore(limit)

        async def one(c: Any) -> Any:
            async with sem:
                return await c
        return await asyncio.gather(*(one(c) for c in coros))

    async def heads() -> list[Any]:
        return await gather([obstore.head_async(store, key(d)) for d in small])

    async def put_many() -> None:
        await gather([obstore.put_async(store, key(d, "-b"), b) for d, b in small.items()])

    async def get_many() -> list[bytes]:
        async def one(d: str) -> bytes:
            return bytes(await (await obstore.get_async(store, key(d, "-b"))).bytes_async())
        return await gather([one(d) for d in small])

    r: dict[str, float] = {}
    r["write_small_seq"] = _timed(lambda: [obstore.put(store, key(d), b) for d, b in small.items()])
    r["read_small_seq"] = _timed(lambda: [bytes(obstore.get(store, key(d)).bytes()) for d in small])
    r["exists_small_batch"] = _timed(lambda: asyncio.run(heads()))
    r["stat_small_batch"] = r["exists_small_batch"]  # one HEAD gives both
    r["list_all"] = _timed(lambda: [x for batch in obstore.list(store, prefix=prefix) for x in batch])
    r["write_large_seq"] = _timed(lambda: [obstore.put(store, key(d), b) for d, b in large.items()])
    r["read_large_seq"] = _timed(lambda: [bytes(obstore.get(store, key(d)).bytes()) for d in large])
    r["write_small_concurrent"] = _timed(lambda: asyncio.run(put_many()))
    r["read_small_concurrent"] = _timed(lambda: asyncio.run(get_many()))
    return r


# ---------------------------------------------------------------- import time, weight

_IMPORTS = {
    "fsspec": "from aot.cache.storage.fsspec_store import FsspecObjectStore; "
              "FsspecObjectStore('s3://b/p')._fs.s3 if False else FsspecObjectStore('s3://b/p')",
    "obstore": "from obstore.store import S3Store; S3Store('b', region='us-east-1')",
}
_ROOTS = {"fsspec": ["fsspec", "s3fs"], "obstore": ["obstore"]}


def import_seconds(client: str, runs: int = 5) -> float:
    code = f"import time; t = time.perf_counter(); {_IMPORTS[client]}; print(time.perf_counter() - t)"
    samples = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        samples.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(samples)


def _requirement_name(spec: str) -> str | None:
    if ";" in spec and "extra ==" in spec.split(";", 1)[1]:
        return None
    name = spec.split(";")[0].strip()
    for stop in "<>=!~[ (":
        name = name.split(stop)[0]
    return name.strip().lower().replace("_", "-") or None


def dependency_weight(client: str) -> dict[str, Any]:
    seen: dict[str, int] = {}
    todo = list(_ROOTS[client])
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        size = 0
        for f in dist.files or []:
            try:
                size += os.path.getsize(f.locate())
            except OSError:
                pass
        seen[name] = size
        todo.extend(n for n in map(_requirement_name, dist.requires or []) if n)
    return {"distributions": sorted(seen), "count": len(seen), "mib": round(sum(seen.values()) / 2**20, 1)}


# ---------------------------------------------------------------- driver


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", default=os.environ.get("AOT_TEST_S3_ENDPOINT"))
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()

    proc = None
    endpoint = args.endpoint
    if not endpoint:
        proc, endpoint = _start_moto()
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
    )
    try:
        import boto3

        client = boto3.client("s3", endpoint_url=endpoint)
        bucket = f"aot-bench-{secrets.token_hex(4)}"
        client.create_bucket(Bucket=bucket)
        clients = ["fsspec"]
        try:
            import obstore  # noqa: F401

            clients.append("obstore")
        except ImportError:
            print("obstore is not installed: measuring fsspec only", file=sys.stderr)
        samples: dict[str, list[dict[str, float]]] = {c: [] for c in clients}
        for run in range(args.runs):
            small = _blobs(args.small, SMALL, f"s{run}")
            large = _blobs(args.large, LARGE, f"l{run}")
            for c in clients:  # interleaved, so drift hits both alike
                if c == "fsspec":
                    samples[c].append(bench_fsspec(bucket, small, large))
                else:
                    samples[c].append(bench_obstore(bucket, endpoint, small, large))
        result: dict[str, Any] = {
            "endpoint": endpoint, "small": [args.small, SMALL], "large": [args.large, LARGE],
            "runs": args.runs, "machine": {
                "python": platform.python_version(), "cores": os.cpu_count(),
                "load": os.getloadavg(),
            },
            "clients": {},
        }
        for c in clients:
            medians = {k: statistics.median(s[k] for s in samples[c]) for k in samples[c][0]}
            result["clients"][c] = {
                "seconds": {k: round(v, 4) for k, v in medians.items()},
                "import_seconds": round(import_seconds(c), 3),
                "dependencies": dependency_weight(c),
                "version": metadata.version("s3fs" if c == "fsspec" else "obstore"),
            }
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)

    names = list(result["clients"])
    print(f"{args.small} x 16 KiB, {args.large} x 5 MiB on {endpoint}; median of {args.runs} runs (seconds)")
    print(f"{'operation':<24}" + "".join(f"{n:>12}" for n in names))
    for op in result["clients"][names[0]]["seconds"]:
        print(f"{op:<24}" + "".join(f"{result['clients'][n]['seconds'][op]:>12.3f}" for n in names))
    print(f"{'import (fresh process)':<24}" + "".join(f"{result['clients'][n]['import_seconds']:>12.3f}" for n in names))
    for n in names:
        dep = result["clients"][n]["dependencies"]
        print(f"{n}: {dep['count']} distributions, {dep['mib']} MiB installed: {', '.join(dep['distributions'])}")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
