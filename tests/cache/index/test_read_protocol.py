"""The contract test of the index's one read protocol (aot.cache.index.protocol.IndexReader):
every read, over the same rows, answers as specified through each implementation (the
stdlib reader; the SQLAlchemy index on SQLite and on PostgreSQL, skipped with the reason
when AOT_TEST_POSTGRES_URL is unset), and a cache picks one of them when it opens."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
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
            conn.exec_driver_sql("UPDATE schema_version SET version = 9")
    cache = aot.Cache(folder)
    try:
        assert cache.reader is cache.index
        # Migrations 10 (the manifest digest backfill) and 11 ran again over a row without a
        # manifest digest: it has its manifest's.
        digest = hashlib.sha256(_rows()[0].manifest.encode()).hexdigest()
        assert cache.lookup(_rows()[0].key) == replace(_rows()[0], manifest_digest=digest)
    finally:
        cache.close()
    with aot.Cache(folder) as migrated:
        assert isinstance(migrated.reader, SqliteReader)


# ---------------------------------------------------------------- every read of the protocol
#
# The listing, statistics and gc reads, over an index that also holds refs, releases,
# call statistics, JAX's persistent-cache rows, blob rows and leases.

GLOBS = (None, "*", "mlp.*", "MLP.*", "a_b%c", "a?b*", "[mt]*", "tiny", "no.such", "*名")
LEASED, EXPIRED = _digest("leased"), _digest("expired")


def _jit(key: str, name: str) -> object:
    from aot.cache.index.jit_records import JitEntry

    return JitEntry(key, name, _digest(f"jit {key}"), 40, 20, 1.5, "cpu")


@pytest.fixture
def filled(backend: Backend) -> Iterator[IndexReader]:
    from aot.cache.index.call_stats import IndexSink
    from aot.cache.index.refs import RefOrigin

    writer = backend.writer
    origin = RefOrigin("test", host="h", user="u", commit=None)
    served = [e for e in _rows() if e.ok and e.env_fp == ENVS[0]]
    writer.set_refs([(e.name, e.signature, e.env_fp, e.key) for e in served], origin,
                    release_id=writer.open_release("prod", origin))
    writer.open_release("canary", origin)
    IndexSink(writer).write([
        {"env_fp": env, "name": name, "signature_digest": _digest(name + env), "signature": "f32[8]", "calls": calls,
         "loads": 1, "load_seconds": 0.5, "saved_seconds": 1.5, "misses": 0, "recompiles": 0,
         "recompile_seconds": 0.0, "miss_reason": None, "recompile_reason": "other environment"}
        for env, name, calls in ((ENVS[0], "mlp.forward", 10), (ENVS[1], "tiny", 3), (ENVS[0], "ünï.cödé/名", 1))
    ], {})
    for key, name in (("jit_train-1", "train_step"), ("jit_eval-2", "eval_step")):
        writer.jit_add(_jit(key, name))  # type: ignore[arg-type]
    writer.jit_record("train_step", key="jit_train-1", hit=True, saved_seconds=2.0)
    writer.jit_record("eval_step", hit=False)
    writer.lease([LEASED], seconds=600)
    writer.lease([EXPIRED], seconds=-60)
    opened = backend.open(False)  # type: ignore[operator]
    try:
        yield opened
    finally:
        opened.close()


def test_listing_reads_answer_as_specified(filled: IndexReader) -> None:
    import fnmatch

    rows = sorted(_rows(), key=lambda e: (e.name, e.created_at, e.key))
    for glob in GLOBS:
        expected = [e for e in rows if glob in (None, "*") or fnmatch.fnmatchcase(e.name, glob)]
        assert filled.entries(glob) == expected, glob
    keys, keys_sorted = [e.key for e in rows], sorted(e.key for e in rows)
    assert filled.get_many([]) == {} and filled.get_many([*keys[:3], "no-such-key"]) == {e.key: e for e in rows[:3]}
    assert filled.manifests([keys[0], "no-such-key"]) == {keys[0]: rows[0].manifest}
    prefix = keys[0][:3]
    assert filled.find_key_prefix(prefix) == sorted(k for k in keys if k.startswith(prefix))
    assert filled.find_key_prefix(prefix, limit=1) == filled.find_key_prefix(prefix)[:1]
    for wild in ("%", "_", prefix.upper() + "%", "zz"):
        assert filled.find_key_prefix(wild) == [], wild
    assert filled.find_key_prefix("", limit=2) == keys_sorted[:2] and filled.find_key_prefix("") == keys_sorted
    smallest: dict[tuple[str, str], IndexEntry] = {}
    for e in rows:
        if (e.name, e.signature) not in smallest or e.key < smallest[e.name, e.signature].key:
            smallest[e.name, e.signature] = e
    assert filled.signature_keys(NAMES) == {pair: e.key for pair, e in smallest.items()}
    pairs = [("mlp.forward", "f32[8,784]"), ("tiny", "f32[b]"), ("tiny", "f32[9]")]
    assert filled.signature_manifests(pairs) == {p: smallest[p].manifest for p in pairs[:2]}
    by_env: dict[str, str] = {}
    for e in rows:
        by_env[e.env_fp] = min(e.key, by_env.get(e.env_fp, e.key))
    assert filled.environment_keys([*by_env, "no-such-env"]) == by_env and filled.environment_keys([]) == {}


def test_refs_releases_and_pins_answer_as_specified(backend: Backend, filled: IndexReader) -> None:
    assert filled.url == backend.writer.url  # the SQLAlchemy URL, password masked
    served = {(e.name, e.signature, e.env_fp, e.key) for e in _rows() if e.ok and e.env_fp == ENVS[0]}
    refs = filled.refs()
    assert {(r.name, r.signature, r.env_fp, r.key) for r in refs} == served
    assert [(r.name, r.signature) for r in refs] == sorted((r.name, r.signature) for r in refs)
    assert {r.key for r in filled.refs("mlp.*")} == {k for n, _, _, k in served if n == "mlp.forward"}
    assert filled.refs("MLP.*") == []
    assert {r.key for r in filled.refs("*名")} == {k for n, *_, k in served if n.endswith("名")}
    assert filled.release_labels() == ["canary", "prod"]
    assert filled.default_release() is None
    import sqlalchemy as sa

    from aot.cache.index.schema import DEFAULT_RELEASE

    with backend.writer.engine.begin() as conn:
        conn.execute(sa.insert(DEFAULT_RELEASE).values(id=1, label="prod", set_at=T0, host="h", user="u"))
    assert filled.default_release() == "prod"
    assert set(filled.pinned_keys()) == {k for *_, k in served}
    reasons = filled.pin_reasons(excluding=["prod"])
    assert set(reasons) == {k for *_, k in served} and all(reasons.values())


def test_statistics_and_jit_rows_answer_as_specified(filled: IndexReader) -> None:
    stats = sorted(filled.call_stats(), key=lambda r: r["name"])
    assert [(r["name"], r["env_fp"], r["calls"], r["recompile_reason"]) for r in stats] == [
        ("mlp.forward", ENVS[0], 10, "other environment"), ("tiny", ENVS[1], 3, "other environment"),
        ("ünï.cödé/名", ENVS[0], 1, "other environment"),
    ]
    assert all(r["updated_at"].utcoffset() == timedelta(0) for r in stats)
    assert [r["name"] for r in filled.call_stats("mlp.*")] == ["mlp.forward"] and filled.call_stats("MLP.*") == []
    assert [r["name"] for r in filled.call_stats(env_fp=ENVS[1])] == ["tiny"]
    assert filled.call_stats("*名", ENVS[1]) == []
    assert [(e.key, e.name, e.hits) for e in filled.jit_entries()] == [("jit_eval-2", "eval_step", 0),
                                                                        ("jit_train-1", "train_step", 1)]
    assert [e.key for e in filled.jit_entries("train_*")] == ["jit_train-1"]
    assert [e.key for e in filled.jit_entries("jit_eval")] == ["jit_eval-2"]  # a key prefix
    assert [(s.name, s.hits, s.misses, s.saved_seconds) for s in filled.jit_stats()] == [
        ("eval_step", 0, 1, 0.0), ("train_step", 1, 0, 2.0),
    ]
    assert filled.blob_sizes() == {_digest(f"jit {k}"): 20 for k in ("jit_train-1", "jit_eval-2")}


def test_gc_reads_answer_as_specified(filled: IndexReader) -> None:
    rows = _rows()
    got = filled.gc_rows()
    assert {r.key for r in got} == {e.key for e in rows}
    for r in got:
        e = filled.get(r.key)
        assert e is not None and (r.name, r.signature, r.exe_digest, r.stored_size, r.state) == (
            e.name, e.signature, e.exe_digest, e.stored_size, e.state)
        assert (r.created_at, r.last_used_at) == (e.created_at, e.last_used_at)
    now = filled.now()
    assert now.utcoffset() == timedelta(0) and abs(now - datetime.now(timezone.utc)) < timedelta(minutes=5)
    digests = {d for e in rows for d in (e.exe_digest, e.hlo_digest) if d} | {_digest(f"jit {k}") for k in
                                                                             ("jit_train-1", "jit_eval-2")}
    assert filled.referenced_digests() == digests
    some = sorted(digests)[:2]
    assert filled.referenced_among([*some, LEASED, "0" * 64]) == set(some)
    assert filled.emptiness() == (False, None)
    assert filled.leased_digests() == {LEASED}
    assert filled.has_expired_leases() is True
    assert filled.drop_expired_leases() == 1
    assert filled.has_expired_leases() is False and filled.leased_digests() == {LEASED}
