"""The model of the distributed tests: a train step on a ``("data", "model")`` mesh
spanning every process. The serving jobs cannot import this module."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

FEATURES = 16


def mesh() -> Mesh:
    """All devices of the job: one row per process (``data``), its 2 devices (``model``)."""
    devices = np.array(jax.devices()).reshape(jax.process_count(), -1)
    return Mesh(devices, ("data", "model"))


def batch_rows() -> int:
    return 4 * jax.process_count()


IN_SPECS = (P("data", None), P(None, "model"), P("data", None))


def train_step(x, w, y, lr=0.1):
    def loss_fn(w):
        return jnp.mean((jnp.tanh(x @ w) - y) ** 2)

    loss, grad = jax.value_and_grad(loss_fn)(w)
    return w - lr * grad, loss


def global_input(i: int, shape: tuple[int, ...], spec: P, m: Mesh, dtype=np.float32) -> jax.Array:
    """A global array of deterministic values, built shard by shard where it lives."""
    full = (np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * (0.37 + i) % 1.7 - 0.8).astype(dtype)
    return jax.make_array_from_callback(shape, NamedSharding(m, spec), lambda index: full[index])


def inputs(m: Mesh, rows: int | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    rows = rows or batch_rows()
    return (
        global_input(0, (rows, FEATURES), IN_SPECS[0], m),
        global_input(1, (FEATURES, FEATURES), IN_SPECS[1], m),
        global_input(2, (rows, FEATURES), IN_SPECS[2], m),
    )


def forward(x, w):
    """Row-independent: padded rows leave the real rows' results unchanged."""
    return jnp.tanh(x @ w)


def scaled_step(x, w, y, lr):
    """The train step with its learning rate static."""
    return train_step(x, w, y, lr)
