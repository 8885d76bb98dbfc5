"""Listing by name on SQLite narrows through the index on ``name`` (a LIKE with an
escape character never does): the range of :func:`name_range` bounds every match, and
the statements of ``aot ls NAME`` search the index instead of scanning the table."""

from __future__ import annotations

import fnmatch
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aot.cache.index.globs import name_range
from aot.cache.index.reader import SqliteReader
from aot.cache.index.sql import Index

from .test_reader_listing import GLOBS, ROWS

NAMES = [r.name for r in ROWS] + ["mlp", "mlp.", "mlp/", "mlp.forward\U0010ffff", "mlq", "\U0010ffff", "a[b", "a["]
PATTERNS = [g for g in GLOBS if g is not None] + ["mlp.forward", "a[", "a[b", "\U0010ffff*", "mlp.forward\U0010ffff"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_range_bounds_every_name_the_glob_matches(pattern: str) -> None:
    bounds = name_range(pattern)
    matched = [n for n in NAMES if fnmatch.fnmatchcase(n, pattern)]
    if bounds is None:  # no narrowing: only a glob that starts with a wildcard (or U+10FFFF, no successor)
        assert pattern.lstrip("\U0010ffff")[:1] in ("*", "?", "["), pattern
        return
    low, high = bounds
    assert all(low <= n < high for n in matched), (pattern, bounds, matched)
    assert "mlq" >= high or not pattern.startswith("mlp")  # narrower than the whole table


def _plan(db: Path, query: str, params: Any) -> str:
    with sqlite3.connect(db) as conn:
        return " | ".join(str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + query, params))


def test_listing_by_name_searches_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = Index.for_folder(tmp_path)
    index.bulk_insert(ROWS)
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if "FROM artifacts" in statement:
            seen.append((statement, parameters))

    sa.event.listen(index.engine, "before_cursor_execute", capture)
    assert [e.name for e in index.entries("mlp.*")] == ["mlp.forward"] * 3
    assert [e.name for e in index.entries("MLP.*")] == []  # case-sensitive, as before
    index.close()
    plan = _plan(tmp_path / "index.sqlite", *seen[0])
    assert "SEARCH artifacts USING" in plan and "(name>? AND name<?)" in plan, plan

    reader = SqliteReader(tmp_path / "index.sqlite", read_only=True)
    queries: list[tuple[str, Any]] = []
    execute = reader._execute

    def traced(query: str, params: Any = ()) -> Any:
        queries.append((query, params))
        return execute(query, params)

    monkeypatch.setattr(reader, "_execute", traced)
    try:
        assert [e.name for e in reader.entries("mlp.*")] == ["mlp.forward"] * 3
        assert [e.name for e in reader.entries("ünï/*")] == ["ünï/名"]
    finally:
        reader.close()
    artifact_queries = [q for q in queries if "FROM artifacts" in q[0]]
    plan = _plan(tmp_path / "index.sqlite", *artifact_queries[0])
    assert "SEARCH artifacts USING" in plan and "(name>? AND name<?)" in plan, plan
