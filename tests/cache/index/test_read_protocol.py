"""The index's one read seam (aot.cache.index.protocol.IndexReader): the stdlib reader
and the SQLAlchemy index give the same answers for the same rows, and a cache picks one
of them when it opens."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import aot
from aot.cache.index.entry import IndexEntry
from aot.cache.index.protocol import IndexReader
from aot.cache.index.reader import SqliteReader
from aot.cache.index.sql import Index

T0 = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
CEST = timezone(timedelta(hours=2))
ENVS = ("env-cpu-8", "env-gpu-1")
NAMES = ("mlp.forward", "tiny", "a_b%c", "ünï.cödé/名")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _entry(name: str, signature: str, env_fp: str, created_at: datetime, **overrides: object) -> IndexEntry:
    program_fp = _digest(f"program {name} {signature}")
    fields: dict[str, object] = dict(
        key=_digest(f"{program_fp}/{env_fp}"), name=name, program_fp=program_fp, env_fp=env_fp,
        signature=signature, platform="cpu", manifest=json.dumps({"name": name, "signature": signature}),
        exe_digest=_digest(f"exe {program_fp} {env_fp}"), hlo_digest=_digest(f"hlo {program_fp}"),
        raw_size=3000, stored_size=1000, compile_seconds=0.25, created_at=created_at,
        last_used_at=created_at,
    )
    fields.update(overrides)
    return IndexEntry(**fields)  # type: ignore[arg-type]


def _rows() -> list[IndexEntry]:
    """Rows that tell orders, states, environments and odd names apart."""
    rows = []
    for i, signature in enumerate(("f32[1,784]", "f32[8,784]", "f32[32,784]")):
        for j, env in enumerate(ENVS):
            rows.append(_entry("mlp.forward", signature, env, T0 + timedelta(seconds=10 * i + j)))
    # Two rows created at the same instant: the key breaks the tie.
    rows.append(_entry("mlp.forward", "f32[64,784]", ENVS[0], T0 + timedelta(seconds=5)))
    rows.append(_entry("mlp.forward", "f32[64,784]", ENVS[1], T0 + timedelta(seconds=5)))
    rows.append(_entry("mlp.forward", "f32[128,784]", ENVS[0], T0 - timedelta(days=3), state="quarantined",
                       state_reason="digest mismatch"))
    rows.append(_entry("tiny", "f32[b]", ENVS[0], T0.astimezone(CEST), exe_digest=None))  # symbolic
    rows.append(_entry("a_b%c", "f32[8]", ENVS[1], T0 + timedelta(microseconds=1)))
    rows.append(_entry("ünï.cödé/名", "f32[8]", ENVS[0], T0 + timedelta(hours=1), hits=7))
    return rows


def _expected(rows: list[IndexEntry], name: str, env_fp: str | None, state: str | None) -> list[IndexEntry]:
    found = [e for e in rows if e.name == name and env_fp in (None, e.env_fp) and state in (None, e.state)]
    return sorted(found, key=lambda e: (e.created_at, e.key))


@dataclass(frozen=True)
class Backend:
    """One implementation of the protocol over a filled index, and the writer beside it."""

    kind: str
    writer: Index
    open: object  # (read_only: bool) -> IndexReader


@pytest.fixture(
    params=["stdlib-sqlite", "sqlalchemy-sqlite", pytest.param("sqlalchemy-postgresql", marks=pytest.mark.postgres)]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    kind = request.param
    if kind == "sqlalchemy-postgresql":
        url = str(request.getfixturevalue("postgres_url"))
        writer = Index(url)
    else:
        writer = Index.for_folder(tmp_path)
    writer.bulk_insert(_rows())
    path = tmp_path / "index.sqlite"

    def open_reader(read_only: bool) -> IndexReader:
        if kind == "stdlib-sqlite":
            return SqliteReader(path, read_only=read_only)
        if kind == "sqlalchemy-sqlite":
            return Index.for_folder(tmp_path, read_only=read_only)
        return Index(url, read_only=read_only)

    try:
        yield Backend(kind, writer, open_reader)
    finally:
        writer.close()


@pytest.fixture
def reader(backend: Backend) -> Iterator[IndexReader]:
    opened = backend.open(False)  # type: ignore[operator]
    try:
        yield opened
    finally:
        opened.close()


def test_each_implementation_satisfies_the_protocol(reader: IndexReader) -> None:
    assert isinstance(reader, IndexReader)
    assert reader.read_only is False


def test_get_returns_whole_rows_with_utc_times(reader: IndexReader) -> None:
    for row in _rows():
        got = reader.get(row.key)
        assert got == row, row.name
        assert got is not None and got.created_at.utcoffset() == timedelta(0)
    assert reader.get("no-such-key") is None
    assert reader.get("") is None


@pytest.mark.parametrize("state", ["ok", None, "quarantined"])
def test_by_name_filters_and_orders_as_specified(reader: IndexReader, state: str | None) -> None:
    rows = _rows()
    for name in (*NAMES, "no.such.name", "a_b_c", "mlp.%"):
        for env in (None, *ENVS):
            assert reader.by_name(name, env_fp=env, state=state) == _expected(rows, name, env, state), (name, env)


def test_by_name_defaults_to_intact_rows_of_every_environment(reader: IndexReader) -> None:
    assert reader.by_name("mlp.forward") == _expected(_rows(), "mlp.forward", None, "ok")


def test_names_lists_every_name_once_sorted(reader: IndexReader) -> None:
    assert reader.names() == sorted(NAMES)


def test_refs_and_release_members_read_the_same_everywhere(backend: Backend, reader: IndexReader) -> None:
    from aot.cache.index.refs import RefOrigin

    rows = [e for e in _rows() if e.name == "mlp.forward" and e.ok]
    origin = RefOrigin("test", host="h", user="u", commit=None)
    set_id = backend.writer.open_release("prod", origin)
    backend.writer.set_refs([(e.name, e.signature, e.env_fp, e.key) for e in rows], origin, release_id=set_id)
    expected = backend.writer.refs_named("mlp.forward")
    assert len(expected) == len(rows)
    assert reader.refs_named("mlp.forward") == expected
    assert reader.refs_named("mlp.forward", ENVS[1]) == [r for r in expected if r.env_fp == ENVS[1]]
    assert reader.refs_named("tiny") == []
    members = reader.release_members("prod", "mlp.forward")
    assert members is not None and {m.key for m in members} == {e.key for e in rows}
    assert reader.release_members("prod", "tiny") == ()
    assert reader.release_members("no-such-label", "mlp.forward") is None


def test_touch_records_a_use(backend: Backend, reader: IndexReader) -> None:
    row = next(e for e in _rows() if e.name == "ünï.cödé/名")
    before = datetime.now(timezone.utc) - timedelta(minutes=1)
    reader.touch(row.key)
    reader.touch(row.key)
    after = backend.writer.get(row.key)
    assert after is not None and after.hits == row.hits + 2
    assert after.last_used_at > before and after.created_at == row.created_at
    assert reader.get(row.key) == after
    reader.touch("no-such-key")  # nothing to record, and no error


def test_a_read_only_reader_reads_and_records_nothing(backend: Backend) -> None:
    read_only = backend.open(True)  # type: ignore[operator]
    try:
        assert read_only.read_only is True
        row = _rows()[0]
        assert read_only.get(row.key) == row
        assert read_only.names() == sorted(NAMES)
        read_only.touch(row.key)
    finally:
        read_only.close()
    assert backend.writer.get(row.key) == row


# ---------------------------------------------------------------- chosen once


def test_a_folder_cache_reads_through_the_stdlib_reader_from_open_to_close(tmp_path: Path) -> None:
    cache = aot.Cache(tmp_path / "cache")
    try:
        reader = cache.reader
        assert isinstance(reader, SqliteReader)
        row = _rows()[0]
        cache.index.add(row, blob_sizes={})  # a write opens the SQL index ...
        assert cache.reader is reader  # ... and the reads stay where they were
        assert cache.lookup(row.key) == row and cache.entries_named(row.name) == [row]
        assert cache.names() == [row.name]
    finally:
        cache.close()


@pytest.mark.postgres
def test_a_database_cache_reads_through_its_sql_index(postgres_url: str) -> None:
    with aot.Cache(postgres_url) as cache:
        assert cache.reader is cache.index


def test_a_folder_the_stdlib_reader_cannot_read_is_read_through_the_sql_index(tmp_path: Path) -> None:
    """An older schema: the stdlib reader refuses it, the SQL index migrates it."""
    folder = tmp_path / "cache"
    with Index.for_folder(folder) as old:
        old.bulk_insert(_rows()[:1])
        with old.engine.begin() as conn:
            conn.exec_driver_sql("UPDATE schema_version SET version = version - 1")
    cache = aot.Cache(folder)
    try:
        assert cache.reader is cache.index
        assert cache.lookup(_rows()[0].key) == _rows()[0]
    finally:
        cache.close()
    with aot.Cache(folder) as migrated:
        assert isinstance(migrated.reader, SqliteReader)
