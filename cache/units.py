"""Sizes and ages as people write them: ``10G``, ``500M``; ``30d``, ``12h``, ``15min``.

Age units are unambiguous: ``s``, ``min``, ``h``, ``d``, ``w``, ``mo`` (30 days), and
their long forms (``seconds``, ``minutes``, ``hours``, ``days``, ``weeks``,
``months``). A bare ``m`` is refused, because it reads as minutes to some and months to
others: the message offers both spellings.
"""

from __future__ import annotations

import datetime as _dt
import re

from aot.errors import CacheError

__all__ = ["AGE_UNITS", "MAX_AGE_DAYS", "human_size", "parse_age", "parse_size"]

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}

_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")
_DAY = 86400
#: Accepted age units (lower case) and their length in seconds.
AGE_UNITS: dict[str, int] = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), _DAY),
    **dict.fromkeys(("w", "wk", "wks", "week", "weeks"), 7 * _DAY),
    **dict.fromkeys(("mo", "mon", "month", "months"), 30 * _DAY),
}
_AGE_EXAMPLES = "45s, 15min, 12h, 30d, 2w or 1mo (30 days)"
#: The largest age accepted (100 years): older than that is older than any entry, and
#: far larger ages overflow a timedelta or the date ``now - age``.
MAX_AGE_DAYS = 36500


def parse_size(value: int | str | None) -> int | None:
    """``"10G"`` -> bytes (binary units: K = 1024); ints pass through."""
    if value is None or isinstance(value, int):
        return value
    match = _SIZE_RE.match(value)
    if match is None:
        raise CacheError(f"cannot read size {value!r}; expected e.g. 500M, 10G or a byte count")
    number, unit, _ = match.groups()
    return int(float(number) * _SIZE_UNITS[unit.upper()])


def parse_age(value: _dt.timedelta | str | None) -> _dt.timedelta | None:
    """``"30d"`` -> a timedelta; timedeltas pass through. Refuses ``m`` (minutes or
    months?) and unknown units, saying what to write instead."""
    if value is None or isinstance(value, _dt.timedelta):
        return value
    match = _AGE_RE.match(value)
    if match is None:
        raise CacheError(f"cannot read age {value!r}; expected e.g. {_AGE_EXAMPLES}")
    number, unit = match.group(1), match.group(2).lower()
    if unit == "m":
        raise CacheError(
            f"age {value!r} is ambiguous: 'm' could mean minutes or months; write "
            f"{number}min for {number} minute(s) or {number}mo for {number} x 30 days"
        )
    seconds = AGE_UNITS.get(unit)
    if seconds is None:
        raise CacheError(
            f"cannot read age {value!r}: unknown unit {match.group(2)!r}; expected e.g. {_AGE_EXAMPLES}"
        )
    total = float(number) * seconds
    if total > MAX_AGE_DAYS * _DAY:
        raise CacheError(
            f"age {value!r} is too large: the largest accepted age is {MAX_AGE_DAYS}d (100 years); "
            f"write an age up to {MAX_AGE_DAYS}d (every entry is younger than that)"
        )
    return _dt.timedelta(seconds=total)


def human_size(n: int) -> str:
    """``23456`` -> ``"22.9 KiB"``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


_PLURALS = {"leaf": "leaves"}


def plural(word: str) -> str:
    """The plural of ``word``, or of a phrase's last word: ``entry`` -> ``entries``,
    ``miss`` -> ``misses``, ``leaf`` -> ``leaves``, ``stored entry`` -> ``stored entries``."""
    head, _, last = word.rpartition(" ")
    if last in _PLURALS:
        last = _PLURALS[last]
    elif last.endswith("y") and last[-2:-1] not in ("a", "e", "o", "u", ""):
        last = last[:-1] + "ies"
    elif last.endswith(("s", "x", "ch", "sh")):
        last += "es"
    else:
        last += "s"
    return f"{head} {last}" if head else last


def counted(n: int, word: str) -> str:
    """``counted(1, "entry")`` -> ``"1 entry"``; ``counted(2, "entry")`` -> ``"2 entries"``:
    the one helper for a count and its noun."""
    return f"{n} {word if n == 1 else plural(word)}"
