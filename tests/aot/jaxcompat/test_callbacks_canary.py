"""The canary of aot/jaxcompat/callbacks.py: the closures JAX builds while lowering a
``pure_callback`` still lead to the user's function, its argument structure and result
avals, in the order of the callback indices, and jaxlib still loads a serialized
executable with host callbacks bound to those indices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aot.jaxcompat.build import serialize_compiled
from aot.jaxcompat.callbacks import deserialize_with_callbacks, lowered_callbacks
from aot.jaxcompat.shardings import single_device_sharding

# Runs on every supported JAX release (.ci/version-suite.sh).
pytestmark = pytest.mark.version_suite


def first(x):
    return np.asarray(x) + 1


def second(x, y):
    return (np.asarray(x) * np.asarray(y["k"]),)


def program(x):
    a = jax.pure_callback(first, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    (b,) = jax.pure_callback(second, (jax.ShapeDtypeStruct(x.shape, x.dtype),), a, {"k": x})
    return b


def test_lowered_callbacks_name_each_function_in_index_order() -> None:
    lowered = jax.jit(program).lower(jax.ShapeDtypeStruct((3,), jnp.float32))
    found = lowered_callbacks(lowered)
    assert [cb.function for cb in found] == [first, second]
    assert [cb.in_tree.num_leaves for cb in found] == [1, 2]
    assert [[tuple(a.shape) for a in cb.result_avals] for cb in found] == [[(3,)], [(3,)]]


def test_an_executable_loads_with_other_callbacks_bound_to_its_indices() -> None:
    compiled = jax.jit(program).lower(jax.ShapeDtypeStruct((3,), jnp.float32)).compile()
    data = serialize_compiled(compiled)
    device = jax.devices()[0]
    devices = single_device_sharding(device)._internal_device_list
    seen = []

    def minus(x):
        seen.append("minus")
        return (np.asarray(x) - 1,)

    def times(x, k):
        seen.append("times")
        return (np.asarray(x) * 10 * np.asarray(k),)

    exe = deserialize_with_callbacks(device.client, data, devices, [minus, times])
    out = exe.execute_sharded([jax.device_put(np.array([1, 2, 3], np.float32), device)])
    (result,) = out.disassemble_into_single_device_arrays()[0]
    np.testing.assert_array_equal(np.asarray(result), np.array([0, 20, 60], np.float32))
    assert seen == ["minus", "times"]
