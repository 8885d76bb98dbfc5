"""fnmatch globs as SQL LIKE patterns: the database narrows, fnmatch decides."""

from __future__ import annotations

__all__ = ["glob_to_like", "like_escape", "name_range"]


def like_escape(text: str) -> str:
    """``text`` as a literal in a LIKE pattern whose escape character is ``\\``."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def glob_to_like(pattern: str) -> str:
    """Translate an fnmatch glob into a LIKE pattern (escape character ``\\``).

    ``*`` -> ``%``, ``?`` -> ``_``, a bracket class -> ``_`` (callers post-filter
    with :func:`fnmatch.fnmatchcase`), literal ``%``/``_``/``\\`` are escaped. Every
    name fnmatch matches, LIKE matches (a superset): a class is found exactly as
    :func:`fnmatch.translate` finds it (``]`` right after ``[`` or ``[!`` is a
    member, a ``[`` without a closing ``]`` is a literal), and each class and each
    ``?`` stands for exactly one character, as ``_`` does.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        i += 1
        if ch == "*":
            out.append("%")
        elif ch == "?":
            out.append("_")
        elif ch == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append(like_escape(ch))  # no closing bracket: a literal "["
            else:
                out.append("_")
                i = j + 1
        else:
            out.append(like_escape(ch))
    return "".join(out)


def name_range(pattern: str) -> tuple[str, str] | None:
    """``(low, high)``: every name ``pattern`` matches (:func:`fnmatch.fnmatchcase`)
    satisfies ``low <= name < high`` in code point order, i.e. under a binary collation
    (SQLite's default; not PostgreSQL's locale collations). None when the glob starts
    with a wildcard. A LIKE with an escape character never uses SQLite's index on the
    column; this range does (``aot ls NAME`` on a million rows: a search, not a scan)."""
    end = len(pattern)
    for i, ch in enumerate(pattern):
        if ch in "*?[":
            end = i
            break
    prefix = pattern[:end]
    while prefix and ord(prefix[-1]) == 0x10FFFF:
        prefix = prefix[:-1]  # no successor: the range is that of the shorter prefix
    if not prefix:
        return None
    low = pattern[:end]
    return low, prefix[:-1] + chr(ord(prefix[-1]) + 1)
