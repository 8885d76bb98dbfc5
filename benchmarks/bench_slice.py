"""Start-up of a slice: ``python -m benchmarks --processes 2,4``.

A pod slice is simulated on this machine: N processes on loopback, 2 CPU devices each
(``XLA_FLAGS=--xla_force_host_platform_device_count=2``), gloo collectives, joined by
``jax.distributed.initialize``; a train step (first_result's 12-layer transformer,
batch over "data", weights replicated; ``AOT_BENCH_SLICE_MODEL=mlp``: the fixtures'
sharded MLP, hidden units over "model") on a ``("data", "model")`` mesh of N x 2
devices spanning every process, inputs built with ``jax.make_array_from_callback``.

A slice waits for its slowest host: the figure is the slowest process's time to its
first result (the loss, fetched), each way
side by side in one run, interleaved, median of ``--runs`` (default 3). The clock
starts at a barrier of the distributed runtime that every process reaches after its
imports, ``jax.distributed.initialize`` and its inputs (the same for every way). Each
process also reports its CPU seconds (every thread) from there to its executable and
to its first result: with N processes on this machine's cores, the slice's time follows
their sum.

  jax.jit cold               every process compiles
  jax.jit + persistent cache JAX's cache filled by an earlier job (process 0 writes it)
  deserialize_and_load       every process loads the executable its own process of an
                             earlier job serialized (pickled: the JAX baseline only)
  aot.load                   every process loads the one entry an earlier job stored
                             (default mode; no tracing, no lowering)

    python -m benchmarks.bench_slice worker --dir DIR --variant V   (one process of a job)
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

NAME = "slice.step"
BATCH = 32
#: ``transformer`` (default: the 12-layer train step of first_result, batch over
#: "data") or ``mlp`` (the sharded MLP, hidden units over "model": a 10 KiB program).
MODEL_ENV = "AOT_BENCH_SLICE_MODEL"
VARIANTS = [
    ("jit_cold", "jax.jit cold", "jax"),
    ("pcache", "jax.jit + persistent cache", "jax"),
    ("deserialize", "deserialize_and_load", "jax"),
    ("aot", "aot.load", "aot"),
]
JOB_TIMEOUT = 300  # seconds for one job, however busy the machine


# ----------------------------------------------------------------------------- worker


def step(params: dict[str, Any], x: Any) -> tuple[dict[str, Any], Any]:
    """One SGD step of the sharded MLP on a squared loss (``AOT_BENCH_SLICE_MODEL=mlp``)."""
    import jax
    import jax.numpy as jnp

    from fixtures import models

    def loss_fn(p: dict[str, Any]) -> Any:
        return jnp.mean(jnp.square(models.sharded_mlp(p, x)))

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda a, g: a - 0.01 * g, params, grads), loss


def _model() -> str:
    return os.environ.get(MODEL_ENV, "transformer")


def _step() -> Any:
    from fixtures import models

    return models.transformer_train_step if _model() == "transformer" else step


def _inputs() -> tuple[dict[str, Any], Any]:
    """(params, x) as global arrays on the N x 2 ("data", "model") mesh over every
    process's devices, from host values (numpy: no program runs to make them)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from fixtures import models

    devices = jax.devices()
    mesh = Mesh(np.asarray(devices).reshape(len(devices) // 2, 2), models.SHARDED_AXES)
    rng = np.random.default_rng(0)
    if _model() == "transformer":
        # The first_result scenario's train step: the batch over "data", weights replicated.
        specs = models.transformer_param_specs()
        host = jax.tree.map(lambda s: (0.02 * rng.standard_normal(s.shape)).astype(s.dtype), specs)
        params_p = jax.tree.map(lambda _: P(), host)
        x = rng.integers(0, models.TRANSFORMER_VOCAB, (models.TRANSFORMER_BATCH, models.TRANSFORMER_SEQ))
        x, x_p = x.astype(np.int32), P("data", None)
    else:
        params_p, x_p = models.sharded_mlp_partition_specs()
        d_in, d_hidden, d_out = models.SHARDED_SIZES
        host = {
            "w1": (rng.standard_normal((d_in, d_hidden)) / np.sqrt(d_in)).astype(np.float32),
            "w2": (rng.standard_normal((d_hidden, d_out)) / np.sqrt(d_hidden)).astype(np.float32),
        }
        x = rng.standard_normal((BATCH, d_in)).astype(np.float32)

    def place(value: Any, spec: Any) -> Any:
        return jax.make_array_from_callback(value.shape, NamedSharding(mesh, spec), lambda idx: value[idx])

    return jax.tree.map(place, host, params_p), place(x, x_p)


def _enable_pcache(folder: Path) -> None:
    import jax

    jax.config.update("jax_compilation_cache_dir", str(folder / "pcache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def run_worker(folder: Path, variant: str) -> dict[str, Any]:
    import jax

    pid = int(os.environ["JAX_PROCESS_ID"])
    jax.distributed.initialize(num_processes=int(os.environ["JAX_NUM_PROCESSES"]), process_id=pid)
    jax.devices()
    import_s = time.perf_counter() - T0
    params, x = _inputs()
    # Every process starts the measured part together, after its imports and inputs (a
    # barrier of the distributed runtime: no program compiled for it, none cached).
    from aot.jaxcompat.distributed import client

    client().wait_at_barrier(f"bench-{variant}", 120_000)
    start = time.perf_counter()
    cpu_start = time.process_time()
    extra: dict[str, float] = {}
    if variant == "populate":
        from jax.experimental import serialize_executable

        _enable_pcache(folder)
        compiled = jax.jit(_step()).lower(params, x).compile()
        (folder / f"serialized-{pid}.pkl").write_bytes(pickle.dumps(serialize_executable.serialize(compiled)))
        jax.config.update("jax_enable_compilation_cache", False)  # aot's compile is its own
        import aot

        cache = aot.Cache(folder / "aot")
        cache.compile(_step(), *jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                                          (params, x)), name=NAME)
        cache.close()
        fn = compiled
    elif variant in ("jit_cold", "pcache"):
        if variant == "pcache":
            _enable_pcache(folder)
        fn = jax.jit(_step()).lower(params, x).compile()
    elif variant == "deserialize":
        from jax.experimental import serialize_executable

        payload, in_tree, out_tree = pickle.loads((folder / f"serialized-{pid}.pkl").read_bytes())
        fn = serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
    elif variant == "aot":
        import aot

        extra["aot_import_s"] = time.perf_counter() - start
        fn = aot.load(NAME, cache=str(folder / "aot"))
    else:
        raise ValueError(variant)
    ready_s = time.perf_counter() - start
    extra["ready_cpu_s"] = time.process_time() - cpu_start
    _, loss = fn(params, x)
    value = float(loss)  # replicated: every process holds it
    extra["cpu_s"] = time.process_time() - cpu_start  # every thread of this process
    return {"import_s": import_s, "ready_s": ready_s, "first_s": time.perf_counter() - start, "loss": value,
            "result_epoch": time.time(), "first_result_s": time.perf_counter() - T0, **extra}


# ----------------------------------------------------------------------------- driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(folder: Path, variant: str, count: int) -> tuple[list[dict[str, Any]] | None, float | None, str]:
    """Starts ``count`` processes of one job together; returns each one's result, the
    slice's time (spawn to the slowest process's first result) and an error, if any."""
    from benchmarks import run as driver

    port = _free_port()
    base = driver.worker_env()
    base["XLA_FLAGS"] = " ".join(
        f for f in base.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")
    ) + " --xla_force_host_platform_device_count=2"
    base.update(JAX_PLATFORMS="cpu", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
                JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(count))
    cmd = [sys.executable, *driver.python_flags(), "-m", "benchmarks.bench_slice", "worker",
           "--dir", str(folder), "--variant", variant]
    procs = []
    spawned = time.time()
    try:
        for i in range(count):
            procs.append(subprocess.Popen(cmd, cwd=driver.REPO, env={**base, "JAX_PROCESS_ID": str(i)},
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results, errors = [], []
        deadline = time.monotonic() + JOB_TIMEOUT
        for i, p in enumerate(procs):
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
            line = next((x for x in out.splitlines() if x.startswith(driver.MARKER)), None)
            if p.returncode != 0 or line is None:
                errors.append(f"process {i}: exit {p.returncode}: " + " | ".join(err.strip().splitlines()[-3:]))
            else:
                results.append(json.loads(line[len(driver.MARKER):]))
    except subprocess.TimeoutExpired:
        return None, None, f"the job ran over {JOB_TIMEOUT} s"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    if errors:
        return None, None, "; ".join(errors)
    return results, max(r["result_epoch"] for r in results) - spawned, ""


def slice_scenario(count: int) -> Any:
    from benchmarks.run import Context, Scenario

    def scenario(ctx: Context) -> Scenario:
        s = Scenario(
            f"slice_{count}",
            f"{count} processes x 2 CPU devices (gloo, loopback), {_model()} train step on a "
            f"{count}x2 ('data', 'model') mesh spanning them: the slowest process's first result",
            {"first_s": "slice ready: slowest first result", "ready_s": "load/compile returned, slowest",
             "import_s": "import jax + distributed init, slowest", "wall_s": "spawn to slowest first result",
             "ready_cpu_s": "CPU seconds to load/compile returned, mean per process",
             "cpu_s": "CPU seconds to first result, mean per process"},
            ["first_s"],
            pairs=[("aot.load", label) for _, label, side in VARIANTS if side == "jax"],
        )
        folder = ctx.folder(f"slice_{count}")
        populated, _, error = run_job(folder, "populate", count)
        if populated is None:
            s.skipped = f"populate failed: {error}"
            return s
        for _ in range(ctx.runs_for(3)):
            for variant, label, side in VARIANTS:  # interleaved: drift hits all alike
                row = s.row(label, side)
                results, wall, error = run_job(folder, variant, count)
                if results is None:
                    row.errors.append(error)
                    continue
                row.add({"wall_s": wall, "first_s": max(r["first_s"] for r in results),
                         "ready_s": max(r["ready_s"] for r in results),
                         "import_s": max(r["import_s"] for r in results), "loss": results[0]["loss"],
                         "ready_cpu_s": sum(r["ready_cpu_s"] for r in results) / len(results),
                         "cpu_s": sum(r["cpu_s"] for r in results) / len(results)})
        losses = {v for row in s.rows for v in row.samples.get("loss", [])}
        s.notes.append("every way computed the same loss" if len(losses) == 1 else f"losses differ: {sorted(losses)}")
        mine = s.row("aot.load", "aot").samples.get("first_s", [])
        theirs = s.row("deserialize_and_load", "jax").samples.get("first_s", [])
        if mine and len(mine) == len(theirs):
            per_run = [a / b for a, b in zip(mine, theirs)]
            s.notes.append("slice ready, aot.load / deserialize_and_load per run: "
                           + ", ".join(f"{r:.2f}x" for r in per_run) + f" (median {statistics.median(per_run):.2f}x)")
        for metric, what in (("ready_cpu_s", "to load returned"), ("cpu_s", "to first result")):
            mine_cpu = s.row("aot.load", "aot").samples.get(metric, [])
            theirs_cpu = s.row("deserialize_and_load", "jax").samples.get(metric, [])
            if mine_cpu and theirs_cpu:
                extra_ms = (statistics.median(mine_cpu) - statistics.median(theirs_cpu)) * 1e3
                s.notes.append(f"CPU {what}, aot.load minus deserialize_and_load: {extra_ms:+.0f} ms per "
                               "process (medians)")
        s.notes.append(f"{count} process(es) share this machine's {os.cpu_count()} cores: the CPU each spends "
                       "adds to the slice's time, where hosts of a real slice have cores of their own")
        s.notes.append("'slice ready' runs from a barrier every process reaches after importing JAX, "
                       "joining the job and building its inputs, to the slowest process's loss; "
                       "'spawn to ...' adds the imports, which a loaded 2-core machine makes noisy")
        s.notes.append("each process of aot.load reads the one shared entry (SQLite index + blobs on "
                       "this machine's disk); deserialize_and_load reads its own process's bytes")
        return s

    return scenario


def scenarios(counts: list[int]) -> dict[str, Any]:
    return {f"slice_{n}": slice_scenario(n) for n in counts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_slice")
    parser.add_argument("task", choices=["worker"])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--variant", required=True)
    args = parser.parse_args(argv)
    from benchmarks.worker import emit

    emit(run_worker(args.dir, args.variant))
    return 0


if __name__ == "__main__":
    sys.exit(main())
