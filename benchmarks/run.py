"""Driver: runs each scenario in fresh worker processes and prints ratio tables.

    python -m benchmarks [--quick] [--only NAME[,NAME]] [--runs N] [--json OUT.json] [--keep]
    python -m benchmarks --processes 2,4     a slice's start-up (benchmarks/bench_slice.py)

Scenarios (``--only`` names):

  first_result  time to the first result of the transformer train step in a fresh
                process: aot.load vs jax.jit cold vs JAX's persistent cache (warm) vs
                serialize_executable.deserialize_and_load; import time separately
  first_result_overlap
                first result of the same train step with the weights (.npz) loaded
                while the executable deserializes: aot.load(background=True) next to
                deserialize_and_load (and aot.load) followed by the same np.load
  buckets       time until all 8 buckets of the MLP forward pass are ready
  dispatch      per-call time on `tiny` (f32[8]) and on the 4x2 mesh MLP
  warmup        `aot warmup fixtures/warmup.toml` with --jobs 1 / 2 / 2 --isolate and
                fully cached (with and without warm-up records), next to plain JAX
                compiling the same programs (cold / persistent cache); wall and CPU
  warmup_heavy  `aot warmup benchmarks/heavy.toml` (8 transformer compiles + 8 MLP
                buckets) with --jobs 1 / 2 / auto / 2 --isolate and fully cached:
                wall, CPU, the core-bound floor and the parallel efficiency
  index         benchmarks/bench_index.py (index lookups at 100,000 artifacts)
  storage       raw vs stored bytes, dedup, next to JAX's persistent cache and pickles

Every worker runs with 8 virtual CPU devices and the repository root on PYTHONPATH.
Everything is written under one temporary folder, removed at the end (``--keep`` keeps
it).  Numbers are medians over runs, with min-max; ratios are aot / JAX (below 1 means
aot is faster or smaller).
"""

from __future__ import annotations

import argparse
import builtins
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.worker import AOT_MISSING, MARKER

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "fixtures" / "warmup.toml"
HEAVY_MANIFEST = REPO / "benchmarks" / "heavy.toml"
XLA_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"


# ----------------------------------------------------------------------------- processes


@dataclass
class Proc:
    """One finished subprocess: its JSON line (if any), and wall times seen from outside."""

    result: dict[str, Any] | None
    wall_to_result_s: float | None  # spawn -> the JSON line arrived
    wall_s: float  # spawn -> exit
    returncode: int
    stderr: str
    cpu_s: float | None = None  # user + system CPU of the process and its waited children
    stdout: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def error(self) -> str:
        tail = "\n".join(self.stderr.strip().splitlines()[-6:])
        return f"exit {self.returncode}: {tail}"


# Where workers keep the bytecode of the modules they import (set by main): with
# PYTHONDONTWRITEBYTECODE in the environment, every worker would compile aot's sources
# again (~60 ms of "executable ready") while JAX's installed modules have their .pyc.
PYCACHE: Path | None = None
# The JAX platform of the workers (--platform; benchmarks/bench_platform.py).
PLATFORM = "cpu"


def python_flags() -> list[str]:
    """``-P`` (Python 3.11+): the working directory, the checkout, is not put first on
    ``sys.path``, so an installed jax-aot is imported rather than the checkout's ``aot/``
    folder (which lacks ``aot.cache`` unless installed in editable mode)."""
    return ["-P"] if sys.version_info >= (3, 11) else []


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    if PYCACHE is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    flags = env.get("XLA_FLAGS", "")
    if XLA_DEVICES_FLAG not in flags:
        env["XLA_FLAGS"] = (flags + " " + XLA_DEVICES_FLAG).strip()
    env["JAX_PLATFORMS"] = PLATFORM
    # Last: `benchmarks` and `fixtures` from the checkout, `aot` as installed (see above).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(REPO)]))
    # No ambient cache may leak into a measurement.
    for name in ("JAX_COMPILATION_CACHE_DIR", "AOT_CACHE"):
        env.pop(name, None)
    return env


# Byte-compiles every module of the installed jax-aot into PYCACHE, as pip does when it
# installs a wheel (JAX's modules have theirs): otherwise the first worker of each way
# compiled the modules it imports (the serving ones are imported by no populate step).
_PRECOMPILE = """
import compileall, os, sys
import aot, aot.cache, aot.cli
folders = {os.path.dirname(m.__file__) for m in (aot, aot.cache, aot.cli)}
sys.exit(0 if all(compileall.compile_dir(f, quiet=1) for f in sorted(folders)) else 1)
"""


