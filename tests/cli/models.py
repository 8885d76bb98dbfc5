"""Small functions for the CLI tests (importable as ``cli_models`` from tests/cli)."""

from __future__ import annotations

import multiprocessing
import os

import jax
import jax.numpy as jnp


def affine(x, *, bias, double=False):
    y = x + bias
    return y * 2 if double else y


def matmul(x, w):
    return x @ w


def donating(x, y):
    return x + y


def three_specs():
    s = jax.ShapeDtypeStruct((4,), jnp.float32)
    return (s, s, s)


def add3(a, b, c):
    return a + b + c


def not_callable_specs():
    raise RuntimeError("spec builder broke")


def broken(x):
    raise ValueError("this model is broken\nsecond line of the message")


def branches_on_a_value(x):
    if x > 0:
        return x
    return -x


def mlp_params_wider():
    """The fixture MLP's parameter specs with a last layer of 12 outputs, not 10."""
    from fixtures.models import mlp_param_specs

    params = mlp_param_specs()
    params[2] = {
        "b": jax.ShapeDtypeStruct((12,), jnp.float32),
        "w": jax.ShapeDtypeStruct((512, 12), jnp.float32),
    }
    return params


def dies_in_worker(x):
    """Kills a spawned warmup worker while tracing; harmless in the main process."""
    if multiprocessing.parent_process() is not None:
        os._exit(3)
    return x + 1


def waits_for_partner(x):
    """Returns once `partner` was traced (by another process: the warm-up test of
    --jobs 2 proves with it that a worker took an entry while this process worked)."""
    import time

    flag = os.environ["AOT_TEST_PARTNER_FLAG"]
    deadline = time.monotonic() + 120
    while not os.path.exists(flag):
        if time.monotonic() > deadline:
            raise TimeoutError("no other process traced `partner` within 120 s")
        time.sleep(0.05)
    return x + 1


def partner(x):
    with open(os.environ["AOT_TEST_PARTNER_FLAG"], "w") as f:
        f.write(str(os.getpid()))
    return x * 2


SPEC_CALLS = []


def counted_specs():
    """A spec callable that counts its calls (a warm-up calls it once, whatever the buckets)."""
    SPEC_CALLS.append(1)
    return jax.ShapeDtypeStruct((4,), jnp.float32)


NOT_A_FUNCTION = 42


def scale_between(x, factor, y):  # a static parameter between two dynamic ones
    return x * factor + y


def affine_v2(x, *, bias):  # affine changed: same signature, another program
    return (x + bias) * 2


def records_the_collector(x):
    """Writes the garbage collector's state when traced (to $AOT_TEST_GC_STATE): what
    the warm-up process left it in after its start-up."""
    import gc
    import json

    state = {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}
    with open(os.environ["AOT_TEST_GC_STATE"], "w") as f:
        json.dump(state, f)
    return x + 1
