"""aot.cache.reports.stats: the totals of ``aot stats`` add up every counter column."""

from __future__ import annotations

from aot.cache.index.schema import CALL_STATS
from aot.cache.reports.stats import COUNTERS, SignatureStats, StatsReport


def test_the_counters_are_the_numeric_columns_of_the_statistics_table() -> None:
    table = CALL_STATS
    numeric = [c.name for c in table.c if c.type.python_type in (int, float) and not c.primary_key]
    assert list(COUNTERS) == numeric


def test_totals_add_up_every_counter() -> None:
    rows = (
        SignatureStats("e", "f", "x: f32[1]", calls=3, loads=1, load_seconds=0.5, misses=2),
        SignatureStats("e", "f", "x: f32[2]", calls=1, recompiles=1, recompile_seconds=1.5),
    )
    totals = StatsReport("here", rows).totals
    assert totals == {
        "calls": 4, "loads": 1, "load_seconds": 0.5, "saved_seconds": 0.0, "misses": 2,
        "recompiles": 1, "recompile_seconds": 1.5, "signatures": 2,
    }
