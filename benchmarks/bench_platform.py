"""The accelerator section of the benchmarks: ``python -m benchmarks --platform tpu``.

Four scenarios on the fixtures' transformer train step at two buckets (batch 8 and 16,
``AOT_BENCH_BATCHES``), each measurement a fresh worker process run strictly one after
another (one process at a time may hold a TPU chip; each pays ~7-10 s to open it):

  platform_start     fresh process to the first result (batch 8) and to both results:
                     jax.jit cold, JAX's persistent cache warm, deserialize_and_load,
                     aot.load (default), lazy=True, background=True; ratios to d&l
  platform_call      per call (call + block_until_ready): aot.load dispatcher vs JAX's
                     Compiled (deserialize_and_load of the same executable)
  platform_compile   both buckets compiled cold: Cache.compile vs jax.jit(...).lower().compile(),
                     wall and CPU seconds
  platform_jax_cache aot.jax_cache (JAX's persistent-cache interface, a folder cache):
                     the second process (warm) next to the first (cold), to both results

``--platform cpu`` runs the same on this machine (8 virtual CPU devices), for testing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from benchmarks import run as driver
from benchmarks.run import Context, Proc, Scenario, populate, same_output, worker

BATCHES = "8,16"
JAX_CACHE_WORKER = driver.REPO / "benchmarks" / "jax_cache_worker.py"


def _runs(ctx: Context) -> int:
    return ctx.runs if ctx.runs is not None else 2


def start_up(ctx: Context) -> Scenario:
    s = Scenario(
        "platform_start",
        f"train step, buckets {BATCHES}: fresh process to the first result ({driver.PLATFORM})",
        {"import_s": "import jax", "ready_s": "load returned", "first_s": "first result",
         "all_s": "both results", "wall_s": "first result, wall"},
        ["first_s", "all_s", "wall_s"],
    )
    folder = ctx.folder("platform_start")
    if not populate(s, "transformer.populate", folder):
        return s
    variants = [("jit_cold", "jax.jit cold", "jax"),
                ("pcache", "jax.jit + persistent cache", "jax"),
                ("deserialize", "deserialize_and_load", "jax"),
                ("aot_default", "aot.load (default)", "aot"),
                ("aot_lazy", "aot.load lazy=True", "aot"),
                ("aot_bg", "aot.load background=True", "aot")]
    for _ in range(_runs(ctx)):
        for variant, label, side in variants:  # interleaved, one process at a time
            proc = worker("transformer.first", folder, variant)
            s.record(s.row(label, side), proc, lambda p: {
                "import_s": p.result["import_s"], "ready_s": p.result["ready_s"],
                "first_s": p.result["first_s"], "all_s": p.result["all_s"],
                "wall_s": p.wall_to_result_s, "loss": p.result["loss"]})
    s.pairs = [(label, "deserialize_and_load") for _, label, side in variants if side == "aot"]
    same_output(s, "loss")
    s.notes.append("'first result' and 'both results' run from after `import jax` (JAX "
                   "ways ready both buckets before the first step; lazy loads a bucket at "
                   "its first call; background returns at once); 'wall' from process spawn")
    return s


def per_call(ctx: Context) -> Scenario:
    s = Scenario("platform_call", "train step (batch 8), per call + block_until_ready",
                 {"us": "per call"}, ["us"], unit="us")
    folder = ctx.folder("platform_start")  # the executables platform_start stored
    if not (folder / "transformer.npz").exists() and not populate(s, "transformer.populate", folder):
        return s
    proc = worker("transformer.dispatch", folder, quick=ctx.quick)
    if proc.result is None or not proc.ok:
        s.skipped = f"worker failed: {proc.error()}"
        return s
    s.row("jax Compiled (deserialize_and_load)", "jax").add({"us": proc.result["compiled_us"]})
    s.row("aot.load dispatcher", "aot").add({"us": proc.result["aot_load_us"]})
    s.notes.append(f"one process: median of {proc.result['repeats']} interleaved loops of "
                   f"{proc.result['number']} calls per way")
    return s


def compile_time(ctx: Context) -> Scenario:
    s = Scenario("platform_compile", f"compile both buckets ({BATCHES}), nothing cached, "
                 "fresh process", {"compile_s": "wall", "compile_cpu_s": "CPU"},
                 ["compile_s", "compile_cpu_s"])
    folder = ctx.folder("platform_compile")
    for run in range(_runs(ctx)):
        for variant, label, side in (("jax", "jax.jit(...).lower().compile()", "jax"),
                                     (f"aot:{run}", "Cache.compile", "aot")):
            proc = worker("transformer.compile", folder, variant)
            s.record(s.row(label, side), proc, lambda p: {
                "compile_s": p.result["compile_s"], "compile_cpu_s": p.result["compile_cpu_s"]})
    s.notes.append("CPU = process time of all threads during the compiles (XLA's included)")
    return s


def jax_cache(ctx: Context) -> Scenario:
    s = Scenario("platform_jax_cache", "aot.jax_cache (folder cache): train step at "
                 f"{BATCHES}, start of main to both results", {"first_step": "both results",
                 "cpu_main": "CPU after imports"}, ["first_step"])
    folder = ctx.folder("platform_jax_cache")
    for run in range(_runs(ctx)):
        env = {"AOT_JAX_CACHE": str(folder / f"cache-{run}"),
               "AOT_BENCH_JAX_CACHE_MODEL": "transformer"}
        for label, side in (("first process (cold)", "jax"), ("second process (warm)", "aot")):
            proc = _jax_cache_run(env)
            s.record(s.row(label, side), proc, lambda p: {
                "first_step": p.result["first_step"], "cpu_main": p.result["cpu_main"],
                "hits": p.result["hits"], "writes": p.result["writes"]})
    warm = s.row("second process (warm)", "aot")
    if warm.samples.get("hits"):
        s.notes.append(f"warm process: {warm.median('hits'):.0f} cache hits, "
                       f"{warm.median('writes'):.0f} misses (median)")
    s.notes.append("ratio: the warm second process / the cold first one")
    return s


def _jax_cache_run(extra: dict[str, str]) -> Proc:
    env = driver.worker_env()
    env.update(extra)
    start = time.perf_counter()
    out = subprocess.run([sys.executable, *driver.python_flags(), str(JAX_CACHE_WORKER)],
                         cwd=driver.REPO, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    line = next((x for x in out.stdout.splitlines() if x.startswith("JAXCACHE_JSON ")), None)
    result: dict[str, Any] | None = json.loads(line[len("JAXCACHE_JSON "):]) if line else None
    return Proc(result, None, wall, out.returncode, out.stderr)


SCENARIOS = {
    "platform_start": start_up,
    "platform_call": per_call,
    "platform_compile": compile_time,
    "platform_jax_cache": jax_cache,
}


def configure(platform: str) -> None:
    """Every worker of this run uses ``platform`` and the two buckets."""
    driver.PLATFORM = platform
    os.environ["AOT_BENCH_BATCHES"] = BATCHES
