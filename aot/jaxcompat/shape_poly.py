"""Symbolic dimensions: ``jax._src.export.shape_poly``.

``jax.export`` publishes symbolic shapes (``jax.export.symbolic_shape``) but not
testing whether a value is a dimension expression, solving dimension variables from
concrete shapes, nor evaluating expressions: a serving process binding a caller's
shapes to a stored symbolic signature needs all three.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax._src import core
from jax._src.export import shape_poly

#: What JAX raises for a comparison or division of symbolic dimensions it cannot decide.
#: Release difference "InconclusiveDimensionOperation": public as
#: ``jax.errors.InconclusiveDimensionOperation`` from JAX 0.10; 0.9.x has only
#: ``jax._src.core``'s (whose subclass ``shape_poly`` raises).
INCONCLUSIVE_DIMENSION: type[Exception] = (
    getattr(jax.errors, "InconclusiveDimensionOperation", None) or core.InconclusiveDimensionOperation
)


def is_symbolic_dim(dim: Any) -> bool:
    """True for a ``jax.export`` dimension expression."""
    return bool(shape_poly.is_symbolic_dim(dim))


def solve_dim_vars(avals: Sequence[Any], in_tree: Any) -> tuple[Any, Any, Any]:
    """``(solution, shape_constraints, synthetic_args)`` for the dimension variables
    of ``avals`` (as ``jax.export`` solves them when calling an exported program)."""
    return shape_poly.solve_dim_vars(tuple(avals), in_tree)


def all_dim_vars(avals: Sequence[Any]) -> tuple[str, ...]:
    """The names of the dimension variables in ``avals``."""
    return tuple(shape_poly.all_dim_vars(tuple(avals)))


def shape_evaluator(env: Mapping[str, int]) -> Any:
    """An evaluator of dimension expressions (``.evaluate(dim)``) under ``env``."""
    values: dict[str, Any] = dict(env)  # JAX annotates the values as arrays; ints evaluate too
    return shape_poly.ShapeEvaluator(values)
