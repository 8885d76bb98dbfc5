"""The functions the distributed tests run in every process of a job
(:func:`tests.distributed.harness.run_job`); each takes the JSON payload and returns
JSON. Results are compared shard by shard: each process hashes the shards it holds."""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import jax
import numpy as np

MODEL = "tests.distributed.model"


def shard_digests(tree: Any) -> list[dict[str, str]]:
    """sha256 of every addressable shard of every leaf, keyed by the shard's index."""
    out = []
    for leaf in jax.tree_util.tree_leaves(tree):
        jax.block_until_ready(leaf)
        out.append({
            str(s.index): hashlib.sha256(np.asarray(s.data).tobytes()).hexdigest()
            for s in leaf.addressable_shards
        })
    return out


def block_model_import() -> None:
    """The serving process cannot import the model's code, as in production."""
    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name == MODEL:
                raise ImportError(f"{MODEL} is not importable in a serving process")
            return None

    sys.modules.pop(MODEL, None)
    sys.meta_path.insert(0, Blocker())


def specs(rows: int) -> tuple[str, str, str]:
    return (f"f32[{rows},16]", "f32[16,16]", f"f32[{rows},16]")


def _pause_leader_compile(payload: dict[str, Any]) -> None:
    """``payload["leader_fails"]``: the leader's compile raises (an XLA error, as far as
    the others can tell), through the protocol's own pause point."""
    if payload.get("leader_fails") and jax.process_index() == 0:
        from aot.cache import pauses

        def fail(point: str) -> None:
            if point == "slice.compiling":
                raise RuntimeError(payload["leader_fails"])

        pauses.set_hook(fail)


def compile_step(payload: dict[str, Any]) -> dict[str, Any]:
    """Cache.compile of the train step in every process (and of the forward pass,
    with ``forward_rows``); runs it and jax.jit on the same global inputs."""
    import aot
    from tests.distributed import model

    _pause_leader_compile(payload)
    m = model.mesh()
    # blob_location: a fleet's layout, the index in PostgreSQL and the blobs on an object store.
    cache = aot.Cache(payload["cache"], blob_location=payload.get("blob_location"),
                      read_only=payload.get("read_only", False))
    rows = model.batch_rows()
    result = cache.compile_entry(
        model.train_step, *specs(rows), name="dist.step", mesh=m, in_shardings=model.IN_SPECS,
    )
    args = model.inputs(m)
    got = result.executable(*args)
    want = jax.jit(model.train_step)(*args)
    out = {
        "hit": result.hit, "process": jax.process_index(), "key": result.entry.key,
        "got": shard_digests(got), "want": shard_digests(want),
    }
    for bucket in payload.get("forward_rows", ()):
        forward = cache.compile_entry(
            model.forward, f"f32[{bucket},16]", "f32[16,16]", name="dist.forward", mesh=m,
            in_shardings=model.IN_SPECS[:2],
        )
        out.setdefault("forward_hits", []).append(forward.hit)
    if payload.get("static_donate"):
        # lr static (two values: two entries), w donated, as a train loop runs it.
        for lr in (0.1, 0.5):
            step = cache.compile_entry(
                model.scaled_step, *specs(rows), lr, name="dist.scaled", mesh=m,
                in_shardings=model.IN_SPECS, static_argnums=(3,), donate_argnums=(1,),
            )
            x, w, y = model.inputs(m)
            ref = jax.jit(model.scaled_step, static_argnums=(3,))(x, w, y, lr)
            got_step = step.executable(x, w, y)  # the static is compiled in
            out.setdefault("static_hits", []).append(step.hit)
            out.setdefault("static_equal", []).append(shard_digests(got_step) == shard_digests(ref))
            out.setdefault("donated", []).append(w.is_deleted())
    out["entries"] = len(cache.entries())
    return out


def _global(m: Any, i: int, shape: tuple[int, ...], spec: Any) -> jax.Array:
    """The model's inputs, rebuilt without its module (the serving side)."""
    from jax.sharding import NamedSharding

    full = (np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * (0.37 + i) % 1.7 - 0.8)
    full = full.astype(np.float32)
    return jax.make_array_from_callback(shape, NamedSharding(m, spec), lambda index: full[index])


def _die_mid_load() -> None:
    """This process is killed (SIGKILL) as it starts reading an entry's blobs."""
    import os
    import signal

    from aot.cache.store import ArtifactStore

    def load(self: Any, *args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)

    ArtifactStore.load = load  # type: ignore[method-assign]


