"""A plain Flax/Optax training script, unchanged but for nothing: the jax-aot cache is
plugged in from outside (``python -m aot.cache.jax_cache train_script.py OUT``).

It trains a small MLP for a few steps and writes OUT (JSON): JAX's compilation-cache
events counted through ``jax.monitoring``, the final parameters' sha256, and what the
jax-aot backend counted (when installed)."""

from __future__ import annotations

import hashlib
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

events: dict[str, int] = {}


def _count(event: str, **_: object) -> None:
    if event.startswith("/jax/compilation_cache/"):
        events[event] = events.get(event, 0) + 1


jax.monitoring.register_event_listener(_count)


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(32)(x))
        return nn.Dense(4)(x)


def main(out: str) -> None:
    model = MLP()
    x = jnp.asarray(np.linspace(-1, 1, 16 * 8, dtype=np.float32).reshape(16, 8))
    y = jnp.asarray(np.arange(16) % 4)
    params = jax.jit(model.init)(jax.random.key(0), x)
    tx = optax.adam(1e-2)
    opt_state = jax.jit(tx.init)(params)

    @jax.jit
    def train_step(params, opt_state, x, y):  # noqa: ANN001, ANN202
        def loss_fn(p):  # noqa: ANN001, ANN202
            logits = model.apply(p, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    for _ in range(3):
        params, opt_state, loss = train_step(params, opt_state, x, y)
    jax.block_until_ready(params)
    digest = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(params):
        digest.update(np.asarray(leaf).tobytes())
    import aot

    backend = aot.jax_cache.installed()
    result = {
        "events": events,
        "params_sha256": digest.hexdigest(),
        "loss": float(loss),
        "backend": backend.counts.to_dict() if backend is not None else None,
    }
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
