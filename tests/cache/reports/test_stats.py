"""aot.cache.reports.stats: the totals of ``aot stats`` add up every counter column; the
arguments of its rows are read from the manifests of the shown signatures."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from aot.cache.index.entry import IndexEntry
from aot.cache.index.reader import SqliteReader
from aot.cache.index.schema import CALL_STATS
from aot.cache.index.sql import Index
from aot.cache.reports.stats import named_signatures
from aot.cache.stats_report import COUNTERS, SignatureStats, StatsReport

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


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


def _entry(name: str, signature: str, env: str, paths: tuple[str, ...]) -> IndexEntry:
    shapes = [[int(d) for d in aval[4:-1].split(",")] for aval in signature.split(", ")]
    manifest = json.dumps({"args": [{"path": p, "shape": s, "dtype": "float32"} for p, s in zip(paths, shapes)]})
    digest = hashlib.sha256(f"{name} {signature} {env}".encode()).hexdigest()
    return IndexEntry(
        key=digest, name=name, program_fp=digest, env_fp=env, signature=signature, platform="cpu",
        manifest=manifest, exe_digest=digest, hlo_digest=digest, raw_size=1, stored_size=1,
        compile_seconds=0.5, created_at=T0, last_used_at=T0,
    )


class _Folder:  # what the reports read through: a cache's reader
    def __init__(self, reader: SqliteReader) -> None:
        self.reader = reader


def test_arguments_are_read_for_the_shown_signatures_only_unless_a_name_has_a_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``aot stats`` names each row's arguments from the manifest of its (name,
    signature)'s smallest key; only a name with a missed signature has its other
    signatures read (they lend their argument names). The other signatures of a name
    without a miss never reach Python: at 1,000,000 entries they were most of the work."""
    served = [_entry("f", "f32[1], f32[2]", env, paths) for env, paths in (("env-b", ("x", "y")), ("env-a", ("a", "b")))]
    others = [_entry("f", f"f32[{n}], f32[2]", "env-a", ("u", "v")) for n in range(3, 9)]
    lenders = [_entry("g", "f32[4]", "env-a", ("z",)), _entry("g", "f32[5]", "env-a", ("w",))]
    index = Index.for_folder(tmp_path)
    index.bulk_insert([*served, *others, *lenders])
    index.close()
    rows = [SignatureStats("env-a", "f", "f32[1], f32[2]", calls=2), SignatureStats("env-a", "g", "f32[6]", misses=1)]
    reader = SqliteReader(tmp_path / "index.sqlite", read_only=True)
    returned: list[int] = []
    execute = reader._execute

    def counted(query: str, params: Any = ()) -> Any:
        out = execute(query, params)
        returned.append(len(out) if "FROM artifacts" in query else 0)
        return out

    monkeypatch.setattr(reader, "_execute", counted)
    try:
        named = named_signatures(_Folder(reader), rows)  # type: ignore[arg-type]
    finally:
        reader.close()
    smallest = min(served, key=lambda e: e.key)
    assert list(named) == [("f", "f32[1], f32[2]"), ("g", "f32[4]"), ("g", "f32[5]")]
    report = StatsReport("here", tuple(rows), named=named)
    assert report.describe(rows[0]) == ("a: f32[1], b: f32[2]" if smallest is served[1] else "x: f32[1], y: f32[2]")
    assert report.describe(rows[1]) == "z: f32[6]"  # lent by the first stored signature of g
    # f: its shown pair and its manifest; g (a miss): its two signatures and their manifests.
    assert sum(returned) == 2 + 4, returned
