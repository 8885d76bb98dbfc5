"""The one rule for entry names, checked on every path before any blob is written.

put, compile, warmup, recompile write-back, bundle import and export all go through
:func:`check_name`, so SQLite and PostgreSQL hold the same names and nothing is
refused by a database after its blobs were stored.
"""

from __future__ import annotations

import unicodedata

from aot.errors import CacheError

__all__ = ["NAME_MAX", "InvalidNameError", "check_name", "name_problem"]

#: Characters, as the index's ``name`` columns hold them (``VARCHAR(512)``).
NAME_MAX = 512


class InvalidNameError(CacheError, ValueError):
    """An entry name breaks the rule of :func:`check_name`."""


def name_problem(name: object) -> str | None:
    """What is wrong with ``name``, or None if it may be stored."""
    if not isinstance(name, str):
        return f"a name must be a string, not {type(name).__name__}"
    if not name:
        return "the name is empty"
    if len(name) > NAME_MAX:
        return f"the name has {len(name)} characters; at most {NAME_MAX} are allowed"
    for i, ch in enumerate(name):
        category = unicodedata.category(ch)
        if category == "Cc":
            return f"the name holds the control character {ch!r} at position {i}"
        if category == "Cs":
            return f"the name holds a lone surrogate {ch!r} at position {i} (not valid Unicode text)"
    return None


def check_name(name: object) -> str:
    """``name`` if it may be stored, else :class:`InvalidNameError` saying why."""
    problem = name_problem(name)
    if problem is not None:
        shown = repr(name[:80]) + ("..." if len(name) > 80 else "") if isinstance(name, str) else repr(name)
        raise InvalidNameError(
            f"cannot store an entry named {shown}: {problem}; use 1-{NAME_MAX} printable "
            f"characters (e.g. 'model.forward'), set with name=... or the manifest's `name`"
        )
    return name  # type: ignore[return-value]