def serve_step(payload: dict[str, Any]) -> dict[str, Any]:
    """aot.load of the train step in a process that cannot import the model, each mode
    in ``payload["modes"]`` (eager, lazy, background); shard digests of each result.
    ``die_mid_load``: that process is killed while loading."""
    block_model_import()
    import aot

    if payload.get("die_mid_load") == jax.process_index():
        _die_mid_load()
    from jax.sharding import Mesh, PartitionSpec as P

    devices = np.array(jax.devices())
    m = Mesh(devices.reshape(payload.get("mesh_shape") or (jax.process_count(), -1)), ("data", "model"))
    rows = payload.get("rows") or 4 * jax.process_count()
    args = (_global(m, 0, (rows, 16), P("data", None)), _global(m, 1, (16, 16), P(None, "model")),
            _global(m, 2, (rows, 16), P("data", None)))
    modes = {"eager": {"background": False}, "lazy": {"lazy": True}, "background": {"background": True}}
    out: dict[str, Any] = {"recompiled": 0}
    import logging

    class Heard(logging.Handler):  # the ladder's warning, once per recompile
        def emit(self, record: logging.LogRecord) -> None:
            if "recompiled from portable HLO" in record.getMessage():
                out["recompiled"] += 1

    logging.getLogger("aot.cache.serving").addHandler(Heard())
    for mode in payload.get("modes", ["eager"]):
        fn = aot.load("dist.step", cache=payload["cache"], strict=payload.get("strict", True), **modes[mode])
        out[mode] = shard_digests(fn(*args))
    out["model_imported"] = MODEL in sys.modules
    return out


def serve_forward_padded(payload: dict[str, Any]) -> dict[str, Any]:
    """aot.load(pad=) of the forward pass: a request of ``rows`` rows served by a larger
    bucket, sliced back; digests of its shards and of jax.jit's on the same request."""
    import aot
    from tests.distributed import model

    m = model.mesh()
    from jax.sharding import PartitionSpec as P

    x = _global(m, 0, (payload["rows"], 16), P("data", None))
    w = _global(m, 1, (16, 16), P(None, "model"))
    fn = aot.load("dist.forward", cache=payload["cache"], strict=True, pad={"x": 0})
    got = fn(x, w)
    want = jax.jit(model.forward)(x, w)
    return {"shape": list(got.shape), "equal": shard_digests(got) == shard_digests(want)}


def jit_step(payload: dict[str, Any]) -> dict[str, Any]:
    """jax.jit of the train step through aot.jax_cache: this process's hits and misses."""
    import aot
    from tests.distributed import model

    import logging

    # JAX says at debug level which process compiles a shared program and which wait.
    said: list[str] = []

    class Heard(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if "compiling and sharing module" in message:
                said.append("compiled")
            elif "Waiting for module" in message:
                said.append("waited")

    compiler_log = logging.getLogger("jax._src.compiler")
    compiler_log.setLevel(logging.DEBUG)
    compiler_log.addHandler(Heard())
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    backend = aot.jax_cache.install(payload["cache"])
    m = model.mesh()
    args = model.inputs(m)
    got = jax.jit(model.train_step)(*args)
    return {"counts": backend.counts.to_dict(), "got": shard_digests(got), "jax_said": said}


def pmap_step(payload: dict[str, Any]) -> dict[str, Any]:
    """A pmap through the cache against jax.pmap: over this process's devices
    (``local``), or across the job (refused: see the test)."""
    import aot
    import jax.numpy as jnp

    def step(x):
        return jax.lax.psum(jnp.sin(x), "i") * x

    cache = aot.Cache(payload["cache"])
    local = jax.local_device_count()
    devices = jax.local_devices() if payload.get("local") else None
    result = cache.compile_entry(
        step, f"f32[{local},8]", name="dist.pmap", pmap=True, axis_name="i", devices=devices,
    )
    full = np.arange(jax.device_count() * 8, dtype=np.float32).reshape(-1, 8) / 7.0
    mine = full[jax.process_index() * local:(jax.process_index() + 1) * local]
    got = result.executable(mine)
    want = jax.pmap(step, axis_name="i", devices=devices)(mine)
    return {"hit": result.hit, "equal": shard_digests(got) == shard_digests(want)}


def put_step(payload: dict[str, Any]) -> dict[str, Any]:
    """Cache.put of the lowered train step in every process: the key each returned and
    how many XLA compiles each ran (JAX logs each one with jax_log_compiles)."""
    import logging

    import aot
    from tests.distributed import model

    compiles: list[str] = []

    class Heard(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "Finished XLA compilation" in record.getMessage():
                compiles.append(record.getMessage())

    logging.getLogger("jax._src.dispatch").addHandler(Heard())
    jax.config.update("jax_log_compiles", True)
    computation = aot.lower(
        model.train_step, *specs(model.batch_rows()), name="dist.put", mesh=model.mesh(),
        in_shardings=model.IN_SPECS,
    )
    entry = aot.Cache(payload["cache"]).put(computation)
    return {"key": entry.key, "compiles": len(compiles)}
