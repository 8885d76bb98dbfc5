"""Spec strings and spec pytrees -> ``jax.ShapeDtypeStruct``; input signatures.

Grammar of a spec string::

    SPEC     := DTYPE "[" [DIM ("," DIM)*] "]" ["@" SHARDING]
    DTYPE    := f16 | bf16 | f32 | f64 | i8 | i16 | i32 | i64 | u8 | u16 | u32 | u64
              | bool | c64 | c128          (numpy names such as float32 work too)
    DIM      := a non-negative integer, or a symbolic dimension expression in
                jax.export's syntax: an identifier ("b") or an expression of
                identifiers and integers ("2*b", "b+1", "max(a, b)")
    SHARDING := ENTRY ("," ENTRY)*         one entry per dimension, or fewer
    ENTRY    := "None" | "_" | AXIS ("+" AXIS)*

``"f32[]"`` is a scalar; ``"f32[b,784]"`` has a symbolic first dimension (every
symbolic dimension parsed from a spec string shares one ``jax.export`` scope); ``"f32[8,128]@data,None"`` shards the first dimension over
the mesh axis ``data`` (a mesh is needed to turn that into a sharding).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from aot.errors import SpecError
from aot.symbolic import format_dim, parse_dim, split_dims

GRAMMAR = (
    "DTYPE[DIM,...][@SHARDING], e.g. 'f32[8,128]', 'i32[]' (a scalar), "
    "'bf16[8,128]@data,None'; DTYPE is one of " 
)

DTYPES: dict[str, np.dtype] = {
    "f16": np.dtype("float16"),
    "bf16": np.dtype(jax.numpy.bfloat16),
    "f32": np.dtype("float32"),
    "f64": np.dtype("float64"),
    "i8": np.dtype("int8"),
    "i16": np.dtype("int16"),
    "i32": np.dtype("int32"),
    "i64": np.dtype("int64"),
    "u8": np.dtype("uint8"),
    "u16": np.dtype("uint16"),
    "u32": np.dtype("uint32"),
    "u64": np.dtype("uint64"),
    "bool": np.dtype("bool"),
    "c64": np.dtype("complex64"),
    "c128": np.dtype("complex128"),
}
_SHORT_NAMES = {dtype: short for short, dtype in DTYPES.items()}
_ALIASES = {dtype.name: dtype for dtype in DTYPES.values()} | {"pred": DTYPES["bool"]}
GRAMMAR += ", ".join(DTYPES)

_SPEC_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9]*)\s*\[([^\]]*)\]\s*(?:@(.*))?$")
_AXIS_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# Names people write for a dtype that is spelled otherwise here.
_SUGGESTIONS = {
    "fp16": "f16", "fp32": "f32", "fp64": "f64", "half": "f16", "float": "f32",
    "double": "f64", "int": "i32", "long": "i64", "uint": "u32", "bf": "bf16",
    "bfloat": "bf16", "boolean": "bool", "complex": "c64",
}


def _unknown_dtype(text: str) -> str:
    """``unknown dtype 'fp32' (did you mean f32?)``."""
    key = text.strip().lower()
    hint = key if key in DTYPES else _SUGGESTIONS.get(key)
    if hint is None:
        close = difflib.get_close_matches(key, list(DTYPES), n=1, cutoff=0.6)
        hint = close[0] if close else None
    return f"unknown dtype {text!r}" + (f" (did you mean {hint}?)" if hint else "")


def parse_dtype(text: str) -> np.dtype:
    """``"f32"`` or ``"float32"`` -> ``np.dtype('float32')``."""
    key = text.strip()
    dtype = DTYPES.get(key) or _ALIASES.get(key)
    if dtype is None:
        raise SpecError(f"{_unknown_dtype(text)}; expected one of {', '.join(DTYPES)}")
    return dtype


def dtype_name(dtype: Any) -> str:
    """``np.dtype('float32')`` -> ``"f32"`` (the short name used in spec strings)."""
    dtype = np.dtype(dtype)
    return _SHORT_NAMES.get(dtype, dtype.name)


def format_aval(shape: Sequence[int], dtype: Any) -> str:
    """``((8, 128), float32)`` -> ``"f32[8,128]"``."""
    return f"{dtype_name(dtype)}[{','.join(format_dim(d) for d in shape)}]"


def parse_partition_spec(text: str) -> PartitionSpec:
    """``"data,None"`` -> ``PartitionSpec('data', None)``; ``"data+model"`` -> a tuple entry."""
    entries: list[Any] = []
    stripped = text.strip()
    if stripped in ("", "()"):
        return PartitionSpec()
    for raw in stripped.strip("()").split(","):
        entry = raw.strip()
        if entry in ("None", "_", ""):
            entries.append(None)
            continue
        axes = [axis.strip().strip("'\"") for axis in entry.split("+")]
        if not all(_AXIS_RE.match(axis) for axis in axes):
            raise SpecError(
                f"malformed sharding {text!r}: entry {entry!r} is not an axis name, "
                "'a+b' or None; expected e.g. 'data,None'"
            )
        entries.append(axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*entries)


def _parse_dims(text: str, dims_text: str, scope: Any) -> list[Any]:
    """The dimensions of a spec: integers, or symbolic dimension expressions."""
    if dims_text.strip() == "":
        return []
    dims: list[Any] = []
    for raw in split_dims(dims_text):
        try:
            dims.append(parse_dim(raw, scope))
        except SpecError as exc:
            raise SpecError(f"malformed spec {text!r}: {exc}; expected {GRAMMAR}") from None
    return dims


def _parse_string(text: str, mesh: Mesh | None, scope: Any = None) -> jax.ShapeDtypeStruct:
    match = _SPEC_RE.match(text)
    if match is None:
        raise SpecError(f"malformed spec {text!r}; expected {GRAMMAR}")
    dtype_text, dims_text, sharding_text = match.groups()
    dtype = DTYPES.get(dtype_text) or _ALIASES.get(dtype_text)
    if dtype is None:  # GRAMMAR ends with the dtype list: say it once
        raise SpecError(f"malformed spec {text!r}: {_unknown_dtype(dtype_text)}; expected {GRAMMAR}")
    dims = _parse_dims(text, dims_text, scope)
    sharding = None
    if sharding_text is not None:
        if not sharding_text.strip():
            raise SpecError(
                f"malformed spec {text!r}: nothing follows '@'; expected {GRAMMAR}"
            )
        try:
            pspec = parse_partition_spec(sharding_text)
        except SpecError as exc:
            raise SpecError(f"malformed spec {text!r}: {exc}; expected {GRAMMAR}") from None
        if len(pspec) > len(dims):
            raise SpecError(
                f"malformed spec {text!r}: sharding has {len(pspec)} entries for "
                f"{len(dims)} dimensions; expected {GRAMMAR}"
            )
        if mesh is None:
            raise SpecError(
                f"spec {text!r} names a sharding but no mesh was given; pass mesh= "
                "(or --mesh on the command line)"
            )
        missing = [a for a in _axes_of(pspec) if a not in mesh.axis_names]
        if missing:
            raise SpecError(
                f"spec {text!r} names mesh axes {missing} that the mesh "
                f"{dict(mesh.shape)} does not have"
            )
        sharding = NamedSharding(mesh, pspec)
    return jax.ShapeDtypeStruct(tuple(dims), dtype, sharding=sharding)


def _axes_of(pspec: PartitionSpec) -> Iterable[str]:
    for entry in pspec:
        if entry is None:
            continue
        yield from (entry if isinstance(entry, tuple) else (entry,))


def _is_spec_leaf(x: Any) -> bool:
    return isinstance(x, (str, jax.ShapeDtypeStruct)) or (
        hasattr(x, "shape") and hasattr(x, "dtype")
    )


def _to_struct(x: Any, mesh: Mesh | None, scope: Any = None) -> Any:
    if isinstance(x, str):
        return _parse_string(x, mesh, scope)
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if isinstance(x, jax.Array):
        # A committed array pins its placement, as with jax.jit (an array explicitly
        # put on device 3 must compile for device 3); an uncommitted one does not.
        pinned = len(x.sharding.device_set) > 1 or getattr(x, "committed", False)
        sharding = x.sharding if pinned else None
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.ShapeDtypeStruct(tuple(x.shape), np.dtype(x.dtype))
    if isinstance(x, (bool, int, float, complex)):
        return jax.ShapeDtypeStruct((), jax.dtypes.canonicalize_dtype(type(x)))
    raise SpecError(
        f"cannot make a spec of {type(x).__name__} {x!r}; expected a spec string "
        f"({GRAMMAR}), a jax.ShapeDtypeStruct, an array, or a pytree of those"
    )


def spec(x: Any, *, mesh: Mesh | None = None, constraints: Sequence[str] = ()) -> Any:
    """Turns a spec string, array, ``ShapeDtypeStruct`` or pytree of them into structs.

    >>> spec("f32[8,128]")
    ShapeDtypeStruct(shape=(8, 128), dtype=float32)

    A dimension may be symbolic (``"f32[b,784]"``, ``"i32[2*b]"``): the struct then
    has ``jax.export`` dimension expressions, and a program lowered against it is
    stored once as shape-polymorphic portable HLO (see docs/symbolic.md).
    ``constraints`` (``["b <= 512"]``, jax.export's syntax) bound its variables.
    """
    scope = None
    if constraints:
        if isinstance(constraints, str):
            constraints = [constraints]
        try:
            scope = jax.export.SymbolicScope(tuple(constraints))
        except Exception as exc:  # noqa: BLE001 - jax raises ValueError and others
            raise SpecError(f"malformed symbolic constraints {list(constraints)!r}: {exc}") from None
    return jax.tree_util.tree_map(
        lambda leaf: _to_struct(leaf, mesh, scope), x, is_leaf=_is_spec_leaf
    )


def leaf_signature(leaves: Iterable[Any]) -> str:
    """A canonical, human-readable signature of flat leaves: ``"f32[8,784], i32[]"``."""
    return ", ".join(format_aval(np.shape(leaf), _leaf_dtype(leaf)) for leaf in leaves)


def _leaf_dtype(leaf: Any) -> np.dtype:
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None:
        return np.dtype(dtype)
    return np.dtype(jax.dtypes.canonicalize_dtype(type(leaf)))
