"""The listing reads of the stdlib reader (``aot ls``, ``show``, ``stats`` without
SQLAlchemy) answer as the SQL index does over the same SQLite file."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aot.cache.index.entry import IndexEntry
from aot.cache.index.reader import SqliteReader
from aot.cache.index.refs import RefOrigin, ReleaseMember
from aot.cache.index.schema import CALL_STATS
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


ROWS = [
    _row("mlp.forward", "f32[8,784]", "env-a", 3), _row("mlp.forward", "f32[1,784]", "env-a", 1),
    _row("mlp.forward", "f32[1,784]", "env-b", 1), _row("tiny", "f32[8]", "env-a", 2),
    _row("a_b%c", "f32[8]", "env-a", 0), _row("axbc", "f32[8]", "env-b", 0), _row("ünï/名", "f32[2]", "env-a", 5),
]


@pytest.fixture
def both(tmp_path: Path) -> Iterator[tuple[Index, SqliteReader]]:
    index = Index.for_folder(tmp_path)
    index.bulk_insert(ROWS)
    origin = RefOrigin("test")
    release = index.open_release("prod", origin)
    index.add_release_members(release, [ReleaseMember(r.name, r.signature, r.env_fp, r.key) for r in ROWS[:3]])
    index.open_release("canary", origin)
    index.set_refs([(r.name, r.signature, r.env_fp, r.key) for r in ROWS[2:]], origin)
    with index.engine.begin() as conn:
        for i, (env, name) in enumerate((("env-a", "mlp.forward"), ("env-b", "tiny"), ("env-a", "ünï/名"))):
            conn.execute(sa.insert(CALL_STATS).values(
                env_fp=env, name=name, signature_digest=_digest(str(i)), signature=f"f32[{i}]", calls=10 * i,
                loads=1, load_seconds=0.5, saved_seconds=1.5 * i, misses=i, miss_reason=None if i else "shape",
                recompiles=0, recompile_seconds=0.0, recompile_reason=None,
                created_at=T0, updated_at=T0 + timedelta(minutes=i),
            ))
    reader = SqliteReader(tmp_path / "index.sqlite", read_only=True)
    try:
        yield index, reader
    finally:
        reader.close()
        index.close()


def test_entries_match_the_sql_index_for_every_glob(both: tuple[Index, SqliteReader]) -> None:
    index, reader = both
    for glob in GLOBS:
        assert reader.entries(glob) == index.entries(glob), glob
    assert [e.name for e in reader.entries("a?b*")] == ["a_b%c", "axbc"]


def test_rows_of_many_keys_match_the_sql_index(both: tuple[Index, SqliteReader]) -> None:
    index, reader = both
    keys = [r.key for r in ROWS[::2]] + ["0" * 64]  # an absent key is left out
    assert reader.get_many(keys) == index.get_many(keys)
    assert sorted(reader.get_many(keys)) == sorted(r.key for r in ROWS[::2])
    assert reader.get_many([]) == {}


def test_key_prefixes_release_labels_and_url_match(both: tuple[Index, SqliteReader]) -> None:
    index, reader = both
    for prefix in ("", ROWS[0].key[:1], ROWS[0].key[:6], ROWS[0].key, "zz", "%", "_"):
        for limit in (None, 2):
            assert reader.find_key_prefix(prefix, limit=limit) == index.find_key_prefix(prefix, limit=limit)
    assert reader.release_labels() == [r.label for r in index.releases()] == ["canary", "prod"]
    assert reader.release_members("prod", "mlp.forward") == index.release_members("prod", "mlp.forward")
    assert reader.url == index.url
    for glob in GLOBS:
        assert reader.refs(glob) == index.refs(glob), glob
    assert len(reader.refs()) == len(ROWS) - 2


def test_call_stats_match_the_sql_index(both: tuple[Index, SqliteReader]) -> None:
    index, reader = both

    via_index = index
    key = lambda r: (r["env_fp"], r["name"])  # noqa: E731
    for glob in GLOBS:
        for env in (None, "env-a", "env-b"):
            assert sorted(reader.call_stats(glob, env), key=key) == sorted(via_index.call_stats(glob, env), key=key)
    (row,) = reader.call_stats("tiny")
    assert row["calls"] == 10 and row["updated_at"] == T0 + timedelta(minutes=1)


def test_jit_entries_and_statistics_match_the_sql_index(both: tuple[Index, SqliteReader]) -> None:
    from aot.cache.index.jit_records import JitEntry

    index, reader = both
    for i, name in enumerate(("train_step", "eval_step", "train_step")):
        index.jit_add(JitEntry(
            key=f"jit_{name}-{_digest(str(i))}", name=name, digest=_digest(f"blob {i}"), size=100 + i,
            stored_size=100 + i, compile_seconds=0.5 * i, platform="cpu", created_at=T0, last_used_at=T0,
        ))
        index.jit_record(name, hit=bool(i % 2), saved_seconds=0.5 * i)
    for glob in (None, "train_*", "jit_eval", "no.such"):
        assert reader.jit_entries(glob) == index.jit_entries(glob), glob
        assert reader.jit_stats(glob) == index.jit_stats(glob), glob
    assert [e.name for e in reader.jit_entries("train_*")] == ["train_step", "train_step"]
    assert [(s.name, s.hits, s.misses) for s in reader.jit_stats()] == [("eval_step", 1, 0), ("train_step", 0, 2)]


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


def test_signature_manifests_on_postgresql(postgres_url: str) -> None:
    rows = _signature_rows()
    index = Index(postgres_url)
    try:
        index.bulk_insert(rows)
        assert index.signature_manifests(SIGNATURE_PAIRS) == _smallest_key_manifests(rows)
    finally:
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
