"""One name with N signatures (issue 25 goal 3), run by ``bench_scale signatures``.

A folder cache holds name ``bench.many`` compiled for real at N signatures (``x * 3 - 1``
at f32[1] .. f32[N]: N tiny programs, N executables) and name ``bench.one`` at f32[1]
only. Each measurement is a fresh process (``python -m benchmarks.bench_scale_signatures
MODE DIR NAME``) that imports JAX and aot, then times ``aot.load(NAME)`` until ready:
``eager`` (the default: every signature loaded), ``lazy`` (returns; the first call
loads its signature), ``background`` (returns, then ``wait()`` until all are loaded);
``dispatch`` times per call (call + ``block_until_ready``) of the f32[1] signature on
eagerly loaded dispatchers of both names in one process, loops interleaved. The RSS growth of an eager load, divided by N, is the
memory per loaded signature.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MARKER = "BENCH_JSON "


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def build(folder: Path, n: int) -> float:
    import aot

    cache = aot.Cache(str(folder))

    def scaled(x):  # noqa: ANN001, ANN202
        return x * 3.0 - 1.0

    start = time.perf_counter()
    for size in range(1, n + 1):
        cache.compile(scaled, aot.spec(f"f32[{size}]"), name="bench.many")
    cache.compile(scaled, aot.spec("f32[1]"), name="bench.one")
    cache.close()
    return time.perf_counter() - start


def measure(mode: str, folder: Path, name: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    jax.devices()
    import aot

    before = rss_mb()
    x = jax.device_put(jnp.arange(1, dtype=jnp.float32))
    start = time.perf_counter()
    if mode == "lazy":
        fn = aot.load(name, cache=str(folder), lazy=True)
        returned = time.perf_counter() - start
        fn(x).block_until_ready()
        return {"returned_s": returned, "first_call_s": time.perf_counter() - start}
    if mode == "background":
        fn = aot.load(name, cache=str(folder), background=True)
        returned = time.perf_counter() - start
        fn.wait()
        return {"returned_s": returned, "all_loaded_s": time.perf_counter() - start}
    fn = aot.load(name, cache=str(folder))
    ready = time.perf_counter() - start
    out: dict[str, Any] = {"ready_s": ready, "rss_growth_mb": rss_mb() - before}
    if mode == "dispatch":
        # Both names in this process, their loops interleaved (drift hits them alike);
        # the figure is NAME's, measured next to the other's.
        other_name = "bench.many" if name == "bench.one" else "bench.one"
        other = aot.load(other_name, cache=str(folder))
        expected = x * 3.0 - 1.0
        fns = {name: fn, other_name: other}
        loops: dict[str, list[float]] = {k: [] for k in fns}
        for f in fns.values():
            assert bool((f(x) == expected).all())
            for _ in range(200):
                f(x).block_until_ready()
        for _ in range(9):
            for key, f in fns.items():
                t = time.perf_counter()
                for _ in range(1000):
                    f(x).block_until_ready()
                loops[key].append((time.perf_counter() - t) / 1000)
        out["per_call_us"] = statistics.median(loops[name]) * 1e6
    return out


def spawn(mode: str, folder: Path, name: str) -> dict[str, Any]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("AOT_CACHE", None)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_scale_signatures", mode, str(folder), name],
                          env=env, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    raise SystemExit(f"{mode} {name} failed: {proc.stderr[-2000:]}")


def bench_signatures(n: int, runs: int, folder: Path) -> dict[str, float]:
    if not (folder / "index.sqlite").exists():
        print(f"  built {n} + 1 entries in {build(folder, n):.1f} s")
    samples: dict[str, list[float]] = {}
    for _ in range(runs):
        for mode in ("eager", "lazy", "background", "dispatch"):
            for name in ("bench.one", "bench.many"):
                for key, value in spawn(mode, folder, name).items():
                    samples.setdefault(f"{mode} {key} {name}", []).append(value)
    results: dict[str, float] = {}
    for key, values in samples.items():
        results[key] = statistics.median(values)
    for key in sorted(results):
        print(f"  {key:40s} {results[key]:10.4f}")
    for mode, key in (("eager", "ready_s"), ("lazy", "first_call_s"), ("background", "returned_s"),
                      ("background", "all_loaded_s"), ("dispatch", "per_call_us")):
        one, many = results[f"{mode} {key} bench.one"], results[f"{mode} {key} bench.many"]
        results[f"{mode} {key} {n} sig / 1 sig"] = many / one
        print(f"  {mode} {key}: {n} signatures / 1 = {many / one:.3f}x ({many:.4g} vs {one:.4g})")
    per_sig = (results["eager rss_growth_mb bench.many"] - results["eager rss_growth_mb bench.one"]) / (n - 1)
    results["MB per loaded signature"] = per_sig
    print(f"  memory per loaded signature: {per_sig * 1024:.1f} KiB (RSS growth of an eager load)")
    return results


if __name__ == "__main__":
    result = measure(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
    print(MARKER + json.dumps(result), flush=True)
