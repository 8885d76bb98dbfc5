"""Serving memory (issue 25 goal 6), run by ``bench_scale memory``: the peak resident set
of a fresh process that loads the transformer fixture's checkpoint and reaches its first
loss through ``aot.load``, next to ``jax.jit`` cold and ``deserialize_and_load``
(``benchmarks.worker transformer.first``; the variants interleaved run by run)."""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path

from benchmarks import run

VARIANTS = ("jit_cold", "deserialize", "aot")


def bench_memory(runs: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="aot_bench_memory_"))
    try:
        run.PYCACHE = root / "pycache"
        folder = root / "transformer"
        folder.mkdir()
        proc = run.worker("transformer.populate", folder)
        if not proc.ok:
            raise SystemExit(f"populate failed: {proc.error()}")
        peaks: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(runs):
            for variant in VARIANTS:
                proc = run.worker("transformer.first", folder, variant)
                if not proc.ok or proc.result is None:
                    raise SystemExit(f"{variant} failed: {proc.error()}")
                peaks[variant].append(float(proc.result["peak_rss_mb"]))
        results: dict[str, float] = {}
        for variant in VARIANTS:
            results[f"peak RSS MB {variant}"] = statistics.median(peaks[variant])
            print(f"  peak RSS, {variant:12s}: {statistics.median(peaks[variant]):7.1f} MB "
                  f"(runs: {', '.join(f'{x:.1f}' for x in peaks[variant])})")
        ratio = results["peak RSS MB aot"] / results["peak RSS MB deserialize"]
        results["aot / deserialize_and_load"] = ratio
        print(f"  aot / deserialize_and_load: {ratio:.3f}x (goal <= 1.10x: {'met' if ratio <= 1.10 else 'NOT MET'}); "
              f"aot / jax.jit cold: {results['peak RSS MB aot'] / results['peak RSS MB jit_cold']:.3f}x")
        return results
    finally:
        shutil.rmtree(root, ignore_errors=True)
