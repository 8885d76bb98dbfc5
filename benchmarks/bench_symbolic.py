"""Symbolic entries and padding, next to plain JAX (one machine, medians of a few runs).

``python -m benchmarks.bench_symbolic [--runs 3]`` from the repository root prints:

* first result in a fresh process for the MLP at a batch size nobody compiled:
  ``jax.jit`` cold (import the model, trace, compile) vs ``aot.load`` with only the
  symbolic entry stored (compile its portable HLO, store it) vs ``aot.load`` once that
  executable is stored (the next process);
* per call, a 5-row request served by the 8-row bucket with ``pad={"x": 0}`` vs an
  exact 8-row call (NumPy inputs, ``block_until_ready``).

Every process gets 8 virtual CPU devices and no AOT_CACHE from the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_COMMON = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import jax
jax.devices()
t_import = time.perf_counter() - t0
sizes = (784, 512, 512, 10)
params = [{"b": np.zeros(o, np.float32), "w": np.full((i, o), 0.01, np.float32)} for i, o in zip(sizes[:-1], sizes[1:])]
x = np.ones((5, 784), np.float32)
"""

_JIT = _COMMON + """
t1 = time.perf_counter()
from fixtures.models import mlp_forward
out = jax.jit(mlp_forward)(params, x).block_until_ready()
print("BENCH", json.dumps({"import": t_import, "first_result": time.perf_counter() - t1}))
"""

_AOT = _COMMON + """
t1 = time.perf_counter()
import aot
out = aot.load("mlp.any", cache=sys.argv[1])(params, x).block_until_ready()
print("BENCH", json.dumps({"import": t_import, "first_result": time.perf_counter() - t1}))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AOT_", "JAX_COMPILATION"))}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _run(code: str, *args: str) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=_env(), cwd=REPO, capture_output=True,
        text=True, timeout=600, check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    raise RuntimeError(proc.stderr[-2000:])


def _populate(folder: Path) -> None:
    code = textwrap.dedent(
        f"""
        import aot
        from fixtures.models import mlp_forward, mlp_param_specs
        aot.Cache({str(folder)!r}).put(aot.lower(mlp_forward, mlp_param_specs(), "f32[b,784]", name="mlp.any"))
        """
    )
    subprocess.run([sys.executable, "-c", code], env=_env(), cwd=REPO, check=True, capture_output=True)


def first_results(runs: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"jax.jit cold": [], "aot.load, symbolic only": [], "aot.load, stored": []}
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "cache"
            _populate(folder)
            samples["jax.jit cold"].append(_run(_JIT)["first_result"])
            samples["aot.load, symbolic only"].append(_run(_AOT, str(folder))["first_result"])
            samples["aot.load, stored"].append(_run(_AOT, str(folder))["first_result"])
    return samples


def per_call(loops: int = 7, calls: int = 300) -> dict[str, float]:
    os.environ.update(_env())
    sys.path.insert(0, str(REPO))
    import jax
    import numpy as np

    import aot
    from fixtures.models import mlp_forward, mlp_param_specs

    with tempfile.TemporaryDirectory() as tmp:
        cache = aot.Cache(tmp)
        for b in (1, 8, 32):
            cache.compile(mlp_forward, mlp_param_specs(), f"f32[{b},784]", name="mlp")
        sizes = (784, 512, 512, 10)
        params = [
            {"b": np.zeros(o, np.float32), "w": np.full((i, o), 0.01, np.float32)}
            for i, o in zip(sizes[:-1], sizes[1:])
        ]
        params = jax.device_put(params)
        exact = aot.load("mlp", cache=cache)
        padded = aot.load("mlp", cache=cache, pad={"x": 0})
        x8, x5 = np.ones((8, 784), np.float32), np.ones((5, 784), np.float32)
        out: dict[str, list[float]] = {"exact 8 rows": [], "5 rows padded to 8": []}
        for fn, x, label in ((exact, x8, "exact 8 rows"), (padded, x5, "5 rows padded to 8")):
            fn(params, x).block_until_ready()
        for _ in range(loops):
            for fn, x, label in ((exact, x8, "exact 8 rows"), (padded, x5, "5 rows padded to 8")):
                start = time.perf_counter()
                for _ in range(calls):
                    fn(params, x).block_until_ready()
                out[label].append((time.perf_counter() - start) / calls)
        cache.close()
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    print("\nfirst result in a fresh process, MLP at batch 5 (s, median of runs; min-max)")
    for label, values in first_results(options.runs).items():
        print(f"  {label:28s} {statistics.median(values):6.3f}  ({min(values):.3f}-{max(values):.3f})")
    print("\nper call (µs, median loop)")
    for label, seconds in per_call().items():
        print(f"  {label:28s} {seconds * 1e6:8.1f}")
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
