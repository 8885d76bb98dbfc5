"""The SQL index on SQLite and PostgreSQL: rows, lookups, states, schema, concurrency."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from aot.cache.index import entry as index_entry
from aot.cache.index import gc_protocol as index_gc
from aot.cache.index import schema as index_schema
from aot.cache.index.entry import SCHEMA_VERSION, IndexEntry
from aot.cache.index.globs import glob_to_like
from aot.cache.index.leases import LeaseLostError
from aot.cache.index.schema import Migration
from aot.cache.index.sql import Index
from aot.cache.storage.content import digest_of


def backfilled(entry: IndexEntry) -> IndexEntry:
    """``entry`` as migration 9 leaves a row without a manifest digest: with its manifest's."""
    return replace(entry, manifest_digest=digest_of(entry.manifest.encode()))
from aot.errors import CacheError, ReadOnlyCacheError

T0 = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)


def make_entry(
    name: str = "mlp.forward",
    *,
    key: str | None = None,
    program_fp: str | None = None,
    env_fp: str = "env-cpu-1",
    signature: str = "f32[8,784]",
    created_at: datetime = T0,
    **overrides: Any,
) -> IndexEntry:
    program_fp = program_fp or digest_of(f"program {name} {signature}".encode())
    exe = digest_of(f"exe {program_fp} {env_fp}".encode())
    hlo = digest_of(f"hlo {program_fp}".encode())
    fields: dict[str, Any] = dict(
        key=key or digest_of(f"{program_fp}/{env_fp}".encode()),
        name=name,
        program_fp=program_fp,
        env_fp=env_fp,
        signature=signature,
        platform="cpu",
        manifest=json.dumps({"format_version": 1, "name": name}),
        exe_digest=exe,
        hlo_digest=hlo,
        raw_size=3000,
        stored_size=1000,
        compile_seconds=0.25,
        created_at=created_at,
        last_used_at=created_at,
    )
    fields.update(overrides)
    return IndexEntry(**fields)


def sizes(entry: IndexEntry) -> dict[str, tuple[int, int]]:
    out = {entry.exe_digest: (2000, 700)} if entry.exe_digest else {}
    if entry.hlo_digest:
        out[entry.hlo_digest] = (1000, 300)
    return out


def add(index: Index, entry: IndexEntry) -> bool:
    return index.add(entry, blob_sizes=sizes(entry))


# ------------------------------------------------------------------------- rows


def test_add_then_get_round_trips_every_field(index: Index) -> None:
    entry = make_entry()
    assert add(index, entry) is True
    got = index.get(entry.key)
    assert got == entry
    assert got is not None and got.created_at.tzinfo is not None
    assert got.created_at.utcoffset() == timedelta(0)
    assert got.manifest_dict() == {"format_version": 1, "name": "mlp.forward"}
    assert index.get("no-such-key") is None
    assert index.count() == 1


def test_times_in_other_zones_are_stored_as_utc(index: Index) -> None:
    cest = timezone(timedelta(hours=2))
    entry = make_entry(created_at=T0.astimezone(cest))
    add(index, entry)
    got = index.get(entry.key)
    assert got is not None and got.created_at == T0 and got.created_at.tzinfo == timezone.utc


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        make_entry(created_at=datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="state"):
        make_entry(state="broken")


def test_entry_dict_round_trip_is_json() -> None:
    entry = make_entry(state="quarantined", state_reason="digest mismatch")
    data = json.loads(json.dumps(entry.to_dict()))
    assert data["created_at"] == "2024-05-01T12:00:00.123456+00:00"
    assert IndexEntry.from_dict(data) == entry
    assert IndexEntry.from_dict({**data, "added_in_a_later_version": 1}) == entry
    zulu = {**data, "created_at": "2024-05-01T12:00:00.123456Z"}
    assert IndexEntry.from_dict(zulu).created_at == T0


def test_adding_an_existing_key_is_a_no_op(index: Index) -> None:
    entry = make_entry()
    assert add(index, entry)
    assert add(index, replace(entry, manifest="{}", hits=7)) is False
    assert index.get(entry.key) == entry
    assert index.count() == 1


