"""Closed-over constants that JAX hoisted out of a program into arguments.

JAX >= 0.11 (and 0.10 with ``jax_use_simplified_jaxpr_constants``) no longer embeds a
large array a function closes over (a position table, a mask, a vocabulary) in the
program: it passes it as an extra leading argument of the executable. The values are
then part of the artifact, not of its StableHLO, so:

- they are stored as one content-addressed blob per entry (role ``constants``): each
  array's raw C-order bytes (NumPy's, native byte order) one after the other, with
  their dtype names, shapes, offsets and sizes in the manifest's ``constants`` list
  (no pickle); the blob's sha256 is verified on read like any other blob;
- the program fingerprint gets a ``constants`` part (the blob's digest and the
  avals), so two closures over different values are two entries;
- the loader puts them on the executable's devices once (``jax.device_put`` onto the
  compiled shardings) and every call passes those same arrays.

Pure data here (NumPy only); what JAX keeps private is read in :mod:`aot.jaxcompat.build`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where constants are packed or unpacked: listings never need it
    import numpy as np

from aot.fingerprint import canonical_json, sha256_hex

#: The blob role of an entry's constants (:data:`aot.artifact.ROLES`).
CONSTANTS = "constants"
#: The program fingerprint's part that pins them.
PART = "constants"


@dataclass(frozen=True, slots=True)
class Constant:
    """One hoisted constant as a manifest records it: where its bytes sit in the
    constants blob, what they are, and how the executable expects it placed."""

    dtype: str
    shape: tuple[int, ...]
    offset: int
    size: int
    sharding: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype, "shape": list(self.shape), "offset": self.offset,
            "size": self.size, "sharding": dict(self.sharding),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Constant:
        if not isinstance(data, dict) or not isinstance(data.get("sharding"), dict):
            raise TypeError(f"expected a constant object, got {str(data)[:60]!r}")
        shape = data["shape"]
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"constant shape {str(shape)[:40]} is not a list of sizes")
        return cls(
            str(data["dtype"]), tuple(shape), _count(data["offset"]), _count(data["size"]),
            dict(data["sharding"]),
        )

    def aval_text(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


def _count(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"{value!r} is not a byte count")
    return value


def pack(values: Sequence[Any], dtypes: Sequence[Any]) -> tuple[bytes, list[tuple[str, tuple[int, ...], int, int]]]:
    """The constants blob of ``values`` (NumPy or JAX arrays) as the executable takes
    them (``dtypes``: its parameters', so a float64 NumPy array under x64 off is stored
    as the float32 JAX passes) and, per value, its (dtype name, shape, offset, size).
    A typed PRNG key array has no raw bytes of its own and is refused (``TypeError``)."""
    import numpy as np

    chunks: list[bytes] = []
    layout = []
    offset = 0
    for value, dtype in zip(values, dtypes, strict=True):
        array = np.ascontiguousarray(np.asarray(value, dtype=dtype))
        if array.dtype.kind not in "biufcV" or array.dtype.hasobject:
            raise TypeError(f"a constant of dtype {array.dtype} has no raw bytes to store")
        data = array.tobytes()
        layout.append((array.dtype.name, tuple(int(d) for d in array.shape), offset, len(data)))
        chunks.append(data)
        offset += len(data)
    return b"".join(chunks), layout


def fingerprint_part(digest: str, avals: Sequence[str]) -> str:
    """The program fingerprint's ``constants`` part: the blob's digest and the avals."""
    return canonical_json({"blob": digest, "avals": list(avals)})


def lowered_part(values: Sequence[Any], dtypes: Sequence[Any]) -> str:
    """:func:`fingerprint_part` of constants about to be compiled."""
    blob, layout = pack(values, dtypes)
    return fingerprint_part(sha256_hex(blob), [f"{d}[{','.join(map(str, s))}]" for d, s, _, _ in layout])


def unpack(blob: bytes | memoryview, constants: Sequence[Constant], parse_dtype: Any) -> list[np.ndarray]:
    """The arrays of a verified constants blob: views of its bytes, no copy
    (``parse_dtype``: the manifest's dtype names to dtypes, JAX's extended ones too)."""
    import numpy as np

    out = []
    for c in constants:
        dtype = np.dtype(parse_dtype(c.dtype))
        out.append(np.frombuffer(blob, dtype=dtype, count=math.prod(c.shape), offset=c.offset).reshape(c.shape))
    return out


def problems(constants: Sequence[Constant], blob_size: int | None, blob_digest: str | None,
             pinned: str | None, itemsize: Any, placement: Any) -> list[str]:
    """What in a manifest's constants contradicts its fingerprint and blob (empty:
    consistent). A manifest without constants whose fingerprint pins some is an entry
    recompiled from its portable HLO, where jax.export embedded them: consistent.
    ``itemsize(dtype name)``; ``placement(sharding, rank)``: what is wrong with where a
    sharding puts a constant (None: on the executable's devices)."""
    if not constants:
        return ["a constants blob without constants"] if blob_digest is not None else []
    if blob_digest is None or blob_size is None:
        return [f"{len(constants)} constants without a constants blob"]
    found: list[str] = []
    expected = fingerprint_part(blob_digest, [c.aval_text() for c in constants])
    if pinned != expected:
        found.append("constants (their blob digest or avals) != the program fingerprint's 'constants' part")
    offset = 0
    for i, c in enumerate(constants):
        try:
            size = math.prod(c.shape) * int(itemsize(c.dtype))
        except Exception as exc:  # noqa: BLE001 - reported as a problem
            found.append(f"constants[{i}] dtype {c.dtype[:40]!r}: {exc}")
            continue
        where = placement(c.sharding, len(c.shape))
        if where is not None:
            found.append(f"constants[{i}].sharding: {where}")
        if c.offset != offset or c.size != size:
            found.append(f"constants[{i}] at {c.offset} with {c.size} bytes, expected {offset} with {size}")
        offset = c.offset + c.size
    if offset != blob_size:
        found.append(f"constants take {offset} bytes, the constants blob has {blob_size}")
    return found
