"""Sizes and ages as people write them (aot.cache.units): unambiguous age units."""

from __future__ import annotations

import datetime as dt

import pytest

from aot.errors import CacheError
from aot.cache.units import parse_age, parse_size

MINUTE, HOUR, DAY = dt.timedelta(minutes=1), dt.timedelta(hours=1), dt.timedelta(days=1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("45s", 45 * dt.timedelta(seconds=1)), ("15min", 15 * MINUTE), ("15 minutes", 15 * MINUTE),
        ("12h", 12 * HOUR), ("1.5h", 90 * MINUTE), ("30d", 30 * DAY), ("30 days", 30 * DAY),
        ("2w", 14 * DAY), ("2 weeks", 14 * DAY), ("1mo", 30 * DAY), ("1month", 30 * DAY),
        ("3 months", 90 * DAY), ("12H", 12 * HOUR),
    ],
)
def test_unambiguous_units(text: str, expected: dt.timedelta) -> None:
    assert parse_age(text) == expected


def test_m_is_refused_with_both_readings() -> None:
    with pytest.raises(CacheError) as info:
        parse_age("1m")
    assert str(info.value) == (
        "age '1m' is ambiguous: 'm' could mean minutes or months; write 1min for 1 minute(s) "
        "or 1mo for 1 x 30 days"
    )


@pytest.mark.parametrize(("text", "unit"), [("3y", "y"), ("2 fortnights", "fortnights")])
def test_unknown_units_are_named(text: str, unit: str) -> None:
    with pytest.raises(CacheError, match=f"unknown unit '{unit}'; expected e.g. 45s, 15min, 12h, 30d, 2w or 1mo"):
        parse_age(text)


def test_timedeltas_and_none_pass_through() -> None:
    assert parse_age(None) is None and parse_age(DAY) == DAY
    assert parse_size(None) is None and parse_size(5) == 5


@pytest.mark.parametrize(("text", "expected"), [("10G", 10 * 1024**3), ("1.5GiB", 3 * 1024**3 // 2), ("512", 512)])
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("n", "word", "text"),
    [
        (1, "entry", "1 entry"), (2, "entry", "2 entries"), (0, "call", "0 calls"), (1, "call", "1 call"),
        (3, "miss", "3 misses"), (1, "miss", "1 miss"), (5, "leaf", "5 leaves"), (2, "key", "2 keys"),
        (2, "stored entry", "2 stored entries"), (1, "other name", "1 other name"),
        (4, "unreferenced blob", "4 unreferenced blobs"),
    ],
)
def test_counted_agrees_the_noun_with_the_count(n: int, word: str, text: str) -> None:
    from aot.cache.units import counted

    assert counted(n, word) == text
