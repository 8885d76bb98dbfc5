"""verify never quarantines when most blobs are missing at once (a wrong blob location
looks like that); corrupt blobs, and a few missing ones, are still quarantined."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp

import aot
from aot.cache.storage.content import compress


def _cache(folder: Path) -> aot.Cache:
    cache = aot.Cache(folder)
    for scale in (1.0, 2.0, 3.0):
        cache.compile(lambda x, s=scale: jnp.tanh(x) * s, aot.spec("f32[4]"), name=f"f{int(scale)}")
    return cache


def test_most_blobs_missing_changes_nothing(tmp_path: Path) -> None:
    cache = _cache(tmp_path / "c")
    for path in (tmp_path / "c" / "blobs").rglob("*.zst"):
        path.unlink()
    report = cache.verify()
    assert not report.ok and report.quarantined == ()
    assert report.cache_problems[0].startswith("3 of 3 entries have no blobs at ")
    # Its own blobs folder, emptied: a lost store, not a wrong --blobs; entries listed.
    assert "is empty: its blobs were deleted or lost" in report.cache_problems[0]
    assert {p.name for p in report.problems} == {"f1", "f2", "f3"}
    assert [e.state for e in cache.entries()] == ["ok", "ok", "ok"]
    cache.close()


def test_corrupt_and_few_missing_blobs_are_still_quarantined(tmp_path: Path) -> None:
    cache = _cache(tmp_path / "c")
    first, second = cache.entries()[:2]
    cache.blobs.store.write(first.exe_digest, compress(b"rotten"))
    cache.blobs.store.delete([second.exe_digest])
    report = cache.verify()
    assert set(report.quarantined) == {first.key, second.key} and report.cache_problems == ()
    cache.close()