def test_by_name_filters_environment_and_state(index: Index) -> None:
    a = make_entry(signature="f32[1,784]", created_at=T0)
    b = make_entry(signature="f32[8,784]", created_at=T0 + timedelta(seconds=1))
    gpu = make_entry(signature="f32[8,784]", env_fp="env-gpu", created_at=T0 + timedelta(seconds=2))
    other = make_entry("mlp.loss")
    for e in (a, b, gpu, other):
        add(index, e)
    assert index.by_name("mlp.forward") == [a, b, gpu]
    assert index.by_name("mlp.forward", env_fp="env-cpu-1") == [a, b]
    assert index.by_name("nope") == []
    index.quarantine(a.key, "digest mismatch")
    assert index.by_name("mlp.forward", env_fp="env-cpu-1") == [b]
    assert [e.key for e in index.by_name("mlp.forward", state="quarantined")] == [a.key]
    assert len(index.by_name("mlp.forward", state=None)) == 3
    assert index.by_program(b.program_fp) == [b, gpu]


@pytest.mark.parametrize(
    ("glob", "expected"),
    [
        (None, ["a%b", "a_b", "axb", "mlp.forward", "mlp.loss", "transformer.forward"]),
        ("*", ["a%b", "a_b", "axb", "mlp.forward", "mlp.loss", "transformer.forward"]),
        ("mlp.*", ["mlp.forward", "mlp.loss"]),
        ("*.forward", ["mlp.forward", "transformer.forward"]),
        ("mlp.?oss", ["mlp.loss"]),
        ("[mt]*forward", ["mlp.forward", "transformer.forward"]),
        ("[!m]*forward", ["transformer.forward"]),
        ("a_b", ["a_b"]),  # '_' is literal in a glob, a wildcard in LIKE
        ("a%b", ["a%b"]),
        ("a?b", ["a%b", "a_b", "axb"]),
        ("MLP.*", []),  # case-sensitive on both databases
        ("mlp.forward", ["mlp.forward"]),
    ],
)
def test_entries_glob(index: Index, glob: str | None, expected: list[str]) -> None:
    for name in ["mlp.forward", "mlp.loss", "transformer.forward", "a_b", "axb", "a%b"]:
        add(index, make_entry(name))
    assert [e.name for e in index.entries(glob)] == expected


def test_glob_to_like_escapes_like_wildcards() -> None:
    assert glob_to_like("mlp.*") == "mlp.%"
    assert glob_to_like("a_b%c\\?") == "a\\_b\\%c\\\\_"
    assert glob_to_like("x[ab]y") == "x_y"
    assert glob_to_like("x[ab") == "x[ab"


def test_find_key_prefix(index: Index) -> None:
    e1 = make_entry(key="abc123")
    e2 = make_entry("mlp.loss", key="abd456")
    e3 = make_entry("x", key="a%c")
    for e in (e1, e2, e3):
        add(index, e)
    assert index.find_key_prefix("ab") == ["abc123", "abd456"]
    assert index.find_key_prefix("abc") == ["abc123"]
    assert index.find_key_prefix("a%") == ["a%c"]
    assert index.find_key_prefix("ABC") == []
    assert index.find_key_prefix("a", limit=1) == ["a%c"]


def test_touch_records_use(index: Index) -> None:
    entry = make_entry()
    add(index, entry)
    index.touch(entry.key)
    index.touch(entry.key)
    got = index.get(entry.key)
    assert got is not None and got.hits == 2 and got.last_used_at > T0
    when = datetime(2030, 1, 1, tzinfo=timezone.utc)
    index.touch(entry.key, when=when)
    got = index.get(entry.key)
    assert got is not None and got.hits == 3 and got.last_used_at == when
    index.touch("no-such-key")  # harmless


def test_quarantine_then_heal_by_adding_again(index: Index) -> None:
    entry = make_entry()
    add(index, entry)
    assert index.quarantine(entry.key, "blob abc: digest mismatch") is True
    assert index.quarantine("no-such-key", "x") is False
    bad = index.get(entry.key)
    assert bad is not None and bad.state == "quarantined" and bad.state_reason == "blob abc: digest mismatch"
    assert index.by_name(entry.name) == []
    healed = replace(entry, manifest='{"recompiled": true}', created_at=T0 + timedelta(hours=1))
    assert add(index, healed) is True
    got = index.get(entry.key)
    assert got == healed and got.state == "ok" and got.state_reason is None
    assert index.by_name(entry.name) == [healed]


