"""One process of benchmarks/bench_jax_cache.py: a multi-program Flax/Optax training
script on JAX's persistent cache (JAX's own when ``JAX_COMPILATION_CACHE_DIR`` is set,
jax-aot's when ``AOT_JAX_CACHE`` is). Prints one JSON line: time to the first train
step (from the start of ``main``), CPU seconds, and JAX's cache events.

``AOT_BENCH_JAX_CACHE_MODEL=transformer``: the script is instead the fixtures'
transformer train step (``jax.jit``, at each batch size of ``AOT_BENCH_BATCHES``,
default 8,16), which needs neither Flax nor Optax (the accelerator section of
``python -m benchmarks --platform``)."""

from __future__ import annotations

import json
import os
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

MARK = "JAXCACHE_JSON "
events: dict[str, int] = {}


def _count(event: str, **_: object) -> None:
    events[event] = events.get(event, 0) + 1


jax.monitoring.register_event_listener(_count)


def transformer_script() -> float:
    """The fixtures' train step at each batch size; returns the first step's loss."""
    from fixtures import models

    specs = models.transformer_param_specs()
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map(lambda s: (rng.standard_normal(s.shape) * 0.02).astype(s.dtype), specs)
    step = jax.jit(models.transformer_train_step)
    losses = []
    for b in [int(b) for b in os.environ.get("AOT_BENCH_BATCHES", "8,16").split(",")]:
        tokens = rng.integers(0, models.TRANSFORMER_VOCAB, (b, models.TRANSFORMER_SEQ), dtype=np.int32)
        losses.append(step(params, tokens)[1].block_until_ready())
    return float(losses[0])


def main() -> None:
    start = time.perf_counter()
    begin = resource.getrusage(resource.RUSAGE_SELF)
    installed = 0.0
    if os.environ.get("AOT_JAX_CACHE"):
        import aot

        aot.jax_cache.install_from_env()
    installed = time.perf_counter() - start
    if os.environ.get("AOT_BENCH_JAX_CACHE_MODEL") == "transformer":
        transformer_script()
        first_step = time.perf_counter() - start
        usage = resource.getrusage(resource.RUSAGE_SELF)
        sys.stdout.write(MARK + json.dumps({
            "first_step": first_step, "install": installed,
            "cpu": usage.ru_utime + usage.ru_stime,
            "cpu_main": usage.ru_utime + usage.ru_stime - begin.ru_utime - begin.ru_stime,
            "hits": events.get("/jax/compilation_cache/cache_hits", 0),
            "writes": events.get("/jax/compilation_cache/cache_misses", 0),
            "requests": events.get("/jax/compilation_cache/compile_requests_use_cache", 0),
        }) + "\n")
        return
    import optax
    from flax import linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            for width in (256, 256, 128):
                x = nn.gelu(nn.Dense(width)(x))
            return nn.Dense(10)(x)

    model = MLP()
    x = jnp.asarray(np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32))
    y = jnp.asarray(np.arange(64) % 10)
    params = jax.jit(model.init)(jax.random.key(0), x)
    tx = optax.adamw(1e-3)
    opt_state = jax.jit(tx.init)(params)

    def loss_fn(p, x, y):  # noqa: ANN001, ANN202
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

    @jax.jit
    def train_step(params, opt_state, x, y):  # noqa: ANN001, ANN202
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def eval_step(params, x, y):  # noqa: ANN001, ANN202
        return (model.apply(params, x).argmax(-1) == y).mean()

    params, opt_state, loss = train_step(params, opt_state, x, y)
    loss.block_until_ready()
    first_step = time.perf_counter() - start
    # Whether the remote's clients were loaded before the first step (a warm local tier needs neither).
    remote_imported = "sqlalchemy" in sys.modules or "s3fs" in sys.modules
    eval_step(params, x, y).block_until_ready()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    sys.stdout.write(MARK + json.dumps({
        "first_step": first_step,
        "install": installed,  # importing aot, SQLAlchemy, the store's client; opening the cache
        "cpu": usage.ru_utime + usage.ru_stime,
        # from main's start: the compiles or loads, without the imports every process pays
        "cpu_main": usage.ru_utime + usage.ru_stime - begin.ru_utime - begin.ru_stime,
        "remote_imported": remote_imported,
        "hits": events.get("/jax/compilation_cache/cache_hits", 0),
        "writes": events.get("/jax/compilation_cache/cache_misses", 0),
        "requests": events.get("/jax/compilation_cache/compile_requests_use_cache", 0),
    }) + "\n")


if __name__ == "__main__":
    main()
