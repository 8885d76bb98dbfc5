"""Static arguments as part of an entry's identity: ``act='relu'``.

A static argument is recorded by its parameter (position and name, as ``jax.jit``
binds it) and a canonical text of its value, which is what the signature shows
(``f32[8,784], act='relu'``) and what a call's static is matched against when served.

Canonical texts: ``None``, ``bool``, ``int``, ``float``, ``complex`` and ``str`` are
their ``repr`` (``'relu'``, ``3``, ``0.5``, ``True``); a plain tuple is the tuple of its
items' texts; an ``enum.Enum`` member is ``Type.MEMBER``; any other hashable value is
its ``repr`` when that names its value. Refused (:class:`UnsupportedComputationError`
at lowering time): unhashable values (``jax.jit`` refuses them too), a ``repr`` that
names a memory address (``<function f at 0x...>``: not the same in another process),
and texts longer than :data:`MAX_TEXT`. Values match by their text: ``1``, ``1.0``
and ``True`` are three values.

No JAX import: the artifact format and the serving path use it.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aot.errors import CorruptArtifactError, UnsupportedComputationError

__all__ = ["MAX_TEXT", "StaticArg", "canonical_text", "describe_statics", "statics_from_json"]

#: The longest static text recorded (the signature column shows it).
MAX_TEXT = 200
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_PLAIN = (type(None), bool, int, float, complex, str)


def canonical_text(value: Any) -> str | None:
    """The canonical text of a static value, or None when it has none (module docstring)."""
    kind = type(value)
    if kind in _PLAIN:
        text = repr(value)
    elif kind is tuple:
        items = [canonical_text(v) for v in value]
        if any(t is None for t in items):
            return None
        text = "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"  # type: ignore[arg-type]
    elif isinstance(value, enum.Enum):
        text = f"{kind.__name__}.{value.name}"
    else:
        try:
            hash(value)
        except TypeError:
            return None
        text = repr(value)
        if _ADDRESS.search(text):
            return None
    return text if len(text) <= MAX_TEXT else None


@dataclass(frozen=True, slots=True)
class StaticArg:
    """One static argument of an entry: its positional index among the function's
    parameters (None: keyword-only), its name (None: unknown), its canonical text."""

    index: int | None
    name: str | None
    text: str

    @property
    def label(self) -> str:
        return self.name if self.name is not None else f"args[{self.index}]"

    def describe(self) -> str:
        """``act='relu'``."""
        return f"{self.label}={self.text}"

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "repr": self.text}

    @classmethod
    def of(cls, index: int | None, name: str | None, value: Any, *, where: str = "") -> StaticArg:
        """Records ``value``, or refuses it with what to pass instead."""
        text = canonical_text(value)
        if text is None:
            label = name if name is not None else f"args[{index}]"
            shown = repr(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise UnsupportedComputationError(
                f"{where + ': ' if where else ''}static argument {label}={shown} has no stable text "
                f"to record (unhashable, longer than {MAX_TEXT} characters, or a repr that names a "
                "memory address); a served entry is selected by its statics' text. Pass a str, "
                "int, float, bool, None, tuple of them or an enum member, or give "
                f"{type(value).__qualname__} a __repr__ that depends on its value only"
            )
        return cls(index, name, text)


def sort_statics(statics: Iterable[StaticArg]) -> tuple[StaticArg, ...]:
    """Positional statics by position, then keyword-only ones by name."""
    return tuple(sorted(statics, key=lambda s: (s.index is None, s.index or 0, s.name or "")))


def describe_statics(statics: Iterable[StaticArg]) -> str:
    """``act='relu', n=3`` (empty without statics)."""
    return ", ".join(s.describe() for s in statics)


def with_statics(avals: str, statics: Iterable[StaticArg]) -> str:
    """A signature: the avals, then the statics (``f32[8,784], act='relu'``)."""
    text = describe_statics(statics)
    if not text:
        return avals
    return f"{avals}, {text}" if avals else text


def statics_from_json(data: Any) -> tuple[StaticArg, ...]:
    """A manifest's ``statics`` list (absent: no statics); malformed is corruption."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise CorruptArtifactError(f"manifest statics is not a list: {str(data)[:60]!r}")
    out = []
    for item in data:
        if not isinstance(item, Mapping) or set(item) != {"index", "name", "repr"}:
            raise CorruptArtifactError(f"manifest has a malformed static: {str(item)[:80]!r}")
        index, name, text = item["index"], item["name"], item["repr"]
        if (
            not (index is None or (type(index) is int and index >= 0))
            or not (name is None or isinstance(name, str))
            or not isinstance(text, str) or len(text) > MAX_TEXT
            or (index is None and name is None)
        ):
            raise CorruptArtifactError(f"manifest has a malformed static: {str(item)[:80]!r}")
        out.append(StaticArg(index, name, text))
    return tuple(out)


def statics_of_manifest_json(text: str | bytes) -> tuple[StaticArg, ...]:
    """The statics of an index row's manifest JSON, read without checking the rest
    (the loader checks it when it files the row); unreadable: none."""
    if isinstance(text, str) and '"statics"' not in text and "\\u" not in text:
        # No such key, not even an escaped one: nothing to parse (aot.load reads this
        # for every row of a name at start-up).
        return ()
    import json

    try:
        data = json.loads(text)
        return statics_from_json(data.get("statics") if isinstance(data, dict) else None)
    except (ValueError, UnicodeDecodeError, RecursionError, CorruptArtifactError):
        return ()