def test_delete_removes_rows_and_orphan_programs(index: Index) -> None:
    cpu = make_entry()
    gpu = make_entry(env_fp="env-gpu")
    loss = make_entry("mlp.loss")
    for e in (cpu, gpu, loss):
        add(index, e)
    assert cpu.program_fp == gpu.program_fp
    assert index.delete([cpu.key, "no-such-key"]) == 1
    assert index.get(cpu.key) is None
    assert index.program(cpu.program_fp) is not None  # gpu still uses it
    assert cpu.exe_digest not in index.referenced_digests()
    assert cpu.hlo_digest in index.referenced_digests()

    assert index.delete([gpu.key]) == 1
    assert index.program(gpu.program_fp) is None  # last artifact gone: program gone
    assert index.referenced_digests() == {loss.exe_digest, loss.hlo_digest}

    assert index.delete([loss.key], keep_programs=True) == 1
    program = index.program(loss.program_fp)
    assert program is not None and program["hlo_digest"] == loss.hlo_digest
    assert index.referenced_digests() == {loss.hlo_digest}
    assert index.delete([]) == 0


def test_blob_rows_are_registered_once(index: Index) -> None:
    cpu = make_entry()
    gpu = make_entry(env_fp="env-gpu")  # same program: shares the HLO blob
    add(index, cpu)
    add(index, gpu)
    rows = {r.digest: r for r in index.blob_rows()}
    assert set(rows) == {cpu.exe_digest, gpu.exe_digest, cpu.hlo_digest}
    assert (rows[cpu.hlo_digest].size, rows[cpu.hlo_digest].stored_size) == (1000, 300)
    assert index.total_stored_size() == 700 + 700 + 300
    assert index.delete_blob_rows([cpu.exe_digest, "f" * 64]) == 1
    assert index.total_stored_size() == 700 + 300
    assert rows[cpu.hlo_digest].to_dict()["created_at"].endswith("+00:00")


def test_program_row_gets_its_hlo_later(index: Index) -> None:
    first = make_entry(hlo_digest=None)
    add(index, first)
    program = index.program(first.program_fp)
    assert program is not None and program["hlo_digest"] is None
    second = make_entry(env_fp="env-gpu")
    add(index, second)
    program = index.program(first.program_fp)
    assert program is not None and program["hlo_digest"] == second.hlo_digest


# --------------------------------------------------------------------- read-only


def test_read_only_index_refuses_writes(index_url: str) -> None:
    entry = make_entry()
    with Index(index_url) as rw:
        add(rw, entry)
    with Index(index_url, read_only=True) as ro:
        assert ro.get(entry.key) == entry
        assert [e.key for e in ro.entries()] == [entry.key]
        with pytest.raises(ReadOnlyCacheError, match="read-only"):
            add(ro, make_entry("other"))
        with pytest.raises(ReadOnlyCacheError):
            ro.quarantine(entry.key, "x")
        with pytest.raises(ReadOnlyCacheError):
            ro.delete([entry.key])
        with pytest.raises(ReadOnlyCacheError):
            ro.delete_blob_rows([entry.exe_digest])
        ro.touch(entry.key)  # a load must not fail because stats cannot be written
        got = ro.get(entry.key)
        assert got is not None and got.hits == 0


def test_read_only_open_of_a_missing_index_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CacheError, match="no jax-aot cache index"):
        Index.for_folder(tmp_path / "nothing", read_only=True)
    assert not (tmp_path / "nothing").exists()


def test_read_only_open_of_an_empty_database_is_a_clear_error(index_url: str) -> None:
    if index_url.startswith("sqlite"):
        sa.create_engine(index_url).connect().close()  # creates an empty file
    with pytest.raises(CacheError, match="no jax-aot cache index"):
        Index(index_url, read_only=True)


# ------------------------------------------------------------------------ schema


def _set_version(url: str, version: int) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE schema_version SET version = :v"), {"v": version})
    engine.dispose()


