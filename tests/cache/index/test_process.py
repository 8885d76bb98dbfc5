"""A new folder cache's index, opened in a helper process (aot.cache.index.process)."""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from aot.cache.cache import Cache
from aot.cache.index.entry import IndexEntry
from aot.cache.index.process import IndexProcess
from aot.cache.index.leases import Lease, LeaseLostError
from aot.errors import CacheError


@pytest.fixture
def helper(tmp_path: Path):  # type: ignore[no-untyped-def]
    started = IndexProcess(tmp_path / "cache")
    yield started
    started.close()


def test_index_calls_run_in_the_helper_and_its_errors_come_back_typed(helper: IndexProcess, tmp_path: Path) -> None:
    assert helper.wait_ready()
    assert (tmp_path / "cache" / "index.sqlite").is_file()  # created by the helper
    assert helper._process.pid != os.getpid()
    assert helper.count() == 0 and helper.is_empty()
    lease = helper.lease({"a" * 64})
    assert isinstance(lease, Lease) and lease.digests == {"a" * 64}
    assert helper.leased_digests() == {"a" * 64}
    helper.release(lease)
    assert helper.leased_digests() == set()

    entry = IndexEntry(
        key="d" * 64, name="f", program_fp="e" * 64, env_fp="env", signature="f32[8]",
        platform="cpu", manifest="{}", exe_digest="b" * 64, hlo_digest=None, raw_size=1,
        stored_size=1, compile_seconds=0.1,
    )
    lost = Lease("no-such-token", frozenset({"b" * 64}), datetime.now(timezone.utc) + timedelta(hours=1))
    with pytest.raises(LeaseLostError, match="expired"):
        helper.add(entry, blob_sizes={"b" * 64: (1, 1)}, lease=lost)
    assert helper.count() == 0  # nothing was written
    assert helper.add(entry, blob_sizes={"b" * 64: (1, 1)})
    assert helper.get(entry.key).name == "f"


def test_a_put_through_the_helper_is_stored_and_read_back_here(tmp_path: Path, compiled) -> None:  # noqa: ANN001
    folder = tmp_path / "cache"
    helper = IndexProcess.for_new_cache(folder)
    assert helper is not None and helper.wait_ready()
    cache = Cache(folder)
    cache.adopt_index(helper)
    artifact = compiled.mlp[min(compiled.mlp)]
    try:
        entry = cache.put_artifact(artifact)
        assert cache.put_artifact(artifact).key == entry.key  # stored once: "present"
        assert cache.lookup(entry.key) == entry  # read here, through the stdlib reader
        assert cache.index.count() == 1  # counted in the helper
    finally:
        cache.close()
    assert not helper._process.is_alive()
    assert sorted(p.name for p in folder.glob("index.sqlite*")) == ["index.sqlite"]
    with Cache(folder, read_only=True) as reader:
        (stored,) = reader.entries("mlp.forward")
        assert stored.key == entry.key and stored.ok
        assert reader.load(stored).info.signature == artifact.manifest.signature


def test_an_existing_cache_starts_no_helper(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    Cache(folder).close()
    assert IndexProcess.for_new_cache(folder) is None


def test_the_index_opens_here_when_the_helper_dies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("AOT_TEST_INDEX_PROCESS_EXIT_AFTER", "2")  # dies on its 2nd call
    folder = tmp_path / "cache"
    helper = IndexProcess(folder)
    try:
        assert helper.wait_ready()
        lease = helper.lease({"c" * 64})
        with caplog.at_level(logging.WARNING, logger="aot.cache.index.process"):
            assert helper.leased_digests() == {"c" * 64}  # made again, here
        assert "helper process" in caplog.text and "this process" in caplog.text
        assert not helper._process.is_alive()
        helper.release(lease)
        assert helper.leased_digests() == set()
        assert "in process" not in repr(helper)
    finally:
        helper.close()
    assert sorted(p.name for p in folder.glob("index.sqlite*")) == ["index.sqlite"]


def test_a_helper_that_cannot_open_the_index_leaves_the_error_to_the_cache(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("a file, not a cache folder")
    helper = IndexProcess(not_a_folder)
    try:
        assert not helper.wait_ready()
        assert not helper._process.is_alive()
    finally:
        helper.close()
    with pytest.raises(CacheError, match="cannot create the cache folder"):
        Cache(not_a_folder)


def test_a_cache_adopts_an_index_only_before_opening_its_own(tmp_path: Path) -> None:
    with Cache(tmp_path / "own") as cache:
        cache.index.count()
        with pytest.raises(ValueError, match="cannot adopt"):
            cache.adopt_index(object())
    with Cache(tmp_path / "own", read_only=True) as read_only:
        with pytest.raises(ValueError, match="cannot adopt"):
            read_only.adopt_index(object())
