"""The stdlib reader's ``signature_manifests`` (``aot stats`` without SQLAlchemy):
the same answer as the SQL index's over many statements, through the name index and
rowids. Every read's answer on every backend: test_read_protocol.py."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from aot.cache.index.entry import IndexEntry
from aot.cache.index.reader import SqliteReader
from aot.cache.index.sql import Index

T0 = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
GLOBS = (None, "*", "mlp.*", "MLP.*", "a_b%c", "a?b*", "[mt]*", "tiny", "no.such", "*名")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _row(name: str, signature: str, env_fp: str, seconds: int) -> IndexEntry:
    program_fp = _digest(f"program {name} {signature}")
    return IndexEntry(
        key=_digest(f"{program_fp}/{env_fp}"), name=name, program_fp=program_fp, env_fp=env_fp,
        signature=signature, platform="cpu", manifest=json.dumps({"name": name}),
        exe_digest=_digest(f"exe {program_fp} {env_fp}"), hlo_digest=_digest(f"hlo {program_fp}"),
        raw_size=3000, stored_size=1000, compile_seconds=0.25, created_at=T0 + timedelta(seconds=seconds),
        last_used_at=T0,
    )


ROWS = [  # test_name_range.py's too
    _row("mlp.forward", "f32[8,784]", "env-a", 3), _row("mlp.forward", "f32[1,784]", "env-a", 1),
    _row("mlp.forward", "f32[1,784]", "env-b", 1), _row("tiny", "f32[8]", "env-a", 2),
    _row("a_b%c", "f32[8]", "env-a", 0), _row("axbc", "f32[8]", "env-b", 0), _row("ünï/名", "f32[2]", "env-a", 5),
]


def _signature_rows() -> list[IndexEntry]:
    """Each (name, signature) in two environments with different manifests (which one
    is read is the smallest key's), a quarantined one, and an odd name."""
    rows = []
    for name, signature, env in [
        ("mlp.forward", "f32[1,784]", "env-a"), ("mlp.forward", "f32[1,784]", "env-b"),
        ("mlp.forward", "f32[8,784]", "env-b"), ("tiny", "f32[8], f32[8]", "env-a"),
        ("tiny", "f32[8], f32[8]", "env-b"), ("ünï/名", "f32[2]", "env-a"),
    ]:
        row = _row(name, signature, env, 0)
        rows.append(replace(row, manifest=json.dumps({"name": name, "env": env, "key": row.key})))
    rows[2] = replace(rows[2], state="quarantined", state_reason="test")
    return rows


SIGNATURE_PAIRS = [
    ("mlp.forward", "f32[1,784]"), ("mlp.forward", "f32[8,784]"), ("tiny", "f32[8], f32[8]"),
    ("ünï/名", "f32[2]"), ("tiny", "f32[4], f32[8]"), ("no.such", "f32[1]"),
]


def _smallest_key_manifests(rows: list[IndexEntry]) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], IndexEntry] = {}
    for row in rows:
        pair = (row.name, row.signature)
        if pair in SIGNATURE_PAIRS and (pair not in out or row.key < out[pair].key):
            out[pair] = row
    return {pair: row.manifest for pair, row in out.items()}


def test_signature_manifests_are_the_smallest_keys_as_the_sql_index_reads(tmp_path: Path) -> None:
    rows = _signature_rows()
    index = Index.for_folder(tmp_path)
    index.bulk_insert(rows)
    reader = SqliteReader(tmp_path / "index.sqlite", read_only=True)
    try:
        expected = _smallest_key_manifests(rows)
        assert len(expected) == 4  # the stored pairs; a missed signature and name are left out
        assert reader.signature_manifests(SIGNATURE_PAIRS) == expected
        assert index.signature_manifests(SIGNATURE_PAIRS) == expected
        assert reader.signature_manifests([]) == {} == index.signature_manifests([])
        # As many pairs as several statements hold: the same answer.
        many = [(f"n{i:04d}", "f32[1]") for i in range(700)]
        index.bulk_insert([_row(name, signature, "env-a", 0) for name, signature in many[::2]])
        got = reader.signature_manifests(many)
        assert sorted(got) == many[::2] and got == index.signature_manifests(many)
    finally:
        reader.close()
        index.close()


def _plan(db: Path, query: str, params: Any) -> str:
    with sqlite3.connect(db) as conn:
        return " | ".join(str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + query, params))


def test_signature_manifests_search_the_name_index_and_read_by_rowid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``aot stats`` on a large index: its statements narrow by the name index (never a
    scan of the table) and read each manifest by rowid (not a second search by key)."""
    index = Index.for_folder(tmp_path)
    index.bulk_insert(_signature_rows())
    index.close()
    reader = SqliteReader(tmp_path / "index.sqlite", read_only=True)
    queries: list[tuple[str, Any]] = []
    execute = reader._execute

    def traced(query: str, params: Any = ()) -> Any:
        queries.append((query, params))
        return execute(query, params)

    monkeypatch.setattr(reader, "_execute", traced)
    try:
        assert len(reader.signature_manifests(SIGNATURE_PAIRS)) == 4
    finally:
        reader.close()
    plans = [_plan(tmp_path / "index.sqlite", *q) for q in queries if "FROM artifacts" in q[0]]
    assert len(plans) == 2, plans
    assert "SEARCH artifacts USING INDEX" in plans[0] and "(name=?)" in plans[0], plans[0]
    assert "SEARCH artifacts USING INTEGER PRIMARY KEY (rowid=?)" in plans[1], plans[1]
    assert not any("SCAN artifacts" in p for p in plans), plans
