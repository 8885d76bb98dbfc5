"""The standard-library reader of a folder cache's index (aot.cache.index.reader): the
rows a serving process reads at start-up, and the touch of a load, without SQLAlchemy."""

from __future__ import annotations

import sqlite3
from datetime import timezone
from pathlib import Path

import pytest

from aot.errors import CacheError
from aot.cache.index.entry import SCHEMA_VERSION
from aot.cache.index.reader import SqliteReader


@pytest.fixture
def filled(open_folder_cache, compiled, foreign):  # noqa: ANN001, ANN201
    """A folder cache with three MLP buckets, tiny, a foreign tiny and a quarantined row."""
    cache = open_folder_cache()
    for artifact in compiled.all():
        cache.put(artifact)
    cache.put(foreign(compiled.tiny, device_count="4"))
    quarantined = cache.put(foreign(compiled.tiny, device_count="2"))
    cache.quarantine(quarantined, "test")
    return cache


def _index_file(cache) -> Path:  # noqa: ANN001
    return Path(cache.location) / "index.sqlite"


@pytest.mark.parametrize("state", ["ok", None, "quarantined"])
def test_by_name_reads_what_the_sql_index_reads(filled, state) -> None:  # noqa: ANN001
    reader = SqliteReader(_index_file(filled), read_only=True)
    try:
        for name in ("mlp.forward", "tiny", "no.such.name"):
            assert reader.by_name(name, state=state) == filled.index.by_name(name, state=state)
        env = filled.environment.digest
        assert reader.by_name("tiny", env_fp=env) == filled.index.by_name("tiny", env_fp=env)
    finally:
        reader.close()
    assert [e.state for e in filled.index.by_name("tiny", state=None)].count("quarantined") == 1


def test_one_key_and_manifest_per_signature_as_the_sql_index_reads(filled) -> None:  # noqa: ANN001
    names = ["mlp.forward", "tiny", "no.such.name"]
    reader = SqliteReader(_index_file(filled), read_only=True)
    try:
        keys = reader.signature_keys(names)
        assert keys == filled.index.signature_keys(names)
        assert reader.manifests([*keys.values(), "no-such-key"]) == filled.index.manifests(keys.values())
    finally:
        reader.close()
    rows = filled.index.by_name("mlp.forward", state=None) + filled.index.by_name("tiny", state=None)
    # Every stored signature once (tiny's three environments, the quarantined one too),
    # each by its smallest key.
    assert keys == {
        (e.name, e.signature): min(r.key for r in rows if (r.name, r.signature) == (e.name, e.signature))
        for e in rows
    }
    assert len({e.signature for e in rows if e.name == "mlp.forward"}) == 3
    assert filled.index.manifests(keys.values()) == {k: filled.index.get(k).manifest for k in keys.values()}


def test_rows_are_whole_entries_with_utc_times(filled) -> None:  # noqa: ANN001
    reader = SqliteReader(_index_file(filled), read_only=True)
    try:
        (entry,) = reader.by_name("tiny", env_fp=filled.environment.digest)
    finally:
        reader.close()
    assert entry.created_at.tzinfo is not None and entry.created_at.utcoffset() == timezone.utc.utcoffset(None)
    assert entry.manifest.startswith("{") and entry.exe_digest and entry.hlo_digest
    assert entry == filled.index.get(entry.key)


def test_touch_records_a_use(filled) -> None:  # noqa: ANN001
    (entry,) = filled.index.by_name("tiny", env_fp=filled.environment.digest)
    reader = SqliteReader(_index_file(filled), read_only=False)
    try:
        reader.touch(entry.key)
        reader.touch(entry.key)
    finally:
        reader.close()
    after = filled.index.get(entry.key)
    assert after.hits == entry.hits + 2
    assert after.last_used_at > entry.last_used_at


def test_a_read_only_reader_never_writes(filled) -> None:  # noqa: ANN001
    (entry,) = filled.index.by_name("tiny", env_fp=filled.environment.digest)
    reader = SqliteReader(_index_file(filled), read_only=True)
    try:
        reader.touch(entry.key)  # does nothing
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader._conn.execute("UPDATE artifacts SET hits = 99")
    finally:
        reader.close()
    assert filled.index.get(entry.key).hits == entry.hits


def test_another_schema_version_is_refused(filled) -> None:  # noqa: ANN001
    path = _index_file(filled)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(CacheError) as info:
        SqliteReader(path, read_only=True)
    assert str(info.value) == (
        f"the cache index {path} has schema version {SCHEMA_VERSION + 1}; this jax-aot reads "
        f"version {SCHEMA_VERSION} (open it once with a writable Cache to migrate, or upgrade jax-aot)"
    )


def test_not_an_index_is_a_cache_error(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(CacheError, match=f"cannot read the cache index {path}: "):
        SqliteReader(path, read_only=True)
    with pytest.raises(CacheError, match="cannot read the cache index"):
        SqliteReader(tmp_path / "missing.sqlite", read_only=True)


def test_the_cache_serves_through_it_without_the_sql_index(filled, compiled) -> None:  # noqa: ANN001
    import aot

    served = aot.Cache(filled.location, read_only=True)
    try:
        assert len(served.entries_named("mlp.forward")) == 3
        fn = aot.load("mlp.forward", cache=served)
        fn(compiled.params, compiled.inputs[2])
        assert served._index is None  # the SQLAlchemy index was never opened
    finally:
        served.close()
