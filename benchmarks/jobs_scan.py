"""``aot warmup benchmarks/heavy.toml`` into fresh caches at several ``--jobs``, on CPU.

    python3 -m benchmarks.jobs_scan [--jobs 1,2,4,8,auto] [--runs 1] [--out FILE]

Each run is a fresh ``python -P -m aot`` process with ``JAX_PLATFORMS=cpu`` (so that
it never opens an accelerator) and a new cache folder; plain JAX compiling the same
programs in one process (``benchmarks.worker warmup.jax cold:heavy``) is the yardstick.
Prints wall and CPU seconds (user + system of the process and its worker processes,
from ``getrusage(RUSAGE_CHILDREN)``) and the ``--jobs`` that ``auto`` chose. On the
13-core TPU host: about 1.5 minutes for one run of each.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks import run as driver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.jobs_scan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="1,2,4,8,auto")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    driver.PLATFORM = "cpu"
    root = Path(tempfile.mkdtemp(prefix="aot-jobs-scan-"))
    driver.PYCACHE = root / "pycache"
    lines = [f"machine: {driver.describe(driver.machine())}",
             f"aot warmup {driver.HEAVY_MANIFEST.relative_to(driver.REPO)}, JAX_PLATFORMS=cpu, fresh cache each",
             f"{'way':<28} {'wall s':>8} {'CPU s':>8}  note"]
    print("\n".join(lines), flush=True)
    aot = [sys.executable, *driver.python_flags(), "-m", "aot"]
    try:
        driver.worker("warmup.jax", root / "jax", "cold:heavy")  # untimed: fills the bytecode cache
        for run in range(args.runs):
            rows = [("plain JAX, 1 process", driver.worker("warmup.jax", root / "jax", "cold:heavy"), "")]
            for jobs in [j.strip() for j in args.jobs.split(",") if j.strip()]:
                cache = root / f"cache-{jobs}-{run}"
                proc = driver.spawn([*aot, "--cache", str(cache), "warmup",
                                     str(driver.HEAVY_MANIFEST), "--jobs", jobs, "--json"])
                note = ""
                if proc.ok:
                    report = json.loads(proc.stdout)
                    note = f"{report['jobs']} job(s), {report['compiled']} compiled, {report['failed']} failed"
                rows.append((f"aot warmup --jobs {jobs}", proc, note))
                shutil.rmtree(cache, ignore_errors=True)
            for label, proc, note in rows:
                if not proc.ok:
                    note = proc.error().replace("\n", " / ")[:200]
                line = f"{label:<28} {proc.wall_s:8.1f} {proc.cpu_s or 0:8.1f}  {note}"
                lines.append(line)
                print(line, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
