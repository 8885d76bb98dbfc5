"""fnmatch globs as SQL LIKE patterns: the database narrows, fnmatch decides."""

from __future__ import annotations

__all__ = ["glob_to_like", "like_escape"]


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
