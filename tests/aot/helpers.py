"""Helpers shared by the tests of the core (imported by name: tests/aot is on sys.path)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def block(tree: Any) -> Any:
    """Waits for every array of ``tree`` (collectives on virtual CPU devices need it)."""
    return jax.block_until_ready(tree)


def assert_bitwise_equal(actual: Any, expected: Any) -> None:
    """Same pytree structure, and every leaf has the same shape, dtype and bytes."""
    actual, expected = block(actual), block(expected)
    actual_leaves, actual_tree = jax.tree_util.tree_flatten(actual)
    expected_leaves, expected_tree = jax.tree_util.tree_flatten(expected)
    assert actual_tree == expected_tree, f"structure {actual_tree} != {expected_tree}"
    for i, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
        a, e = np.asarray(a), np.asarray(e)
        assert a.dtype == e.dtype, f"leaf {i}: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"leaf {i}: shape {a.shape} != {e.shape}"
        np.testing.assert_array_equal(a, e, err_msg=f"leaf {i}")
        assert a.tobytes() == e.tobytes(), f"leaf {i}: equal values but different bits"
