"""Benchmark worker: one measurement in a fresh process, one JSON line on stdout.

    python -m benchmarks.worker TASK --dir DIR [--variant V] [--quick]

The driver (``python -m benchmarks``) starts every worker with 8 virtual CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``), ``JAX_PLATFORMS=cpu`` and the
repository root on ``PYTHONPATH``, and reads the line that starts with ``BENCH_JSON``.
Times are seconds from the first line of this module (``t0``); the driver adds the
interpreter start-up by timing the process from outside.

Variants: ``jit_cold`` (jax.jit, nothing cached), ``pcache`` (jax.jit with JAX's
persistent compilation cache populated by an earlier process), ``deserialize``
(``jax.experimental.serialize_executable.deserialize_and_load`` of bytes pickled by an
earlier process; pickle is used for this JAX baseline only), ``aot`` (``aot.load``).
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

MARKER = "BENCH_JSON "
AOT_MISSING = "skipped: aot.Cache not available yet"


def since_start() -> float:
    return time.perf_counter() - T0


def emit(result: dict[str, Any]) -> None:
    sys.stdout.write(MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()


class Skip(Exception):
    pass


def import_jax() -> float:
    """Imports JAX and initialises the CPU backend; returns the time it took."""
    start = time.perf_counter()
    import jax

    jax.devices()
    return time.perf_counter() - start


def enable_persistent_cache(folder: Path) -> None:
    import jax

    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def require_aot() -> Any:
    import aot

    # dir(), not hasattr(): hasattr imports aot.Cache's modules, which a serving
    # process calling aot.load alone does not import first (aot.load reads ahead
    # while it imports them: cache/serving/read_ahead.py).
    if not {"Cache", "load"} <= set(dir(aot)):
        raise Skip(AOT_MISSING)
    return aot


def block(tree: Any) -> Any:
    import jax

    return jax.block_until_ready(tree)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


# ----------------------------------------------------------------------------- helpers


def save_checkpoint(path: Path, tree: dict[str, Any], extra: dict[str, Any]) -> None:
    """Nested dicts of arrays -> npz with "a/b/c" keys (what a serving process loads)."""
    import numpy as np

    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}{key}/", value)
        else:
            flat["params/" + prefix[:-1]] = np.asarray(node)

    walk("", tree)
    flat.update(extra)
    np.savez(path, **flat)


def load_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    import jax
    import numpy as np

    params: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    with np.load(path) as data:
        for key in data.files:
            if not key.startswith("params/"):
                extra[key] = data[key]
                continue
            node = params
            *parents, leaf = key[len("params/"):].split("/")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = data[key]
    return jax.device_put(params), jax.device_put(extra)


def host_params(specs: Any, seed: int) -> Any:
    """Random numpy arrays shaped like ``specs`` (no JAX computation, so no compiles)."""
    import jax
    import numpy as np

    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda s: (rng.standard_normal(s.shape) * 0.02).astype(s.dtype), specs
    )


# ------------------------------------------------------- scenario 1: transformer first result

TRANSFORMER = "transformer.train_step"


def batches() -> list[int]:
    """The train step's batch sizes (buckets): ``AOT_BENCH_BATCHES`` ("8,16"), default 8.
    The first is the one whose result is "the first result"."""
    import os

    return [int(b) for b in os.environ.get("AOT_BENCH_BATCHES", "8").split(",") if b.strip()]


def batch_key(b: int) -> str:
    return "batch" if b == 8 else f"batch{b}"  # "batch": the checkpoint's key before buckets


def pickle_path(folder: Path, b: int) -> Path:
    return folder / ("transformer.pkl" if b == 8 else f"transformer-{b}.pkl")


def deserialize(folder: Path, b: int) -> Any:
    import pickle

    import jax
    from jax.experimental import serialize_executable

    serialized, in_tree, out_tree = pickle.loads(pickle_path(folder, b).read_bytes())
    # The program runs on one device; by default JAX would map it onto all 8.
    return serialize_executable.deserialize_and_load(
        serialized, in_tree, out_tree, execution_devices=jax.devices()[:1]
    )


def transformer_populate(folder: Path, _variant: str, _quick: bool) -> dict[str, Any]:
    """Writes the checkpoint, then fills the persistent cache, the pickle and the aot cache
    (one program per batch size of :func:`batches`)."""
    import pickle

    import jax
    import numpy as np
    from jax.experimental import serialize_executable

    from fixtures import models

    param_specs = models.transformer_param_specs()
    rng = np.random.default_rng(0)
    tokens = {batch_key(b): np.asarray(models.transformer_batch(0)) if b == 8 else
              rng.integers(0, models.TRANSFORMER_VOCAB, (b, models.TRANSFORMER_SEQ), dtype=np.int32)
              for b in batches()}
    save_checkpoint(folder / "transformer.npz", host_params(param_specs, 0), tokens)
    params, extra = load_checkpoint(folder / "transformer.npz")
    result: dict[str, Any] = {"batches": batches()}

    # JAX's persistent cache, filled by the same lower().compile() the pcache variant runs.
    enable_persistent_cache(folder / "pcache")
    start = time.perf_counter()
    for b in batches():
        compiled = jax.jit(models.transformer_train_step).lower(params, extra[batch_key(b)]).compile()
        # serialize_executable of that executable (pickled: the JAX baseline only).
        payload = serialize_executable.serialize(compiled)
        pickle_path(folder, b).write_bytes(pickle.dumps(payload))
    result["jit_compile_s"] = time.perf_counter() - start

    # The aot cache.  Its compile is a persistent-cache hit here (same program), which
    # saves a compile; the stored executable is the same.
    try:
        aot = require_aot()
    except Skip as exc:
        result["aot"] = str(exc)
        return result
    cache = aot.Cache(folder / "aot")
    start = time.perf_counter()
    for b in batches():
        spec = jax.ShapeDtypeStruct((b, models.TRANSFORMER_SEQ), np.int32)
        cache.compile(models.transformer_train_step, param_specs, spec, name=TRANSFORMER)
    result["aot_compile_s"] = time.perf_counter() - start
    return result


def transformer_first(folder: Path, variant: str, _quick: bool) -> dict[str, Any]:
    """Fresh process to the first result of the train step; with several buckets
    (``AOT_BENCH_BATCHES``) every way readies all of them (JAX: compiles or deserializes
    each; aot: ``aot`` loads eagerly with ``warm()``, ``aot_default`` calls ``aot.load``
    with its defaults, ``aot_lazy`` with ``lazy=True``, ``aot_bg`` with
    ``background=True``), then runs the first bucket (``first_s``) and the others
    (``all_s``)."""
    import_s = import_jax()
    start = time.perf_counter()
    params, extra = load_checkpoint(folder / "transformer.npz")
    sizes = batches()
    inputs = [extra[batch_key(b)] for b in sizes]
    block((params, inputs))
    setup_s = time.perf_counter() - start

    start = time.perf_counter()
    extra_times: dict[str, float] = {}
    if variant in ("jit_cold", "pcache"):
        import jax

        if variant == "pcache":
            enable_persistent_cache(folder / "pcache")
        from fixtures import models

        step = jax.jit(models.transformer_train_step)
        # jit compiles on the first call; lower().compile() separates compile from run
        # at the same cost (the first call of `compiled` does no more work).
        steps = [step.lower(params, x).compile() for x in inputs]
    elif variant == "deserialize":
        steps = [deserialize(folder, b) for b in sizes]
    elif variant in ("aot", "aot_default", "aot_lazy", "aot_bg"):
        aot = require_aot()
        extra_times["aot_import_s"] = time.perf_counter() - start  # aot.load imports the rest
        options = {"aot_lazy": {"lazy": True}, "aot_bg": {"background": True}}.get(variant, {})
        dispatcher = aot.load(TRANSFORMER, cache=str(folder / "aot"), **options)
        if variant == "aot":
            dispatcher.warm()
        steps = [dispatcher] * len(sizes)
    else:
        raise ValueError(variant)
    ready_s = time.perf_counter() - start  # load returned (lazy / background: not loaded yet)

    run_start = time.perf_counter()
    _, loss = block(steps[0](params, inputs[0]))
    run_s = time.perf_counter() - run_start
    first_s = time.perf_counter() - start
    losses = [float(loss)]
    for fn, x in zip(steps[1:], inputs[1:]):
        losses.append(float(block(fn(params, x))[1]))
    return {
        "import_s": import_s,
        "setup_s": setup_s,
        "ready_s": ready_s,
        "run_s": run_s,
        "first_s": first_s,
        "all_s": time.perf_counter() - start,
        "first_result_s": since_start(),
        "loss": losses[0],
        "losses": losses,
        **extra_times,
    }


def transformer_compile(folder: Path, variant: str, _quick: bool) -> dict[str, Any]:
    """Compiles every bucket of the train step in a fresh process, nothing cached:
    ``jax`` (``jax.jit(...).lower().compile()``) or ``aot:<tag>`` (``Cache.compile``
    into a new cache folder); wall and CPU (all threads) seconds of the compiles."""
    import_jax()
    import jax
    import numpy as np

    from fixtures import models

    param_specs = models.transformer_param_specs()
    specs = [jax.ShapeDtypeStruct((b, models.TRANSFORMER_SEQ), np.int32) for b in batches()]
    way, _, tag = variant.partition(":")
    cache = require_aot().Cache(folder / f"compile-{tag}") if way == "aot" else None
    start, cpu = time.perf_counter(), time.process_time()
    for spec in specs:
        if cache is None:
            jax.jit(models.transformer_train_step).lower(param_specs, spec).compile()
        else:
            cache.compile(models.transformer_train_step, param_specs, spec, name=TRANSFORMER)
    return {"compile_s": time.perf_counter() - start, "compile_cpu_s": time.process_time() - cpu,
            "programs": len(specs)}


def transformer_dispatch(folder: Path, _variant: str, quick: bool) -> dict[str, Any]:
    """Per call of the train step (first bucket), call + block_until_ready, in one
    process: the aot.load dispatcher next to JAX's Compiled (deserialize_and_load of the
    same executable), interleaved loops."""
    import_jax()
    aot = require_aot()
    params, extra = load_checkpoint(folder / "transformer.npz")
    b = batches()[0]
    x = extra[batch_key(b)]
    ways = {"compiled": deserialize(folder, b),
            "aot_load": aot.load(TRANSFORMER, cache=str(folder / "aot")).warm()}
    want = block(ways["compiled"](params, x))[1]
    for fn in ways.values():
        assert float(block(fn(params, x))[1]) == float(want)
    number, repeats = (5, 3) if quick else (200, 7)
    samples: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(repeats):
        for way, fn in ways.items():
            start = time.perf_counter()
            for _ in range(number):
                block(fn(params, x))
            samples[way].append((time.perf_counter() - start) / number * 1e6)
    result: dict[str, Any] = {"number": number, "repeats": repeats}
    for way, values in samples.items():
        result[f"{way}_us"] = statistics.median(values)
    return result


def transformer_overlap(folder: Path, variant: str, _quick: bool) -> dict[str, Any]:
    """First result of the train step when the process loads its weights (.npz) after
    starting to load the executable: ``aot.load(background=True)`` returns at once and
    the executable deserializes while the weights load; JAX's ``deserialize_and_load``
    (and ``aot.load`` without ``background``) finish loading before the weights start."""
    import_s = import_jax()
    start = time.perf_counter()
    if variant == "deserialize":
        import pickle

        import jax
        from jax.experimental import serialize_executable

        serialized, in_tree, out_tree = pickle.loads((folder / "transformer.pkl").read_bytes())
        step = serialize_executable.deserialize_and_load(
            serialized, in_tree, out_tree, execution_devices=jax.devices()[:1]
        )
    elif variant in ("aot", "aot_bg"):
        aot = require_aot()
        step = aot.load(TRANSFORMER, cache=str(folder / "aot"), background=variant == "aot_bg")
    else:
        raise ValueError(variant)
    returned_s = time.perf_counter() - start
    params, extra = load_checkpoint(folder / "transformer.npz")
    batch = extra["batch"]
    block((params, batch))
    if variant == "aot_bg":
        step.wait()  # what the first call would wait for: the rest of the load, if any
    ready_s = time.perf_counter() - start  # the executable and the weights ready

    run_start = time.perf_counter()
    _, loss = block(step(params, batch))
    run_s = time.perf_counter() - run_start
    return {
        "import_s": import_s,
        "returned_s": returned_s,
        "ready_s": ready_s,
        "run_s": run_s,
        "result_s": time.perf_counter() - start,
        "first_result_s": since_start(),
        "loss": float(loss),
    }


# ------------------------------------------------------------- scenario 2: 8 MLP buckets

MLP = "mlp.forward"


def mlp_populate(folder: Path, _variant: str, _quick: bool) -> dict[str, Any]:
    import jax
    import numpy as np

    from fixtures import models

    param_specs = models.mlp_param_specs()
    save_checkpoint(
        folder / "mlp.npz",
        {str(i): layer for i, layer in enumerate(host_params(param_specs, 0))},
        {f"x{b}": np.asarray(models.mlp_input(b)) for b in models.MLP_BUCKETS},
    )
    params, extra = load_checkpoint(folder / "mlp.npz")
    params = [params[str(i)] for i in range(len(params))]
    enable_persistent_cache(folder / "pcache")
    forward = jax.jit(models.mlp_forward)
    for b in models.MLP_BUCKETS:
        block(forward(params, extra[f"x{b}"]))
    result: dict[str, Any] = {}
    try:
        aot = require_aot()
    except Skip as exc:
        result["aot"] = str(exc)
        return result
    cache = aot.Cache(folder / "aot")
    for b in models.MLP_BUCKETS:
        cache.compile(models.mlp_forward, param_specs, models.mlp_input_spec(b), name=MLP)
    return result


def mlp_buckets(folder: Path, variant: str, _quick: bool) -> dict[str, Any]:
    import_s = import_jax()
    start = time.perf_counter()
    params, extra = load_checkpoint(folder / "mlp.npz")
    params = [params[str(i)] for i in range(len(params))]
    inputs = [v for k, v in sorted(extra.items(), key=lambda kv: int(kv[0][1:]))]
    block((params, inputs))
    setup_s = time.perf_counter() - start

    start = time.perf_counter()
    if variant in ("jit_cold", "pcache"):
        import jax

        if variant == "pcache":
            enable_persistent_cache(folder / "pcache")
        from fixtures import models

        forward = jax.jit(models.mlp_forward)
        compiled = [forward.lower(params, x).compile() for x in inputs]
        calls = [(c, x) for c, x in zip(compiled, inputs)]
    elif variant == "aot":
        aot = require_aot()
        aot_import_s = time.perf_counter() - start
        dispatcher = aot.load(MLP, cache=str(folder / "aot"))
        dispatcher.warm()
        if len(dispatcher.signatures) != len(inputs):
            raise RuntimeError(f"expected {len(inputs)} signatures, got {dispatcher.signatures}")
        calls = [(dispatcher, x) for x in inputs]
    else:
        raise ValueError(variant)
    ready_s = time.perf_counter() - start
    extra_times = {"aot_import_s": aot_import_s} if variant == "aot" else {}

    start = time.perf_counter()
    outs = [block(fn(params, x)) for fn, x in calls]
    run_s = time.perf_counter() - start
    return {
        "import_s": import_s,
        "setup_s": setup_s,
        "ready_s": ready_s,
        "run_s": run_s,
        "all_ready_s": since_start(),
        "checksum": float(sum(float(o.sum()) for o in outs)),
        **extra_times,
    }


# ------------------------------------------------------------- scenario 3: per-call dispatch


def dispatch_populate(folder: Path, _variant: str, _quick: bool) -> dict[str, Any]:
    aot = require_aot()
    import_jax()
    from fixtures import models

    cache = aot.Cache(folder / "aot")
    cache.compile(models.tiny, *models.tiny_specs(), name="tiny")
    # A second signature of tiny: a dispatcher that has served both selects in Python.
    import jax

    small = jax.ShapeDtypeStruct((4,), jax.numpy.float32)
    cache.compile(models.tiny, small, small, name="tiny")
    mesh = models.sharded_mlp_mesh()
    cache.compile(
        models.sharded_mlp,
        *models.sharded_mlp_specs(mesh),
        name="sharded_mlp",
        mesh=mesh,
        in_shardings=models.sharded_mlp_shardings(mesh),
    )
    return {}


def _per_call_us(fn: Any, args: tuple[Any, ...], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn(*args).block_until_ready()
    return (time.perf_counter() - start) / number * 1e6


def _entry_fits(entry: Any, args: tuple[Any, ...]) -> bool:
    import jax

    leaves = jax.tree_util.tree_leaves(args)
    return [tuple(a["shape"]) for a in json.loads(entry.manifest)["args"]] == [tuple(x.shape) for x in leaves]


def dispatch_measure(folder: Path, _variant: str, quick: bool) -> dict[str, Any]:
    """Per-call time of each way of calling the same program, interleaved, in one process."""
    import_jax()
    import jax
    import numpy as np

    from fixtures import models

    mesh = models.sharded_mlp_mesh()
    programs: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]] = {}
    tiny_args = models.tiny_inputs()
    programs["tiny"] = (models.tiny, tiny_args, {})
    mlp_args = models.sharded_mlp_inputs(mesh)
    programs["sharded_mlp"] = (
        models.sharded_mlp, mlp_args, {"in_shardings": models.sharded_mlp_shardings(mesh)}
    )

    try:
        aot = require_aot()
        cache = aot.Cache(folder / "aot")
    except Skip:
        aot = cache = None

    number = 300 if quick else 2000
    repeats = 5 if quick else 9
    result: dict[str, Any] = {"number": number, "repeats": repeats}
    for name, (fn, args, jit_kwargs) in programs.items():
        ways: dict[str, Any] = {}
        jitted = jax.jit(fn, **jit_kwargs)
        ways["jit"] = jitted
        ways["compiled"] = jax.jit(fn, **jit_kwargs).lower(*args).compile()
        if aot is not None:
            ways["aot_load"] = aot.load(name, cache=cache).warm()
            exact = [e for e in cache.entries(name) if _entry_fits(e, args)]
            ways["aot_executable"] = cache.get(exact[0].key)
            if name == "tiny":  # the dispatcher after a call of its other signature
                two = aot.load(name, cache=cache).warm()
                two(*(a[:4] for a in args))
                ways["aot_load_2sig"] = two
        reference = np.asarray(jitted(*args))
        for way, call in ways.items():
            np.testing.assert_allclose(np.asarray(call(*args)), reference, rtol=1e-6)
            _per_call_us(call, args, max(50, number // 10))  # warm-up
        samples: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(repeats):
            for way, call in ways.items():
                samples[way].append(_per_call_us(call, args, number))
        for way, values in samples.items():
            result[f"{name}.{way}_us"] = statistics.median(values)
            result[f"{name}.{way}_min_us"] = min(values)
    if aot is None:
        result["aot"] = AOT_MISSING
    return result


# ------------------------------------------------------------- scenario 4: warmup, JAX side


def expand_manifest(path: Path) -> list[tuple[str, Any, list[Any], str | None]]:
    """(name, fn, arg specs, pmap axis) per compile, as `aot warmup` expands the file."""
    import importlib
    import itertools

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    from aot.specs import spec  # the core spec parser (no cache, no CLI)

    def resolve(function: str) -> Any:
        module, _, attr = function.partition(":")
        return getattr(importlib.import_module(module), attr)

    items = []
    for entry in tomllib.loads(path.read_text())["function"]:
        # ``function`` names the Python function (``target`` did before: still read).
        fn = resolve(entry.get("function") or entry["target"])
        vary = entry.get("vary", {})
        keys = sorted(vary)
        for values in itertools.product(*(vary[k] for k in keys)) if keys else [()]:
            subst = dict(zip(keys, values))
            args = []
            for arg in entry["args"]:
                if arg.startswith("@"):
                    args.append(resolve(arg[1:])())
                else:
                    args.append(spec(arg.format(**subst)))
            items.append((entry["name"], fn, args, entry.get("pmap")))
    return items


WARMUP_MANIFESTS = {
    "": Path(__file__).resolve().parents[1] / "fixtures" / "warmup.toml",
    "heavy": Path(__file__).resolve().parent / "heavy.toml",
}


def warmup_jax(folder: Path, variant: str, _quick: bool) -> dict[str, Any]:
    """Compiles every program of a manifest with plain JAX, one after another.

    ``variant`` is ``cold`` or ``pcache`` (JAX's persistent cache in ``folder``), then
    optionally ``:heavy`` for benchmarks/heavy.toml instead of fixtures/warmup.toml."""
    import_s = import_jax()
    import jax

    start = time.perf_counter()
    mode, _, which = variant.partition(":")
    if mode == "pcache":
        enable_persistent_cache(folder / "pcache")
    items = expand_manifest(WARMUP_MANIFESTS[which])
    for _name, fn, args, axis in items:
        wrapped = jax.pmap(fn, axis_name=axis) if axis else jax.jit(fn)
        wrapped.lower(*args).compile()
    return {"import_s": import_s, "compile_s": time.perf_counter() - start,
            "programs": len(items), "total_s": since_start()}


# ------------------------------------------------------------- scenario 6: storage


def storage(folder: Path, _variant: str, _quick: bool) -> dict[str, Any]:
    import pickle

    import_jax()
    import jax
    from jax.experimental import serialize_executable

    from fixtures import models

    aot = require_aot()
    mesh = models.sharded_mlp_mesh()
    programs: list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]] = [
        (TRANSFORMER, models.transformer_train_step,
         (models.transformer_param_specs(), models.transformer_batch_spec()), {}),
        *[(MLP, models.mlp_forward, (models.mlp_param_specs(), models.mlp_input_spec(b)), {})
          for b in models.MLP_BUCKETS],
        ("tiny", models.tiny, models.tiny_specs(), {}),
        ("sharded_mlp", models.sharded_mlp, models.sharded_mlp_specs(mesh),
         {"mesh": mesh, "in_shardings": models.sharded_mlp_shardings(mesh)}),
    ]
    cache_dir = folder / "aot"
    cache = aot.Cache(cache_dir)
    # JAX's persistent cache is on from the start: each program is compiled once (by
    # jax.jit, writing the persistent cache); aot's compile of it is then a hit.
    enable_persistent_cache(folder / "pcache")
    executables = []
    pickled_bytes = 0
    for name, fn, args, kwargs in programs:
        jit_kwargs = {"in_shardings": kwargs["in_shardings"]} if "in_shardings" in kwargs else {}
        compiled = jax.jit(fn, **jit_kwargs).lower(*args).compile()
        pickled_bytes += len(pickle.dumps(serialize_executable.serialize(compiled)))
        executables.append(cache.compile(fn, *args, name=name, **kwargs))
    compiled = jax.pmap(models.allreduce, axis_name="i").lower(models.allreduce_spec()).compile()
    pickled_bytes += len(pickle.dumps(serialize_executable.serialize(compiled)))
    executables.append(
        cache.compile(models.allreduce, models.allreduce_spec(), name="allreduce",
                      pmap=True, axis_name=models.ALLREDUCE_AXIS)
    )

    entries = cache.entries()
    raw = sum(e.raw_size for e in entries)
    stored = sum(e.stored_size for e in entries)
    on_disk = folder_bytes(cache_dir)
    blob_disk = folder_bytes(cache_dir / "blobs") if (cache_dir / "blobs").exists() else None
    blob_files = sum(1 for p in (cache_dir / "blobs").rglob("*") if p.is_file())

    # Dedup: store every executable a second time; no blob or entry may be added.
    for exe in executables:
        cache.put(exe)
    after_again = folder_bytes(cache_dir / "blobs") if blob_disk is not None else folder_bytes(cache_dir)
    entries_again = len(cache.entries())
    blob_files_again = sum(1 for p in (cache_dir / "blobs").rglob("*") if p.is_file())

    return {
        "programs": len(executables),
        "entries": len(entries),
        "raw_bytes": raw,
        "stored_bytes": stored,
        "cache_folder_bytes": on_disk,
        "blob_folder_bytes": blob_disk,
        "blob_folder_bytes_after_second_put": after_again,
        "entries_after_second_put": entries_again,
        "blob_files": blob_files,
        "blob_files_after_second_put": blob_files_again,
        "jax_pcache_bytes": folder_bytes(folder / "pcache"),
        "jax_pickled_serialize_bytes": pickled_bytes,
    }


TASKS = {
    "transformer.populate": transformer_populate,
    "transformer.first": transformer_first,
    "transformer.overlap": transformer_overlap,
    "transformer.compile": transformer_compile,
    "transformer.dispatch": transformer_dispatch,
    "mlp.populate": mlp_populate,
    "mlp.buckets": mlp_buckets,
    "dispatch.populate": dispatch_populate,
    "dispatch.measure": dispatch_measure,
    "warmup.jax": warmup_jax,
    "storage": storage,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.worker")
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--variant", default="")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    cpu = os.environ.get("JAX_PLATFORMS", "cpu") == "cpu"
    if cpu and "--xla_force_host_platform_device_count=8" not in os.environ.get("XLA_FLAGS", ""):
        print("warning: XLA_FLAGS lacks --xla_force_host_platform_device_count=8", file=sys.stderr)
    try:
        result = TASKS[args.task](args.dir, args.variant, args.quick)
    except Skip as exc:
        result = {"skipped": str(exc)}
    # The process's peak resident set so far (kB on Linux), for the serving-memory goal.
    result.update(task=args.task, variant=args.variant,
                  peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
