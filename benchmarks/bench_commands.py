"""Wall time and peak RSS of the commands that need no device, next to ``import jax``.

    python -m benchmarks.bench_commands [--runs 5] [--json OUT.json]

Fills a temporary folder cache with ``aot warmup fixtures/warmup.toml`` (5 entries;
the warm-up writes this host's environment record), then runs each command in a fresh
process ``--runs`` times, interleaved, and prints the median wall time (min-max), the
median peak RSS and whether the process imported JAX / SQLAlchemy. References: a
Python that does nothing, ``import jax``, ``import jax; jax.devices()``. ``aot ls (no
record)`` is the first listing after a boot or a change of versions or variables: it
imports JAX once and writes the record. Run it from the repository root (issue 25,
goal 2: <= 0.3 s and no JAX).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROBE = (
    "import atexit, sys\n"
    "atexit.register(lambda: sys.stderr.write('IMPORTED=' + ','.join("
    "m for m in ('jax', 'sqlalchemy') if m in sys.modules) + '\\n'))\n"
)
AOT = PROBE + "from aot.cli.main import main\nmain(sys.argv[1:])\n"


# Before each timed run of this gc, an untimed process takes a lease that has already
# expired, as a writer killed after leasing leaves one: dropping it is gc's only work.
EXPIRED_LEASE_GC = "aot gc (one expired lease)"
KILLED_WRITER = (
    "import sys, aot\n"
    "with aot.Cache(sys.argv[1]) as cache:\n"
    "    cache.index.lease(['0' * 64], seconds=0.0)\n"
)


def commands(cache: Path, other: Path, bundle: Path) -> list[tuple[str, list[str], bool]]:
    """(label, argv after the interpreter, needs an empty record folder)."""
    c = ["--cache", str(cache)]
    return [
        ("python -c pass", ["-c", "pass"], False),
        ("import jax", ["-c", PROBE + "import jax"], False),
        ("import jax; jax.devices()", ["-c", PROBE + "import jax; jax.devices()"], False),
        ("aot ls (no record)", ["-c", AOT, *c, "ls"], True),
        ("aot ls", ["-c", AOT, *c, "ls"], False),
        ("aot ls --env this", ["-c", AOT, *c, "ls", "--env", "this"], False),
        ("aot show tiny", ["-c", AOT, *c, "show", "tiny"], False),
        ("aot stats", ["-c", AOT, *c, "stats"], False),
        ("aot gc --dry-run", ["-c", AOT, *c, "gc", "--dry-run"], False),
        ("aot gc (nothing to delete)", ["-c", AOT, *c, "gc"], False),
        (EXPIRED_LEASE_GC, ["-c", AOT, *c, "gc", "--yes"], False),
        ("aot rm tiny --dry-run", ["-c", AOT, *c, "rm", "tiny", "--dry-run"], False),
        ("aot push FOLDER", ["-c", AOT, *c, "push", str(other)], False),
        ("aot pull FOLDER", ["-c", AOT, *c, "pull", str(other)], False),
        ("aot bundle export", ["-c", AOT, *c, "bundle", "export", str(bundle)], False),
        ("complete `aot show m<TAB>`", ["-c", AOT], False),
    ]


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (KiB) and the heavy modules the process imported."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *argv], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[-3:]} failed:\n{err}")
    imported = [line.removeprefix("IMPORTED=") for line in err.splitlines() if line.startswith("IMPORTED=")]
    return wall, int(usage.ru_maxrss), (imported[-1] if imported else "?") or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="aot-bench-commands-"))
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AOT_", "JAX_COMPILATION_CACHE"))}
        env.update(
            XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
            AOT_ENV_RECORD=str(tmp / "records"), PYTHONPATH=str(REPO),
        )
        cache = tmp / "cache"
        subprocess.run(
            [sys.executable, "-m", "aot", "--cache", str(cache), "warmup", "fixtures/warmup.toml"],
            cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL,
        )
        table = commands(cache, tmp / "other", tmp / "entries.aot")
        samples: dict[str, list[tuple[float, int, str]]] = {label: [] for label, _, _ in table}
        load_start = os.getloadavg()
        for run in range(args.runs):
            for label, argv, fresh in table:
                run_env = dict(env)
                if fresh:
                    run_env["AOT_ENV_RECORD"] = str(tmp / f"empty-{run}")
                if label == EXPIRED_LEASE_GC:
                    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(cache)], cwd=REPO, env=env, check=True)
                if label.startswith("complete"):
                    run_env.update(_AOT_COMPLETE="bash_complete", COMP_WORDS=f"aot --cache {cache} show m", COMP_CWORD="4")
                samples[label].append(run_once(argv, run_env))
        load_end = os.getloadavg()
        print(f"{'command':32} {'wall s (min-max)':>22} {'RSS MiB':>8}  imports")
        out = []
        for label, values in samples.items():
            walls = [v[0] for v in values]
            rss = statistics.median(v[1] for v in values) / 1024
            row = {"command": label, "wall_median": statistics.median(walls), "wall_min": min(walls),
                   "wall_max": max(walls), "rss_mib": rss, "imports": values[-1][2]}
            out.append(row)
            print(f"{label:32} {row['wall_median']:7.3f} ({min(walls):.3f}-{max(walls):.3f}) {rss:8.1f}  {row['imports']}")
        print(f"load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at end; {os.cpu_count()} cores")
        if args.json:
            args.json.write_text(json.dumps({"rows": out, "load": [load_start, load_end], "runs": args.runs}, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