def _columns(url: str, table: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return {c["name"] for c in sa.inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


def test_schema_version_is_recorded_and_reopening_is_a_no_op(index_url: str) -> None:
    with Index(index_url) as first:
        assert first.schema_version() == SCHEMA_VERSION
        add(first, make_entry())
    with Index(index_url) as again:
        assert again.schema_version() == SCHEMA_VERSION
        assert again.count() == 1
    assert SCHEMA_VERSION == index_schema.MIGRATIONS[-1].version
    assert [m.version for m in index_schema.MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))


def test_newer_schema_is_refused_naming_both_versions(index_url: str) -> None:
    Index(index_url).close()
    _set_version(index_url, SCHEMA_VERSION + 41)
    for read_only in (False, True):
        with pytest.raises(CacheError) as err:
            Index(index_url, read_only=read_only)
        message = str(err.value)
        assert f"schema version {SCHEMA_VERSION + 41}" in message
        assert f"up to {SCHEMA_VERSION}" in message
        assert "upgrade jax-aot" in message


def _add_note_column(calls: list[int]) -> Callable[[Connection], None]:
    def upgrade(conn: Connection) -> None:
        calls.append(1)
        conn.execute(sa.text("ALTER TABLE artifacts ADD COLUMN note TEXT"))

    return upgrade


def test_older_schema_is_migrated_once(index_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = make_entry()
    with Index(index_url) as v1:
        add(v1, entry)
    calls: list[int] = []
    monkeypatch.setattr(
        index_schema,
        "MIGRATIONS",
        (*index_schema.MIGRATIONS, Migration(SCHEMA_VERSION + 1, "add note", _add_note_column(calls))),
    )
    monkeypatch.setattr(index_schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with pytest.raises(CacheError, match="opened read-only so it was not migrated"):
        Index(index_url, read_only=True)
    with Index(index_url) as v2:
        assert v2.schema_version() == SCHEMA_VERSION + 1
        assert v2.get(entry.key) == entry
    assert calls == [1]
    assert "note" in _columns(index_url, "artifacts")
    Index(index_url).close()
    assert calls == [1]


def test_failing_migration_changes_nothing(index_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    Index(index_url).close()

    def broken(conn: Connection) -> None:
        conn.execute(sa.text("ALTER TABLE artifacts ADD COLUMN note TEXT"))
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(
        index_schema, "MIGRATIONS", (*index_schema.MIGRATIONS, Migration(SCHEMA_VERSION + 1, "broken", broken))
    )
    monkeypatch.setattr(index_schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with pytest.raises(CacheError, match=f"disk on fire; nothing was changed.*version {SCHEMA_VERSION}"):
        Index(index_url)
    monkeypatch.undo()
    assert "note" not in _columns(index_url, "artifacts")
    with Index(index_url) as idx:
        assert idx.schema_version() == SCHEMA_VERSION


def test_sqlite_is_configured_for_concurrency(tmp_path: Path) -> None:
    with Index.for_folder(tmp_path) as idx:
        assert idx.dialect == "sqlite"
        with idx.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    assert (tmp_path / "index.sqlite").is_file()


def test_unreachable_database_names_the_url_without_password() -> None:
    url = "postgresql+psycopg://aot:s3cret@127.0.0.1:1/cache"
    with pytest.raises(CacheError) as err:
        Index(url)
    message = str(err.value)
    assert "postgresql+psycopg://aot:***@127.0.0.1:1/cache" in message
    assert "s3cret" not in message
    assert "refused" in message.lower() or "failed" in message.lower()


def test_unsupported_database_is_refused() -> None:
    with pytest.raises(CacheError, match="supports SQLite .* and PostgreSQL"):
        Index("mysql://root@localhost/cache")


# ------------------------------------------------------------------- concurrency


def _run_threads(n: int, target: Callable[[int], object]) -> list[object]:
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as e:  # noqa: BLE001 - returned to the test
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def test_concurrent_first_open_creates_the_schema_once(index_url: str) -> None:
    def open_and_add(i: int) -> bool:
        with Index(index_url) as idx:
            return add(idx, make_entry(f"fn{i}"))

    results = _run_threads(6, open_and_add)
    assert results == [True] * 6, results
    with Index(index_url) as idx:
        assert idx.count() == 6 and idx.schema_version() == SCHEMA_VERSION


def test_concurrent_adds_of_one_key_store_one_row(index_url: str) -> None:
    Index(index_url).close()
    entry = make_entry()

    def add_same(i: int) -> bool:
        with Index(index_url) as idx:  # one engine per thread, like separate processes
            return idx.add(replace(entry, manifest=json.dumps({"writer": i})), blob_sizes=sizes(entry))

    results = _run_threads(8, add_same)
    assert sorted(map(repr, results)) == sorted(["True"] + ["False"] * 7), results
    with Index(index_url) as idx:
        assert idx.count() == 1
        assert len(idx.blob_rows()) == 2


_ADD_IN_A_PROCESS = r"""
import json, pathlib, sys, time
from aot.cache.index.entry import IndexEntry
from aot.cache.index.sql import Index
url, entry_json, sync, me = sys.argv[1:5]
entry = IndexEntry.from_dict(json.loads(entry_json))
sync = pathlib.Path(sync)
(sync / f"ready-{me}").touch()
deadline = time.monotonic() + 60
while not (sync / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.005)
with Index(url) as idx:
    print(json.dumps(idx.add(entry, blob_sizes={entry.exe_digest: (2000, 700)})))
"""


@pytest.mark.slow
def test_concurrent_adds_from_processes(index_url: str, tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    entry = make_entry()
    sync = tmp_path / "sync"
    sync.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _ADD_IN_A_PROCESS, index_url, json.dumps(entry.to_dict()), str(sync), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    deadline = time.monotonic() + 60
    while len(list(sync.glob("ready-*"))) < len(procs) and time.monotonic() < deadline:
        time.sleep(0.01)
    (sync / "go").touch()
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outputs]
    assert sorted(out.strip() for out, _ in outputs) == ["false", "true"]
    with Index(index_url) as idx:
        assert idx.count() == 1 and idx.get(entry.key) == entry


# ------------------------------------------------------------------- globs


@pytest.mark.parametrize(
    ("glob", "expected"),
    [("[!]abc]", ["x", "z"]), ("[!]]", ["a", "x", "z"]), ("[]]", ["]"]), ("[!]", ["[!]"]),
     ("*[!]a]", ["a]x", "ab", "x", "z"])],
)
def test_bracket_classes_match_what_fnmatch_matches(index: Index, glob: str, expected: list[str]) -> None:
    """`aot ls '[!]abc]'` returned nothing: the LIKE prefilter took `[!]` for a class."""
    import fnmatch

    names = ["x", "z", "]", "a", "[!]", "a]x", "ab"]
    for name in names:
        add(index, make_entry(name))
    assert [e.name for e in index.entries(glob)] == sorted(expected)
    assert sorted(expected) == sorted(n for n in names if fnmatch.fnmatchcase(n, glob))


_GLOB_ALPHABET = "ab]![-*?%_\\\x00é"


def _like_matches(conn: Any, name: str, like: str) -> bool:
    return bool(conn.execute(sa.text("SELECT :n LIKE :p ESCAPE '\\'"), {"n": name, "p": like}).scalar())


def _check_superset(conn: Any, name: str, glob: str) -> None:
    import fnmatch

    if fnmatch.fnmatchcase(name, glob):
        assert _like_matches(conn, name, glob_to_like(glob)), (name, glob, glob_to_like(glob))


def test_glob_to_like_is_a_superset_of_fnmatch_on_sqlite() -> None:
    """Every name fnmatch matches, the LIKE pattern matches too (hypothesis, against
    SQLite's LIKE; the Python post-filter then removes the extras)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    engine = sa.create_engine("sqlite://")
    text = st.text(alphabet=_GLOB_ALPHABET.replace("\x00", ""), max_size=8)
    with engine.connect() as conn:

        @settings(max_examples=600, derandomize=True, deadline=None)
        @given(name=text, glob=text)
        def check(name: str, glob: str) -> None:
            _check_superset(conn, name, glob)

        @settings(max_examples=300, derandomize=True, deadline=None)
        @given(data=st.data(), glob=text)
        def check_matching(data: Any, glob: str) -> None:
            # names built to match: the random pairs above rarely do
            import re

            regex = __import__("fnmatch").translate(glob)
            name = data.draw(st.from_regex(re.compile(regex), fullmatch=True).filter(
                lambda s: "\n" not in s and "\x00" not in s))  # no name holds either
            _check_superset(conn, name, glob)

        check()
        check_matching()
    engine.dispose()


@pytest.mark.postgres
def test_glob_to_like_is_a_superset_of_fnmatch_on_postgresql(postgres_url: str) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    engine = sa.create_engine(postgres_url)
    text = st.text(alphabet=_GLOB_ALPHABET.replace("\x00", ""), max_size=8)
    try:
        with engine.connect() as conn:

            @settings(max_examples=200, derandomize=True, deadline=None)
            @given(data=st.data(), glob=text)
            def check_matching(data: Any, glob: str) -> None:
                import fnmatch
                import re

                name = data.draw(st.from_regex(re.compile(fnmatch.translate(glob)), fullmatch=True).filter(
                    lambda s: "\n" not in s and "\x00" not in s))
                _check_superset(conn, name, glob)

            check_matching()
    finally:
        engine.dispose()


# ------------------------------------------------------------------- a damaged index


def test_a_truncated_sqlite_index_says_it_is_damaged_and_what_to_do(tmp_path: Path) -> None:
    """It used to get "check that the database is reachable and that the URL, user and
    password are right"."""
    path = tmp_path / "index.sqlite"
    with Index(f"sqlite:///{path}") as idx:
        for i in range(200):
            add(idx, make_entry(f"fn{i}", manifest="x" * 2000))
    size = path.stat().st_size
    assert size > 100_000 and not (tmp_path / "index.sqlite-wal").exists()
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(CacheError) as err:
        with Index(f"sqlite:///{path}") as idx:
            idx.entries()  # the schema page may survive: the damage shows on reading
    message = str(err.value)
    assert "damaged" in message and "aot warmup" in message and "bundle import" in message, message
    assert "password" not in message
    # a file that is not a database at all
    path.write_bytes(b"this is not an SQLite file" * 100)
    with pytest.raises(CacheError, match="damaged"):
        Index(f"sqlite:///{path}")


# ------------------------------------------------------------------- leases


def test_a_lease_protects_its_digests_until_released_or_expired(index: Index) -> None:
    entry = make_entry()
    lease = index.lease([entry.exe_digest, entry.hlo_digest])
    assert index.leased_digests() == {entry.exe_digest, entry.hlo_digest}
    assert abs(lease.expires_at - index.now() - timedelta(seconds=index_gc.LEASE_SECONDS)) < timedelta(minutes=1)
    with index.deletion_lock() as batch:
        assert batch.deletable([entry.exe_digest, "f" * 64]) == ["f" * 64]
    assert index.add(entry, blob_sizes=sizes(entry), lease=lease) is True  # releases it
    assert index.leased_digests() == set()
    with index.deletion_lock() as batch:
        assert batch.deletable([entry.exe_digest, entry.hlo_digest]) == []  # referenced now
    # an expired lease is taken by gc, and its writer's commit fails, writing nothing
    other = make_entry("other")
    stale = index.lease([other.exe_digest], seconds=0)
    with index.deletion_lock() as batch:
        assert batch.deletable([other.exe_digest]) == [other.exe_digest]
    with pytest.raises(LeaseLostError, match="expired"):
        index.add(other, blob_sizes=sizes(other), lease=stale)
    assert index.get(other.key) is None
    released = index.lease([other.exe_digest])
    index.release(released)
    assert index.leased_digests() == set()


def test_server_clock_stamps_rows_and_uses(index: Index, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows stored by the cache and uses recorded without a time take the database
    server's clock, whatever this process's clock says."""
    server = index.now()
    assert abs(server - datetime.now(timezone.utc)) < timedelta(minutes=1)
    for module in (index_schema, index_entry):  # wherever the index reads this process's clock
        monkeypatch.setattr(module, "utcnow", lambda: datetime(2001, 1, 1, tzinfo=timezone.utc))
    entry = make_entry(created_at=datetime(2001, 1, 1, tzinfo=timezone.utc))
    index.add(entry, blob_sizes=sizes(entry), stamp=True)
    got = index.get(entry.key)
    assert got is not None and abs(got.created_at - server) < timedelta(minutes=1)
    assert got.last_used_at == got.created_at
    index.touch(entry.key)
    assert abs(index.get(entry.key).last_used_at - index.now()) < timedelta(minutes=1)


def test_a_version_1_index_is_migrated_to_leases(index_url: str) -> None:
    """A cache written before leases (schema 1: no blob_leases, no digest indexes)."""
    with Index(index_url) as idx:
        entry = make_entry()
        add(idx, entry)
        with idx.engine.begin() as conn:
            for name in ("ix_artifacts_exe_digest", "ix_artifacts_hlo_digest", "ix_programs_hlo_digest"):
                conn.exec_driver_sql(f"DROP INDEX {name}")
            conn.exec_driver_sql("DROP TABLE blob_leases")
            conn.exec_driver_sql("UPDATE schema_version SET version = 1")
    with pytest.raises(CacheError, match="opened read-only so it was not migrated"):
        Index(index_url, read_only=True)
    with Index(index_url) as idx:
        assert idx.schema_version() == SCHEMA_VERSION >= 3
        assert idx.get(entry.key) == backfilled(entry)
        lease = idx.lease([entry.exe_digest])
        assert idx.leased_digests() == {entry.exe_digest}
        idx.release(lease)
        indexes = {i["name"] for t in ("artifacts", "programs") for i in sa.inspect(idx.engine).get_indexes(t)}
        assert {"ix_artifacts_exe_digest", "ix_artifacts_hlo_digest", "ix_programs_hlo_digest"} <= indexes


# ------------------------------------------------------------ migration 2: symbolic


def _create_schema_v1(url: str) -> None:
    """A database as schema version 1 created it (``exe_digest`` NOT NULL)."""
    metadata = sa.MetaData()
    for table in index_schema.METADATA.sorted_tables:
        table.to_metadata(metadata)
    metadata.tables["artifacts"].c.exe_digest.nullable = False
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        metadata.create_all(conn)
        conn.execute(
            sa.insert(metadata.tables["schema_version"]).values(id=1, version=1, updated_at=T0)
        )
    engine.dispose()


def _exe_digest_nullable(url: str) -> bool:
    engine = sa.create_engine(url)
    try:
        columns = {c["name"]: c for c in sa.inspect(engine).get_columns("artifacts")}
        return bool(columns["exe_digest"]["nullable"])
    finally:
        engine.dispose()


def test_schema_1_is_migrated_to_allow_entries_without_an_executable(index_url: str) -> None:
    _create_schema_v1(index_url)
    entry = make_entry()
    symbolic = make_entry("mlp.symbolic", signature="f32[b,784]", exe_digest=None)
    assert not _exe_digest_nullable(index_url)
    engine = sa.create_engine(index_url)  # a row written by the old version
    with engine.begin() as conn:
        conn.execute(sa.insert(index_schema.PROGRAMS).values(
            program_fp=entry.program_fp, name=entry.name, signature=entry.signature,
            hlo_digest=entry.hlo_digest, created_at=T0,
        ))
        conn.execute(sa.insert(index_schema.ARTIFACTS).values(**entry._row()))
    engine.dispose()
    with pytest.raises(CacheError, match="opened read-only so it was not migrated"):
        Index(index_url, read_only=True)
    with Index(index_url) as idx:
        assert idx.schema_version() == SCHEMA_VERSION
        assert idx.get(entry.key) == backfilled(entry)  # the old row survived the table rebuild
        add(idx, symbolic)
        assert idx.get(symbolic.key).exe_digest is None
        assert idx.by_name("mlp.symbolic")[0].signature == "f32[b,784]"
        # gc's reachability: the HLO of the symbolic entry, no NULL digest.
        assert idx.referenced_digests() == {
            entry.exe_digest, entry.hlo_digest, symbolic.hlo_digest, backfilled(entry).manifest_digest,
        }
    assert _exe_digest_nullable(index_url)
    engine = sa.create_engine(index_url)
    try:
        names = {ix["name"] for ix in sa.inspect(engine).get_indexes("artifacts")}
    finally:
        engine.dispose()
    assert {"ix_artifacts_name_env_state", "ix_artifacts_name", "ix_artifacts_last_used_at"} <= names
