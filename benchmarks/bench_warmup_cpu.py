"""Warm-up CPU seconds next to plain JAX, and A/B between checkouts (issue 25 goal 1).

    python -m benchmarks.bench_warmup_cpu [--heavy] [--runs 5] [--tree LABEL=PATH ...]

Each run, interleaved: plain JAX compiling the manifest's programs in one process
(cold), then for each tree ``aot warmup MANIFEST --jobs 1`` into a fresh cache, the
same warm-up again on that cache (every entry a hit), and JAX with its persistent
cache warm. A tree is a checkout with its own ``.venv`` (default: this one, labelled
``this``): ``--tree base=/tmp/base`` compares a commit's warm-up with this one's in
the same run, under the same load. Printed: the median wall and CPU seconds (user +
system of the process and its children) of each way, aot / JAX per run, and for each
aot way the median of those ratios with their spread (lowest-highest, and the
interquartile range from 4 runs on): whether a goal such as "<= 1.05x of plain JAX"
holds is read from the median, and the spread says how far one run can mislead.
Fixtures come from this repository; every process gets 8 virtual CPU devices.

Bytecode: every process, JAX's and aot's, reads its modules' bytecode from one
``PYTHONPYCACHEPREFIX`` folder that an untimed first run of each way fills, as an
installed package's (pip compiles a wheel's modules when it installs them). Without
it, a checkout installed in editable mode under ``PYTHONDONTWRITEBYTECODE=1`` compiles
each of aot's ~90 modules from source in every process (~0.15 s CPU), while JAX's come
compiled from site-packages. ``--no-pycache`` measures that way (the runs before
2026-12-05).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = {False: REPO / "fixtures" / "warmup.toml", True: REPO / "benchmarks" / "heavy.toml"}


def _env(root: Path, pycache: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "AOT_CACHE")}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(REPO)])
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _run(cmd: list[str], root: Path, pycache: Path | None = None) -> tuple[float, float]:
    """(wall, CPU) seconds of ``cmd`` and everything it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=_env(root, pycache), capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _aot(root: Path) -> str:
    """The ``aot`` command of the checkout ``root``: its ``.venv``'s; for this checkout
    without one, the command beside the Python running the benchmark."""
    command = root / ".venv" / "bin" / "aot"
    if root == REPO and not command.exists():
        command = Path(sys.executable).with_name("aot")
    return str(command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_warmup_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--heavy", action="store_true", help="benchmarks/heavy.toml instead of fixtures/warmup.toml")
    parser.add_argument("--runs", type=int, default=5, help="interleaved repetitions (default 5)")
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                        help="a checkout with its own .venv to time too (repeatable)")
    parser.add_argument("--no-pycache", action="store_true",
                        help="bytecode as the environment leaves it (no shared PYTHONPYCACHEPREFIX)")
    args = parser.parse_args(argv)
    trees = [("this", REPO)] + [(t.partition("=")[0], Path(t.partition("=")[2]).resolve()) for t in args.tree]
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    manifest = MANIFESTS[args.heavy]
    variant = "cold:heavy" if args.heavy else "cold"
    folder = Path(tempfile.mkdtemp(prefix="aot-bench-warmup-cpu-"))
    samples: dict[str, list[tuple[float, float]]] = {}
    python = sys.executable
    jax_cmd = [python, "-m", "benchmarks.worker", "warmup.jax", "--dir", str(folder / "jax")]
    pycache = None if args.no_pycache else folder / "pycache"
    load = [os.getloadavg()[0]]
    try:
        # Untimed: fills JAX's persistent cache, and the bytecode of each way's modules.
        _run([*jax_cmd, "--variant", variant.replace("cold", "pcache")], REPO, pycache)
        if pycache is not None:  # the small manifest imports the same modules
            _run([*jax_cmd, "--variant", "cold"], REPO, pycache)
            for label, root in trees:
                untimed = [_aot(root), "--cache", str(folder / f"{label}-untimed"),
                           "warmup", str(MANIFESTS[False]), "--jobs", "1"]
                _run(untimed, root, pycache)  # compiles
                _run(untimed, root, pycache)  # all cached
        for run in range(args.runs):
            ways = [("JAX cold", [*jax_cmd, "--variant", variant], REPO)]
            for label, root in trees:
                cli = _aot(root)
                cache = str(folder / f"{label}-{run}")
                ways.append((f"aot {label} --jobs 1", [cli, "--cache", cache, "warmup", str(manifest), "--jobs", "1"], root))
                ways.append((f"aot {label} all cached", [cli, "--cache", cache, "warmup", str(manifest), "--jobs", "1"], root))
            ways.append(("JAX pcache warm", [*jax_cmd, "--variant", variant.replace("cold", "pcache")], REPO))
            for name, cmd, root in ways:
                samples.setdefault(name, []).append(_run(cmd, root, pycache))
            load.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    bytecode = "bytecode as the environment leaves it" if pycache is None else "bytecode cached (PYTHONPYCACHEPREFIX)"
    print(f"{manifest.relative_to(REPO)}, {args.runs} runs, {bytecode}, load average {min(load):.2f}-{max(load):.2f}")
    print(f"{'way':30s} {'wall s':>8s} {'CPU s':>8s}   per run aot/JAX (CPU; wall)")
    for name, values in samples.items():
        wall = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        reference = samples["JAX pcache warm" if "cached" in name else "JAX cold"]
        ratios = ""
        if name.startswith("aot"):
            ratios = ", ".join(f"{v[1] / r[1]:.2f}; {v[0] / r[0]:.2f}" for v, r in zip(values, reference))
        print(f"{name:30s} {wall:8.2f} {cpu:8.2f}   {ratios}")
    for name, values in samples.items():
        if name.startswith("aot"):
            reference = samples["JAX pcache warm" if "cached" in name else "JAX cold"]
            what = "JAX pcache warm" if "cached" in name else "JAX cold"
            for unit, index in (("CPU", 1), ("wall", 0)):
                ratios_of = [v[index] / r[index] for v, r in zip(values, reference)]
                print(f"{name} / {what}, {unit}: {spread(ratios_of)}")
    return 0


def spread(ratios: list[float]) -> str:
    """``median 1.03x, spread 0.97-1.09x (IQR 1.00-1.05x), 5 runs``."""
    low, high = min(ratios), max(ratios)
    text = f"median {statistics.median(ratios):.2f}x, spread {low:.2f}-{high:.2f}x"
    if len(ratios) >= 4:
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        text += f" (IQR {q1:.2f}-{q3:.2f}x)"
    return f"{text}, {len(ratios)} runs"


if __name__ == "__main__":
    raise SystemExit(main())
