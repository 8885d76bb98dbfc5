"""Extended dtypes (typed PRNG keys): ``jax._src.dtypes.ExtendedDType`` and
``jax._src.random.prng``.

A manifest names a typed-key dtype (``key<fry>``); a serving process must turn the
name back into the dtype without tracing, which only JAX's private registry of PRNG
implementations allows.
"""

from __future__ import annotations

from typing import Any

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
