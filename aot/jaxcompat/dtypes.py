"""Extended dtypes (typed PRNG keys): ``jax._src.dtypes.ExtendedDType`` and
``jax._src.random.prng``; which narrow dtypes this JAX has.

A manifest names a typed-key dtype (``key<fry>``); a serving process must turn the
name back into the dtype without tracing, which only JAX's private registry of PRNG
implementations allows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

try:
    from jax._src.dtypes import ExtendedDType
except ImportError:  # pragma: no cover - another jax layout: typed keys by name

    class ExtendedDType:  # type: ignore[no-redef]
        """Stands for JAX's class where it cannot be imported: matches nothing."""


def prng_key_dtypes() -> dict[str, Any]:
    """``"key<fry>"`` -> the typed-key dtype, for every PRNG implementation JAX has;
    raises ``ImportError`` or ``AttributeError`` on another jax layout."""
    from jax._src.random import prng

    out: dict[str, Any] = {}
    for impl in prng.prngs.values():
        dtype = prng.KeyTy(impl)
        out[str(dtype)] = dtype
    return out


def available_dtypes(names: Mapping[str, str]) -> dict[str, np.dtype]:
    """``{short name: dtype}`` for each ``{short name: jax.numpy attribute}`` this JAX
    has: the narrow float and int types (``float8_e8m0fnu``, ``int2``, ...) come with
    jaxlib and ml_dtypes releases, and a spec names only those this one knows."""
    import jax.numpy as jnp

    found = {short: getattr(jnp, attr, None) for short, attr in names.items()}
    return {short: np.dtype(dtype) for short, dtype in found.items() if dtype is not None}