def precompile() -> None:
    done = subprocess.run([sys.executable, *python_flags(), "-c", _PRECOMPILE], env=worker_env(),
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"byte-compiling jax-aot failed: {done.stderr.strip()[-2000:]}")


def spawn(cmd: list[str], *, timeout: float = 900) -> Proc:
    """Runs ``cmd`` from the repo root; times the JSON line and the exit from outside."""
    with tempfile.TemporaryFile("w+") as err:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=worker_env(), stdout=subprocess.PIPE, stderr=err, text=True
        )
        result = None
        at_result = None
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(MARKER) and result is None:
                at_result = time.perf_counter() - start
                result = json.loads(line[len(MARKER):])
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # one child at a time
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        err.seek(0)
        return Proc(result, at_result, wall, proc.returncode, err.read(), cpu, "".join(lines))


def worker(task: str, folder: Path, variant: str = "", quick: bool = False) -> Proc:
    cmd = [sys.executable, *python_flags(), "-m", "benchmarks.worker", task, "--dir", str(folder)]
    if variant:
        cmd += ["--variant", variant]
    if quick:
        cmd.append("--quick")
    return spawn(cmd)


# ----------------------------------------------------------------------------- results


@dataclass
class Row:
    label: str
    side: str  # "jax" or "aot"
    samples: dict[str, list[float]] = field(default_factory=dict)
    skipped: str | None = None
    errors: list[str] = field(default_factory=list)

    def add(self, values: dict[str, float | None]) -> None:
        for key, value in values.items():
            if value is not None:
                self.samples.setdefault(key, []).append(float(value))

    def median(self, metric: str) -> float | None:
        values = self.samples.get(metric)
        return statistics.median(values) if values else None


@dataclass
class Scenario:
    name: str
    title: str
    metrics: dict[str, str]  # metric -> column heading
    ratio_metrics: list[str]
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None
    unit: str = "s"
    extra: dict[str, Any] = field(default_factory=dict)
    pairs: list[tuple[str, str]] | None = None  # (aot row, JAX row) ratios; None: all

    def row(self, label: str, side: str) -> Row:
        for row in self.rows:
            if row.label == label:
                return row
        row = Row(label, side)
        self.rows.append(row)
        return row

    def record(self, row: Row, proc: Proc, metrics: Callable[[Proc], dict[str, Any]]) -> None:
        if proc.result is not None and "skipped" in proc.result:
            row.skipped = proc.result["skipped"]
        elif proc.result is None or not proc.ok:
            row.errors.append(proc.error())
        else:
            row.add(metrics(proc))

    def ratios(self) -> list[dict[str, Any]]:
        out = []
        for metric in self.ratio_metrics:
            for mine in (r for r in self.rows if r.side == "aot"):
                for theirs in (r for r in self.rows if r.side == "jax"):
                    if self.pairs is not None and (mine.label, theirs.label) not in self.pairs:
                        continue
                    a, b = mine.median(metric), theirs.median(metric)
                    if a is not None and b:
                        out.append({"metric": metric, "aot": mine.label, "jax": theirs.label,
                                    "ratio": a / b})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "skipped": self.skipped,
            "unit": self.unit,
            "metrics": self.metrics,
            "rows": [
                {"variant": r.label, "side": r.side, "samples": r.samples,
                 "median": {m: r.median(m) for m in r.samples}, "skipped": r.skipped,
                 "errors": r.errors}
                for r in self.rows
            ],
            "ratios": self.ratios(),
            "notes": self.notes,
            **self.extra,
        }


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "us":
        return f"{value:.1f}"
    if unit == "B":
        return human_bytes(value)
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def render(s: Scenario) -> str:
    lines = [f"### {s.name}: {s.title}", ""]
    if s.skipped:
        lines += [f"skipped: {s.skipped}", ""]
        return "\n".join(lines)
    if not s.metrics:  # output of an external script, shown as it printed it
        for backend, run in s.extra.get("runs", {}).items():
            lines += [f"{backend}: `{run['command']}`", "", "```",
                      run["stdout"].rstrip(), "```", ""]
        lines += [f"- {note}" for note in s.notes]
        return "\n".join(lines) + "\n"
    heads = [f"{h} ({s.unit})" for h in s.metrics.values()]
    lines.append("| variant | " + " | ".join(heads) + " |")
    lines.append("|---|" + "---|" * len(heads))
    for row in s.rows:
        if row.skipped or (row.errors and not row.samples):
            why = row.skipped or "failed: " + row.errors[0].splitlines()[0]
            lines.append(f"| {row.label} | {why} |" + " |" * (len(heads) - 1))
            continue
        cells = []
        for metric in s.metrics:
            values = row.samples.get(metric)
            if not values:
                cells.append("-")
            elif len(values) == 1:
                cells.append(fmt(values[0], s.unit))
            else:
                cells.append(f"{fmt(statistics.median(values), s.unit)} "
                             f"({fmt(min(values), s.unit)}–{fmt(max(values), s.unit)})")
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    ratios = s.ratios()
    if ratios:
        lines += ["", "ratios (aot / JAX, medians):"]
        for r in ratios:
            lines.append(f"- {s.metrics[r['metric']]}: {r['aot']} / {r['jax']} = "
                         f"{r['ratio']:.2f}x")
    errors = [(r.label, e) for r in s.rows for e in r.errors]
    for label, error in errors[:3]:
        lines.append(f"- error in {label}: {error}")
    for note in s.notes:
        lines.append(f"- {note}")
    lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- scenarios


