"""Short dtype names (``f32``, ``bf16``, ``key<fry>``) without JAX.

A leaf module: listings (``aot ls``, ``show``), the artifact format's signature check
and the serving path's dtype checks read these names, and none of them may import JAX
or the modules of other features to do so.
"""

from __future__ import annotations

import re

__all__ = ["SHORT_DTYPES", "short_dtype"]

# The manifest's dtype name -> the short name of a spec string, for every dtype
# aot.specs offers (tests/aot/test_signatures.py checks the two agree): listings show
# signatures without importing JAX (issue 43: `aot ls` took 1 s for one bf16 input).
SHORT_DTYPES = {
    "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
    "bool": "bool", "pred": "bool", "complex64": "c64", "complex128": "c128",
    "int2": "i2", "int4": "i4", "uint2": "u2", "uint4": "u4",
    "float8_e3m4": "f8e3m4", "float8_e4m3": "f8e4m3", "float8_e4m3b11fnuz": "f8e4m3b11fnuz",
    "float8_e4m3fn": "f8e4m3fn", "float8_e4m3fnuz": "f8e4m3fnuz", "float8_e5m2": "f8e5m2",
    "float8_e5m2fnuz": "f8e5m2fnuz", "float8_e8m0fnu": "f8e8m0fnu", "float4_e2m1fn": "f4e2m1fn",
}
# A typed PRNG key's name is its own short name (``key<fry>``, as JAX prints it).
_KEY_DTYPE = re.compile(r"^key<[A-Za-z0-9_]+>$")


def short_dtype(name: str) -> str:
    """``"float32"`` -> ``"f32"``, ``"key<fry>"`` -> ``"key<fry>"``, without JAX; a
    short name is returned as it is. Raises ``ValueError`` for a name no JAX dtype has
    (the signature then falls back to the index's flat text)."""
    name = name.strip()
    short = SHORT_DTYPES.get(name)
    if short is not None:
        return short
    if name in SHORT_DTYPES.values() or _KEY_DTYPE.match(name):
        return name
    raise ValueError(f"unknown dtype {name!r}")
