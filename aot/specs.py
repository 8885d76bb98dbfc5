"""Spec strings and spec pytrees -> ``jax.ShapeDtypeStruct``; input signatures.

Grammar of a spec string::

    SPEC     := ["~"] DTYPE "[" [DIM ("," DIM)*] "]" ["@" SHARDING]
    DTYPE    := f16 | bf16 | f32 | f64 | i8 | i16 | i32 | i64 | u8 | u16 | u32 | u64
              | bool | c64 | c128 | i2 | i4 | u2 | u4 | f8e4m3fn | f8e5m2 | ...
              | f4e2m1fn | key<fry> | key<rbg> | ...
                                           (numpy names such as float32 work too)
    DIM      := a non-negative integer, or a symbolic dimension expression in
                jax.export's syntax: an identifier ("b") or an expression of
                identifiers and integers ("2*b", "b+1", "max(a, b)")
    SHARDING := ENTRY ("," ENTRY)*         one entry per dimension, or fewer
    ENTRY    := "None" | "_" | AXIS ("+" AXIS)*

``"f32[]"`` is a scalar; ``"~f32[]"`` a weakly typed one (what a Python ``float``
argument is under ``jax.jit``); ``"key<fry>[2]"`` two typed PRNG keys (what
``jax.random.split(jax.random.key(0))`` is); ``"f32[b,784]"`` has a symbolic first
dimension (every symbolic dimension parsed from a spec string shares one
``jax.export`` scope); ``"f32[8,128]@data,None"`` shards the first dimension over the
mesh axis ``data`` (a mesh is needed to turn that into a sharding).

Dtypes are never changed behind the user's back: a spec that names a 64-bit dtype
while ``jax_enable_x64`` is off is refused (``jax.jit`` would silently truncate it).
Arrays and Python scalars given as examples follow ``jax.jit``'s own canonicalization
(a NumPy ``float64`` array is an ``f32`` input with x64 off, a Python ``float`` is a
weakly typed ``f32[]``).
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from aot.errors import SpecError
from aot.jaxcompat.dtypes import available_dtypes

# Short name -> attribute of jax.numpy. Only the dtypes this jax has are offered (a
# jaxlib without float8_e8m0fnu simply does not know "f8e8m0fnu").
_DTYPE_ATTRS = {
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "bool": "bool_",
    "c64": "complex64",
    "c128": "complex128",
    "i2": "int2",
    "i4": "int4",
    "u2": "uint2",
    "u4": "uint4",
    "f8e3m4": "float8_e3m4",
    "f8e4m3": "float8_e4m3",
    "f8e4m3b11fnuz": "float8_e4m3b11fnuz",
    "f8e4m3fn": "float8_e4m3fn",
    "f8e4m3fnuz": "float8_e4m3fnuz",
    "f8e5m2": "float8_e5m2",
    "f8e5m2fnuz": "float8_e5m2fnuz",
    "f8e8m0fnu": "float8_e8m0fnu",
    "f4e2m1fn": "float4_e2m1fn",
}
DTYPES: dict[str, np.dtype] = available_dtypes(_DTYPE_ATTRS)
_SHORT_NAMES = {dtype: short for short, dtype in DTYPES.items()}
_ALIASES = {dtype.name: dtype for dtype in DTYPES.values()} | {"pred": DTYPES["bool"]}
# Dtypes that exist only with jax_enable_x64 on (jax.jit truncates them otherwise).
X64_DTYPES = frozenset(
    np.dtype(t) for t in (np.float64, np.int64, np.uint64, np.complex128)
)
X64_ADVICE = (
    'expected a 32-bit dtype, or enable 64-bit mode first: jax.config.update("jax_enable_x64", '
    "True) (or JAX_ENABLE_X64=1; `x64 = true` in a warmup manifest, `--x64` on the command line)"
)

GRAMMAR = (
    "[~]DTYPE[DIM,...][@SHARDING], e.g. 'f32[8,128]', 'i32[]' (a scalar), "
    "'~f32[]' (weakly typed, like a Python float), 'key<fry>[2]' (PRNG keys), "
    "'bf16[8,128]@data,None'; DTYPE is one of "
)
GRAMMAR += ", ".join(DTYPES) + ", key<IMPL>"

# Compiled on first use (re's cache): a serving process reads dtype names, not specs.
_SPEC_PATTERN = r"^\s*(~)?\s*(key<[A-Za-z0-9_]+>|[A-Za-z][A-Za-z0-9_]*)\s*\[([^\]]*)\]\s*(?:@(.*))?$"
_KEY_PATTERN = r"^key<([A-Za-z0-9_]+)>$"
_AXIS_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
_PY_SCALARS = (bool, int, float, complex)


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


@functools.cache
def _key_dtypes() -> dict[str, Any]:
    """``"key<fry>"`` -> the typed-key dtype, for every PRNG implementation JAX has.

    Built from JAX's registry of implementations without tracing anything (a serving
    process reading a manifest must not trace); through ``jax.eval_shape`` otherwise.
    """
    out: dict[str, Any] = {}
    try:
        from aot.jaxcompat.dtypes import prng_key_dtypes

        return prng_key_dtypes()
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - other jax layouts
        pass
    for name in ("threefry2x32", "rbg", "unsafe_rbg"):
        try:
            dtype = jax.eval_shape(functools.partial(jax.random.key, 0, impl=name)).dtype
        except Exception:  # noqa: BLE001 - an implementation this build cannot make
            continue
        out[str(dtype)] = dtype
    return out


def is_key_dtype(dtype: Any) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def parse_dtype(text: str) -> Any:
    """``"f32"``, ``"float32"`` or ``"key<fry>"`` -> the dtype (numpy or typed key)."""
    key = text.strip()
    dtype = DTYPES.get(key) or _ALIASES.get(key)
    if dtype is not None:
        return dtype
    if re.match(_KEY_PATTERN, key):
        found = _key_dtypes().get(key)
        if found is not None:
            return found
        raise SpecError(
            f"unknown PRNG key type {text!r}; this jax has {', '.join(sorted(_key_dtypes()))}"
        )
    raise SpecError(f"{_unknown_dtype(text)}; expected one of {', '.join(DTYPES)} or key<IMPL>")


def dtype_to_str(dtype: Any) -> str:
    """The name a manifest records: numpy's (``"int4"``) or JAX's (``"key<fry>"``)."""
    if is_key_dtype(dtype):
        return str(dtype)
    return np.dtype(dtype).name


def dtype_name(dtype: Any) -> str:
    """``np.dtype('float32')`` -> ``"f32"`` (the short name used in spec strings)."""
    if is_key_dtype(dtype):
        return str(dtype)
    dtype = np.dtype(dtype)
    return _SHORT_NAMES.get(dtype, dtype.name)


def format_aval(shape: Sequence[Any], dtype: Any, weak_type: bool = False) -> str:
    """``((8, 128), float32)`` -> ``"f32[8,128]"``; weakly typed: ``"~f32[]"``."""
    dims = ",".join(str(d) if type(d) is int else _format_dim(d) for d in shape)
    return f"{'~' if weak_type else ''}{dtype_name(dtype)}[{dims}]"


def _format_dim(dim: Any) -> str:
    # aot.symbolic only for what is not a plain int: serving never needs it.
    from aot.symbolic import format_dim

    return format_dim(dim)


def check_x64(dtype: Any, what: str) -> None:
    """Refuses a 64-bit dtype the user named while x64 is off (never truncated)."""
    if not is_key_dtype(dtype) and np.dtype(dtype) in X64_DTYPES and not getattr(jax.config, "jax_enable_x64"):
        raise SpecError(
            f"{what} names {np.dtype(dtype).name}, which needs 64-bit mode, and "
            f"jax_enable_x64 is off (jax.jit would silently use {jax.dtypes.canonicalize_dtype(dtype).name}); "
            + X64_ADVICE
        )


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
        if not all(re.match(_AXIS_PATTERN, axis) for axis in axes):
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
    from aot.symbolic import parse_dim, split_dims

    dims: list[Any] = []
    for raw in split_dims(dims_text):
        try:
            dims.append(parse_dim(raw, scope))
        except SpecError as exc:
            raise SpecError(f"malformed spec {text!r}: {exc}; expected {GRAMMAR}") from None
    return dims


def _bad_part(text: str) -> str:
    """Where a spec that does not parse goes wrong: what, and where (one line: CLI
    errors are one line)."""
    opening, closing = text.find("["), text.find("]")
    if not text.strip():
        return "it is empty"
    if opening < 0:
        column = re.match(r"\s*~?\s*[A-Za-z0-9_<>]*", text).end()  # type: ignore[union-attr]
        why = "no '[DIMS]' follows the dtype (a scalar is 'f32[]')"
    elif closing < 0:
        column, why = opening, "this '[' is never closed"
    elif closing < opening or not re.match(r"^\s*~?\s*[A-Za-z<>0-9_]+\s*$", text[:opening]):
        column, why = 0, "it does not start with a dtype"
    else:
        column = closing + 1
        column += len(text[column:]) - len(text[column:].lstrip())
        why = "only '@SHARDING' may follow ']'"
    return f"{why} (column {column + 1}: {text[:column]!r} >>> {text[column:]!r})"


def _parse_string(text: str, mesh: Mesh | None, scope: Any = None) -> jax.ShapeDtypeStruct:
    match = re.match(_SPEC_PATTERN, text)
    if match is None:
        raise SpecError(f"malformed spec {text!r}: {_bad_part(text)}; expected {GRAMMAR}")
    weak, dtype_text, dims_text, sharding_text = match.groups()
    dtype = DTYPES.get(dtype_text) or _ALIASES.get(dtype_text)
    if dtype is None and re.match(_KEY_PATTERN, dtype_text):
        try:
            dtype = parse_dtype(dtype_text)
        except SpecError as exc:
            raise SpecError(f"malformed spec {text!r}: {exc}; expected {GRAMMAR}") from None
    if dtype is None:  # GRAMMAR ends with the dtype list: say it once
        raise SpecError(f"malformed spec {text!r}: {_unknown_dtype(dtype_text)}; expected {GRAMMAR}")
    check_x64(dtype, f"spec {text!r}")
    if weak and (is_key_dtype(dtype) or np.dtype(dtype) == np.bool_):
        raise SpecError(
            f"malformed spec {text!r}: only numeric dtypes can be weakly typed ('~'); "
            f"expected {GRAMMAR}"
        )
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
    return jax.ShapeDtypeStruct(tuple(dims), dtype, sharding=sharding, weak_type=bool(weak))


def _axes_of(pspec: PartitionSpec) -> Iterable[str]:
    for entry in pspec:
        if entry is None:
            continue
        yield from (entry if isinstance(entry, tuple) else (entry,))


def _is_spec_leaf(x: Any) -> bool:
    if isinstance(x, (str, jax.ShapeDtypeStruct, jax.Array, np.ndarray, np.generic, *_PY_SCALARS)):
        return True
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        # Array-like, unless it is a registered pytree node (Flax NNX variables have
        # .shape and .dtype but are nodes whose child is the array).
        return jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x))
    return False


def _to_struct(x: Any, mesh: Mesh | None, scope: Any = None) -> Any:
    if isinstance(x, str):
        return _parse_string(x, mesh, scope)
    if isinstance(x, jax.ShapeDtypeStruct):
        check_x64(x.dtype, f"ShapeDtypeStruct {x}")
        return x
    if isinstance(x, jax.Array):
        # A committed array pins its placement, as with jax.jit (an array explicitly
        # put on device 3 must compile for device 3); an uncommitted one does not.
        pinned = len(x.sharding.device_set) > 1 or getattr(x, "committed", False)
        sharding = x.sharding if pinned else None
        return jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=sharding, weak_type=bool(getattr(x, "weak_type", False))
        )
    if isinstance(x, (np.ndarray, np.generic, *_PY_SCALARS)):
        # Exactly what jax.jit makes of it: 64-bit NumPy dtypes follow x64, a Python
        # scalar is weakly typed.
        try:
            aval = jax.typeof(x)
        except (OverflowError, TypeError) as exc:  # 2**40 with x64 off: jax.jit refuses it too
            raise SpecError(
                f"cannot make a spec of {type(x).__name__} {_short_repr(x)}: {exc}; expected a "
                f"value of a JAX dtype ({GRAMMAR})"
            ) from None
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        try:
            dtype = jax.dtypes.canonicalize_dtype(x.dtype)
        except TypeError:
            dtype = x.dtype
        return jax.ShapeDtypeStruct(tuple(x.shape), dtype)
    raise SpecError(
        f"cannot make a spec of {type(x).__name__} {_short_repr(x)}; expected a spec string "
        f"({GRAMMAR}), a jax.ShapeDtypeStruct, an array, a Python scalar, or a pytree "
        "of those"
    )


def _short_repr(x: Any, limit: int = 80) -> str:
    try:
        text = repr(x)
    except Exception:  # noqa: BLE001 - a user object whose repr fails
        text = f"<{type(x).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


def leaf_aval(leaf: Any) -> tuple[tuple[int, ...], Any, bool]:
    """``(shape, dtype, weak_type)`` of a call argument, canonicalized as ``jax.jit``
    does (x64 off: a NumPy ``float64`` array is ``f32``; a Python float is ``~f32[]``).

    Raises ``TypeError`` for what ``jax.jit`` would refuse (a string, an object, a
    Python int too large for its dtype).
    """
    try:
        aval = jax.typeof(leaf)
    except OverflowError as exc:
        raise TypeError(str(exc)) from None
    return tuple(aval.shape), aval.dtype, bool(getattr(aval, "weak_type", False))


def leaf_signature(leaves: Iterable[Any]) -> str:
    """A canonical, human-readable signature of flat leaves: ``"f32[8,784], ~f32[]"``."""
    return ", ".join(format_aval(*leaf_aval(leaf)) for leaf in leaves)