@dataclass
class Context:
    root: Path
    runs: int | None
    quick: bool

    def runs_for(self, full_runs: int = 5) -> int:
        if self.runs is not None:
            return self.runs
        return 1 if self.quick else full_runs

    def folder(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def populate(s: Scenario, task: str, folder: Path) -> bool:
    proc = worker(task, folder)
    if not proc.ok or proc.result is None:
        s.skipped = f"{task} failed: {proc.error()}"
        return False
    s.extra["populate"] = proc.result
    if "aot" in proc.result:
        s.notes.append(f"aot side: {proc.result['aot']}")
    return True


def same_output(s: Scenario, key: str) -> None:
    """Notes whether every way computed the same result (they run the same program)."""
    values = {v for row in s.rows for v in row.samples.get(key, [])}
    if len(values) > 1:
        s.notes.append(f"MISMATCH: the ways computed different {key}s: {sorted(values)}")
    elif values:
        s.notes.append(f"every way computed the same {key} ({values.pop():.6g})")


def first_result(ctx: Context) -> Scenario:
    s = Scenario(
        "first_result",
        "transformer train step (12 layers, 8x128 tokens), time to first result in a "
        "fresh process",
        {"import_s": "import jax", "ready_s": "executable ready", "run_s": "first step",
         "wall_s": "first result, wall"},
        ["ready_s", "wall_s"],
    )
    folder = ctx.folder("first_result")
    if not populate(s, "transformer.populate", folder):
        return s
    variants = [("jit_cold", "jax.jit cold", "jax"),
                ("pcache", "jax.jit + persistent cache", "jax"),
                ("deserialize", "deserialize_and_load", "jax"),
                ("aot", "aot.load", "aot")]
    for _ in range(ctx.runs_for()):
        for variant, label, side in variants:  # interleaved: drift hits all alike
            proc = worker("transformer.first", folder, variant)
            s.record(s.row(label, side), proc, lambda p: {
                "import_s": p.result["import_s"], "ready_s": p.result["ready_s"],
                "run_s": p.result["run_s"], "wall_s": p.wall_to_result_s,
                "aot_import_s": p.result.get("aot_import_s"), "loss": p.result["loss"]})
    same_output(s, "loss")
    aot_row = s.row("aot.load", "aot")
    mine = aot_row.samples.get("ready_s", [])
    theirs = s.row("deserialize_and_load", "jax").samples.get("ready_s", [])
    if mine and len(mine) == len(theirs):
        # Runs are interleaved, so each run's pair met the same drift; on a machine whose
        # times jump between two levels, the median of these ratios and the ratio of the
        # minimums move less than the ratio of the medians.
        per_run = [a / b for a, b in zip(mine, theirs)]
        s.notes.append(
            "executable ready, aot.load / deserialize_and_load per run: "
            + ", ".join(f"{r:.2f}x" for r in per_run)
            + f" (median {statistics.median(per_run):.2f}x); "
            + f"of the minimums {min(mine) / min(theirs):.2f}x"
        )
    if aot_row.samples.get("aot_import_s"):
        s.notes.append(f"of aot.load's 'executable ready', `import aot` took "
                       f"{aot_row.median('aot_import_s'):.3f} s (median); aot.load imports the cache and "
                       "SQL modules itself, while XLA deserializes ahead")
    s.notes.append("'executable ready' counts the imports each way needs beyond JAX "
                   "(the model module for jax.jit, aot and its cache for aot.load); "
                   "'first result, wall' is measured from process spawn")
    s.notes.append("the first step (~1-3 s of compute on 2 cores) is the same program "
                   "in every row")
    return s


def first_result_overlap(ctx: Context) -> Scenario:
    s = Scenario(
        "first_result_overlap",
        "transformer train step, first result in a fresh process with the weights "
        "(.npz) loaded while the executable deserializes",
        {"returned_s": "load returned", "ready_s": "executable + weights ready",
         "run_s": "first step", "result_s": "to first result", "wall_s": "first result, wall"},
        ["ready_s", "result_s", "wall_s"],
    )
    folder = ctx.folder("first_result_overlap")
    if not populate(s, "transformer.populate", folder):
        return s
    variants = [("deserialize", "deserialize_and_load, then np.load", "jax"),
                ("aot", "aot.load, then np.load", "aot"),
                ("aot_bg", "aot.load(background=True) + np.load meanwhile", "aot")]
    for _ in range(ctx.runs_for()):
        for variant, label, side in variants:  # interleaved: drift hits all alike
            proc = worker("transformer.overlap", folder, variant)
            s.record(s.row(label, side), proc, lambda p: {
                "returned_s": p.result["returned_s"], "ready_s": p.result["ready_s"],
                "run_s": p.result["run_s"], "result_s": p.result["result_s"],
                "wall_s": p.wall_to_result_s, "loss": p.result["loss"]})
    same_output(s, "loss")
    weights = folder / "transformer.npz"
    if weights.exists():
        s.notes.append(f"weights: {human_bytes(weights.stat().st_size)} .npz, loaded with "
                       "np.load and put on the device")
    s.notes.append("'to first result' runs from after `import jax` (the load call, the "
                   "weights, the first step); 'first result, wall' from process spawn")
    s.notes.append("'executable + weights ready' runs from after `import jax` until both "
                   "are in hand (background=True: after Dispatcher.wait(), which the first "
                   "call would otherwise do); the first step is the same compute in every row "
                   "and its noise (+-0.2 s on a shared machine) hides the difference in the "
                   "last two columns")
    return s


def buckets(ctx: Context) -> Scenario:
    s = Scenario(
        "buckets",
        "MLP forward (784-512-512-10), all 8 batch buckets (1..128) ready in a fresh process",
        {"import_s": "import jax", "ready_s": "8 executables ready",
         "run_s": "8 first calls", "wall_s": "all 8 results, wall"},
        ["ready_s", "wall_s"],
    )
    folder = ctx.folder("buckets")
    if not populate(s, "mlp.populate", folder):
        return s
    variants = [("jit_cold", "jax.jit cold", "jax"),
                ("pcache", "jax.jit + persistent cache", "jax"),
                ("aot", "aot.load + warm()", "aot")]
    for _ in range(ctx.runs_for()):
        for variant, label, side in variants:
            proc = worker("mlp.buckets", folder, variant)
            s.record(s.row(label, side), proc, lambda p: {
                "import_s": p.result["import_s"], "ready_s": p.result["ready_s"],
                "run_s": p.result["run_s"], "wall_s": p.wall_to_result_s,
                "aot_import_s": p.result.get("aot_import_s"), "checksum": p.result["checksum"]})
    same_output(s, "checksum")
    aot_row = s.row("aot.load + warm()", "aot")
    if aot_row.samples.get("aot_import_s"):
        s.notes.append(f"of aot's '8 executables ready', `import aot` took "
                       f"{aot_row.median('aot_import_s'):.3f} s (median)")
    return s


def dispatch(ctx: Context) -> Scenario:
    s = Scenario(
        "dispatch",
        "per-call time (call + block_until_ready), jax.Array inputs",
        {"tiny": "tiny f32[8]", "sharded_mlp": "4x2 mesh MLP"},
        ["tiny", "sharded_mlp"],
        unit="us",
    )
    folder = ctx.folder("dispatch")
    proc = worker("dispatch.populate", folder)
    aot_missing = proc.result is not None and "skipped" in proc.result
    if not aot_missing and (not proc.ok or proc.result is None):
        s.notes.append(f"aot side not populated: {proc.error()}")
        aot_missing = True
    ways = [("jit", "jax.jit(f)", "jax"),
            ("compiled", "jax.jit(f).lower().compile()", "jax"),
            ("aot_load", "aot.load dispatcher", "aot"),
            ("aot_load_2sig", "aot.load dispatcher, 2 signatures called", "aot"),
            ("aot_executable", "aot executable (cache.get)", "aot")]
    for _ in range(ctx.runs_for(3)):
        proc = worker("dispatch.measure", folder, quick=ctx.quick)
        if proc.result is None or not proc.ok:
            for _, label, side in ways:
                s.row(label, side).errors.append(proc.error())
            continue
        for way, label, side in ways:
            row = s.row(label, side)
            if f"tiny.{way}_us" not in proc.result:
                row.skipped = proc.result.get("aot", AOT_MISSING)
                continue
            row.add({name: proc.result.get(f"{name}.{way}_us") for name in s.metrics})
        s.extra.setdefault("loops", {"number": proc.result["number"],
                                     "repeats": proc.result["repeats"]})
    loops = s.extra.get("loops", {})
    if loops:
        s.notes.append(f"each process: median of {loops['repeats']} interleaved loops of "
                       f"{loops['number']} calls per way; table: median over processes")
    s.notes.append("the issue's goal compares aot with jax.jit(f).lower().compile() "
                   "called directly")
    return s


def aot_cli() -> tuple[Path | None, str | None]:
    cli = Path(sys.executable).with_name("aot")
    if not cli.exists():
        found = shutil.which("aot")
        cli = Path(found) if found else None
    if cli is None:
        return None, "skipped: the `aot` console script is not installed"
    proc = spawn([str(cli), "warmup", "--help"], timeout=120)
    if not proc.ok:
        return None, "skipped: `aot warmup` not available yet (" + \
            (proc.stderr.strip().splitlines() or ["?"])[-1] + ")"
    return cli, None


def warmup(ctx: Context) -> Scenario:
    """fixtures/warmup.toml: 5 sub-second compiles, where start-up costs dominate."""
    s = Scenario(
        "warmup",
        f"{MANIFEST.relative_to(REPO)} (5 programs), whole process",
        {"wall_s": "wall", "cpu_s": "CPU"},
        ["wall_s", "cpu_s"],
        pairs=[
            ("aot warmup --jobs 1", "JAX compile, 1 process, cold"),
            ("aot warmup --jobs 2", "JAX compile, 1 process, cold"),
            ("aot warmup --jobs 1, all cached", "JAX compile, persistent cache warm"),
            ("aot warmup --jobs 1, all cached, --relower", "JAX compile, persistent cache warm"),
        ],
    )
    folder = ctx.folder("warmup")
    jax_cache = ctx.folder("warmup/jax")
    worker("warmup.jax", jax_cache, "pcache")  # fills JAX's persistent cache
    cli, why = aot_cli()
    if why:
        s.notes.append(f"aot side {why}")
    aot_rows = [
        ("aot warmup --jobs 1", ["--jobs", "1"], "jobs1"),
        ("aot warmup --jobs 2", ["--jobs", "2"], "jobs2"),
        ("aot warmup --jobs 2 --isolate", ["--jobs", "2", "--isolate"], "isolate"),
    ]
    cached_rows = [
        ("aot warmup --jobs 1, all cached", []),
        ("aot warmup --jobs 1, all cached, --relower", ["--relower"]),
    ]
    per_run: list[dict[str, float]] = []
    for run in range(ctx.runs_for(3)):
        for variant, label in (("cold", "JAX compile, 1 process, cold"),
                               ("pcache", "JAX compile, persistent cache warm")):
            proc = worker("warmup.jax", jax_cache, variant)
            s.record(s.row(label, "jax"), proc, lambda p: {"wall_s": p.wall_s, "cpu_s": p.cpu_s})
        if cli is None:
            for label in [r[0] for r in aot_rows] + [r[0] for r in cached_rows]:
                s.row(label, "aot").skipped = why
            continue
        walls: dict[str, float] = {}
        for label, args, tag in aot_rows:
            proc = _aot_warmup(cli, folder / f"{tag}-{run}", MANIFEST, args)
            _record_cli(s.row(label, "aot"), proc)
            if proc.ok:
                walls[tag] = proc.wall_s
        # Again on the cache the --jobs 1 run filled: every entry is a hit.
        for label, args in cached_rows:
            proc = _aot_warmup(cli, folder / f"jobs1-{run}", MANIFEST, ["--jobs", "1", *args])
            _record_cli(s.row(label, "aot"), proc)
        if "jobs1" in walls and "jobs2" in walls:
            per_run.append({"jobs2/jobs1": walls["jobs2"] / walls["jobs1"]})
    if per_run:
        ratios = [r["jobs2/jobs1"] for r in per_run]
        s.notes.append(
            "--jobs 2 / --jobs 1, wall, ratio within each run: "
            + ", ".join(f"{r:.2f}x" for r in ratios) + f" (median {statistics.median(ratios):.2f}x)"
        )
    s.notes.append("CPU = user + system seconds of the process and its worker processes")
    return s


def warmup_heavy(ctx: Context) -> Scenario:
    """benchmarks/heavy.toml: 16 programs, 8 of them multi-second transformer compiles."""
    s = Scenario(
        "warmup_heavy",
        f"{HEAVY_MANIFEST.relative_to(REPO)} (8 transformer train steps + 8 MLP buckets), "
        "whole process",
        {"wall_s": "wall", "cpu_s": "CPU"},
        ["wall_s", "cpu_s"],
        pairs=[
            ("aot warmup --jobs 1", "JAX compile, 1 process, cold"),
            ("aot warmup --jobs 2", "JAX compile, 1 process, cold"),
            ("aot warmup --jobs auto", "JAX compile, 1 process, cold"),
            ("aot warmup --jobs 1, all cached", "JAX compile, persistent cache warm"),
        ],
    )
    folder = ctx.folder("warmup_heavy")
    jax_cache = ctx.folder("warmup_heavy/jax")
    if not ctx.quick:
        worker("warmup.jax", jax_cache, "pcache:heavy")  # fills JAX's persistent cache
    cli, why = aot_cli()
    if why:
        s.skipped = f"aot side {why}"
        return s
    cores = _cores()
    aot_rows = [
        ("aot warmup --jobs 1", ["--jobs", "1"], "jobs1"),
        ("aot warmup --jobs 2", ["--jobs", "2"], "jobs2"),
        ("aot warmup --jobs auto", ["--jobs", "auto"], "auto"),
        ("aot warmup --jobs 2 --isolate", ["--jobs", "2", "--isolate"], "isolate"),
    ]
    jax_rows = [("cold:heavy", "JAX compile, 1 process, cold"),
                ("pcache:heavy", "JAX compile, persistent cache warm")]
    if ctx.quick:  # --jobs 1 and 2 only: the scenario would take minutes
        aot_rows, jax_rows = aot_rows[:2], []
        s.notes.append("quick mode: --jobs 1 and --jobs 2 only, no JAX rows")
    efficiency: dict[str, list[float]] = {tag: [] for _, _, tag in aot_rows}
    speedup: list[float] = []
    auto_jobs: set[int] = set()
    for run in range(ctx.runs_for(3)):
        for variant, label in jax_rows:
            proc = worker("warmup.jax", jax_cache, variant)
            s.record(s.row(label, "jax"), proc, lambda p: {"wall_s": p.wall_s, "cpu_s": p.cpu_s})
        done: dict[str, Proc] = {}
        for label, args, tag in aot_rows:  # interleaved: drift hits every variant alike
            proc = _aot_warmup(cli, folder / f"{tag}-{run}", HEAVY_MANIFEST, [*args, "--json"])
            _record_cli(s.row(label, "aot"), proc)
            if proc.ok:
                done[tag] = proc
                if tag == "auto":
                    auto_jobs.add(int(json.loads(proc.stdout)["jobs"]))
        proc = _aot_warmup(cli, folder / f"jobs1-{run}", HEAVY_MANIFEST, ["--jobs", "1"])
        _record_cli(s.row("aot warmup --jobs 1, all cached", "aot"), proc)
        if "jobs1" in done and done["jobs1"].cpu_s:
            floor = done["jobs1"].cpu_s / cores  # this run's core-bound floor
            for tag, p in done.items():
                efficiency[tag].append(floor / p.wall_s)
            if "jobs2" in done:
                speedup.append(done["jobs2"].wall_s / done["jobs1"].wall_s)
    s.extra["efficiency"] = efficiency
    s.extra["cores"] = cores
    jobs1 = s.row("aot warmup --jobs 1", "aot")
    if jobs1.median("cpu_s"):
        s.notes.append(
            f"core-bound floor = CPU seconds of --jobs 1 / {cores} cores = "
            f"{jobs1.median('cpu_s'):.1f} / {cores} = {jobs1.median('cpu_s') / cores:.1f} s (median)"
        )
    for label, _, tag in aot_rows:
        values = efficiency[tag]
        if values:
            s.notes.append(
                f"parallel efficiency (floor / wall, floor from the same run's --jobs 1) of "
                f"{label}: " + ", ".join(f"{v:.2f}" for v in values)
                + f" (median {statistics.median(values):.2f}; 1.00 = at the floor, "
                f"0.95 = within 1.05x)"
            )
    if speedup:
        s.notes.append("--jobs 2 / --jobs 1, wall, within each run: "
                       + ", ".join(f"{r:.2f}x" for r in speedup))
    if auto_jobs:
        s.notes.append(f"--jobs auto chose {sorted(auto_jobs)} job(s) here")
    s.notes.append("CPU = user + system seconds of the process and its worker processes")
    return s


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _aot_warmup(cli: Path, cache: Path, manifest: Path, args: list[str]) -> Proc:
    return spawn([str(cli), "--cache", str(cache), "warmup", str(manifest), *args])


def _record_cli(row: Row, proc: Proc) -> None:
    if proc.ok:
        row.add({"wall_s": proc.wall_s, "cpu_s": proc.cpu_s})
    else:
        row.errors.append(proc.error())


def index(ctx: Context) -> Scenario:
    """Runs benchmarks/bench_index.py (SQLite; PostgreSQL too when a URL is set)."""
    s = Scenario("index", "index lookups at 100,000 artifacts (benchmarks/bench_index.py)",
                 {}, [])
    script = REPO / "benchmarks" / "bench_index.py"
    if not script.exists():
        s.skipped = "benchmarks/bench_index.py is not there yet"
        return s
    # --quick: 10,000 rows and no blob/compile part, to stay within the time budget.
    base = ["--n", "10000", "--no-jax"] if ctx.quick else []
    if ctx.quick:
        s.notes.append("quick mode: 10,000 rows, no blob part; run without --quick for "
                       "100,000 rows")
    runs = [("sqlite", base)]
    url = os.environ.get("AOT_BENCH_POSTGRES_URL") or os.environ.get("AOT_TEST_POSTGRES_URL")
    if url:
        runs.append(("postgresql", [*base, "--url", url, "--no-jax"]))
    else:
        s.notes.append("PostgreSQL: set AOT_BENCH_POSTGRES_URL to include it")
    s.extra["runs"] = {}
    for backend, extra_args in runs:
        cmd = [sys.executable, str(script), *dict.fromkeys(extra_args)]
        out = subprocess.run(cmd, cwd=REPO, env=worker_env(), capture_output=True, text=True,
                             timeout=3600)
        s.extra["runs"][backend] = {
            "command": "python benchmarks/bench_index.py " + " ".join(cmd[2:]),
            "returncode": out.returncode,
            "stdout": out.stdout,
        }
        if out.returncode != 0:
            s.notes.append(f"{backend}: bench_index.py failed (exit {out.returncode}): "
                           + " / ".join(out.stderr.strip().splitlines()[-3:]))
    return s


def storage(ctx: Context) -> Scenario:
    s = Scenario("storage", "bytes for 12 programs (transformer, 8 MLP buckets, tiny, mesh "
                 "MLP, pmap all-reduce)", {"bytes": "size"}, ["bytes"], unit="B")
    proc = worker("storage", ctx.folder("storage"))
    if proc.result is not None and "skipped" in proc.result:
        s.skipped = proc.result["skipped"]
        return s
    if proc.result is None or not proc.ok:
        s.skipped = f"storage worker failed: {proc.error()}"
        return s
    r = proc.result
    s.extra["raw"] = r
    rows = [
        ("aot: raw (executables + portable HLO)", "info", r["raw_bytes"]),
        ("aot: stored blobs (zstd)", "aot", r["stored_bytes"]),
        ("aot: whole cache folder (blobs + SQLite)", "info", r["cache_folder_bytes"]),
        ("JAX persistent cache folder", "jax", r["jax_pcache_bytes"]),
        ("JAX serialize_executable, pickled", "jax", r["jax_pickled_serialize_bytes"]),
    ]
    for label, side, value in rows:
        s.row(label, side).add({"bytes": value})
    dedup_ok = (r["blob_folder_bytes_after_second_put"] == r["blob_folder_bytes"]
                and r["entries_after_second_put"] == r["entries"])
    s.notes.append(
        f"dedup: every executable stored a second time -> blob folder "
        f"{human_bytes(r['blob_folder_bytes'])} -> "
        f"{human_bytes(r['blob_folder_bytes_after_second_put'])}, blob files "
        f"{r.get('blob_files')} -> {r.get('blob_files_after_second_put')}, entries "
        f"{r['entries']} -> {r['entries_after_second_put']} "
        f"({'no growth' if dedup_ok else 'GREW'})")
    s.notes.append("aot stores the portable HLO as well as the executable; JAX's cache "
                   "stores the executable only")
    return s


SCENARIOS: dict[str, Callable[[Context], Scenario]] = {
    "first_result": first_result,
    "first_result_overlap": first_result_overlap,
    "buckets": buckets,
    "dispatch": dispatch,
    "warmup": warmup,
    "warmup_heavy": warmup_heavy,
    "index": index,
    "storage": storage,
}


# ----------------------------------------------------------------------------- machine


def machine() -> dict[str, Any]:
    from importlib import metadata

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    try:
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        info["cpu"] = platform.processor()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gb"] = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    for dist in ("jax", "jaxlib", "jax-aot", "numpy", "sqlalchemy"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                capture_output=True, text=True, timeout=10).stdout.strip()
        info["commit"] = commit or None
    except OSError:
        info["commit"] = None
    info["xla_flags"] = worker_env()["XLA_FLAGS"]
    info["loadavg"] = loadavg()
    return info


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def busy_warning(load: list[float] | None, cores: int | None) -> str | None:
    if load and cores and load[0] > 0.5 * cores:
        return (f"warning: load average {load[0]:.1f} on {cores} cores; other processes "
                "compete for the CPU and the timings are not representative")
    return None


def describe(m: dict[str, Any]) -> str:
    cores = m.get("cpus_usable", m.get("cpu_count"))
    return (f"{m.get('cpu', '?')}, {cores} cores, {m.get('memory_gb', '?')} GB; "
            f"Python {m['python']}, jax {m['jax']}, jaxlib {m['jaxlib']}; "
            f"commit {m.get('commit')}; {m['xla_flags']}")


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="jax-aot next to plain JAX, in fresh processes, as ratios.",
    )
    parser.add_argument("--quick", action="store_true",
                        help="fewer runs and loops (under 2 minutes on 2 cores)")
    parser.add_argument("--only", default="",
                        help="comma-separated scenarios: " + ", ".join(SCENARIOS))
    parser.add_argument("--runs", type=int, default=None,
                        help="fresh processes per variant (default 5, 3 for dispatch and "
                             "warmup; 1 with --quick)")
    parser.add_argument("--json", type=Path, default=None, help="write raw numbers here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--platform", default=None,
                        help="the accelerator section on this JAX platform (tpu, gpu; cpu to "
                             "test it): benchmarks/bench_platform.py; runs 2 unless --runs")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the printed report here (with --platform: default "
                             "$OUT/benchmarks-PLATFORM.txt, and the --json beside it, when "
                             "$OUT is set)")
    parser.add_argument("--processes", default=None, metavar="N[,N]",
                        help="a slice's start-up with N processes x 2 CPU devices on loopback "
                             "(jax.distributed, gloo): benchmarks/bench_slice.py; runs 3 unless --runs")
    args = parser.parse_args(argv)

    slices: list[str] = []
    if args.processes:
        from benchmarks import bench_slice

        counts = [int(n) for n in args.processes.split(",") if n.strip()]
        SCENARIOS.update(bench_slice.scenarios(counts))
        slices = [f"slice_{n}" for n in counts]
    if args.platform:
        from benchmarks import bench_platform

        bench_platform.configure(args.platform)
        SCENARIOS.update(bench_platform.SCENARIOS)
        if os.environ.get("OUT"):
            args.out = args.out or Path(os.environ["OUT"]) / f"benchmarks-{args.platform}.txt"
            args.json = args.json or Path(os.environ["OUT"]) / f"benchmarks-{args.platform}.json"
    default = list(bench_platform.SCENARIOS) if args.platform else (slices or list(SCENARIOS))
    names = [n.strip() for n in args.only.split(",") if n.strip()] or default
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")

    printed: list[str] = []

    def print(*parts: Any, **kwargs: Any) -> None:  # noqa: A001 - the report, teed to --out
        kwargs.pop("flush", None)
        text = " ".join(str(p) for p in parts)
        printed.append(text)
        builtins.print(text, flush=True, **kwargs)
        if args.out:
            args.out.write_text("\n".join(printed) + "\n")

    info = machine()
    command = "python -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"machine: {describe(info)}")
    cores = info.get("cpus_usable", info.get("cpu_count"))
    warning = busy_warning(info["loadavg"], cores)
    if warning:
        print(warning)
    print(f"command: {command.strip()}\n", flush=True)

    root = Path(tempfile.mkdtemp(prefix="aot-bench-"))
    global PYCACHE
    PYCACHE = root / "pycache"
    precompile()
    ctx = Context(root, args.runs, args.quick)
    report: dict[str, Any] = {"command": command.strip(), "machine": info, "scenarios": {}}
    started = time.perf_counter()
    try:
        for name in names:
            t = time.perf_counter()
            scenario = SCENARIOS[name](ctx)
            seconds = time.perf_counter() - t
            data = scenario.to_dict()
            data["seconds"] = seconds
            report["scenarios"][name] = data
            print(render(scenario), flush=True)
            print(f"({name}: {seconds:.0f} s)\n", flush=True)
            if args.json:  # so far, in case the run is cut short
                args.json.write_text(json.dumps(report, indent=2) + "\n")
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    report["seconds"] = time.perf_counter() - started
    report["loadavg_at_end"] = loadavg()
    print(f"total: {report['seconds']:.0f} s; load average at start {info['loadavg']}, "
          f"at end {report['loadavg_at_end']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
