"""Cache.remove_release (aot release rm): a removed label stops pinning, gc then
collects what only it pinned and keeps what a ref or another label pins; a dry run
changes nothing; a replica loading the label fails at start-up. SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aot
from aot.cache.index.refs import RefOrigin
from aot.errors import CacheError, ReadOnlyCacheError


@pytest.fixture
def cache(index_url: str, tmp_path: Path) -> aot.Cache:
    with aot.Cache(index_url, blob_location=str(tmp_path / "blobs")) as c:
        yield c


def _labelled(cache: aot.Cache, label: str, *entries) -> int:  # noqa: ANN002
    set_id = cache.index.open_release(label, RefOrigin("test", release=label))
    cache.set_refs(list(entries), RefOrigin("test", release=label), release_id=set_id)
    return set_id


@pytest.fixture
def pinned(cache: aot.Cache) -> dict[str, object]:
    """a1 pinned only as canary's rollback target, b1 by canary and prod, c by its ref;
    a2 and b2 (newer code) by their refs."""
    a1 = cache.compile_entry(lambda x: x + 1.0, "f32[2]", name="rel.a").entry
    b1 = cache.compile_entry(lambda x: x * 3.0, "f32[3]", name="rel.b").entry
    c = cache.compile_entry(lambda x: x - 1.0, "f32[4]", name="rel.c").entry
    _labelled(cache, "canary", a1)
    _labelled(cache, "canary", b1)
    _labelled(cache, "prod", b1)
    a2 = cache.compile_entry(lambda x: x + 2.0, "f32[2]", name="rel.a").entry  # the refs move on
    b2 = cache.compile_entry(lambda x: x * 4.0, "f32[3]", name="rel.b").entry
    return {"a1": a1, "b1": b1, "c": c, "a2": a2, "b2": b2}


def test_gc_collects_only_what_the_removed_label_pinned(cache: aot.Cache, pinned) -> None:  # noqa: ANN001
    assert cache.gc(older_than="0s").entries == ()  # everything is pinned
    plan = cache.remove_release("canary")
    assert plan.executed and plan.labels == ("canary",)
    (removed,) = plan.releases
    assert removed.current.keys() == {pinned["b1"].key}
    assert removed.rollback is not None and removed.rollback.keys() == {pinned["a1"].key}
    assert removed.sets == 2
    assert [m.key for m in plan.unpinned] == [pinned["a1"].key]
    assert [(m.key, why) for m, why in plan.still_pinned] == [(pinned["b1"].key, "release prod")]
    assert [r.label for r in cache.releases()] == ["prod"]
    collected = cache.gc(older_than="0s")
    assert [v.key for v in collected.entries] == [pinned["a1"].key]
    left = {e.key for e in cache.entries()}
    assert left == {pinned[k].key for k in ("b1", "c", "a2", "b2")}


def test_a_dry_run_changes_nothing(cache: aot.Cache, pinned) -> None:  # noqa: ANN001
    plan = cache.remove_release(["canary"], dry_run=True)
    assert not plan.executed and [m.key for m in plan.unpinned] == [pinned["a1"].key]
    assert [r.label for r in cache.releases()] == ["canary", "prod"]
    assert cache.gc(older_than="0s").entries == ()
    # The plan, carried out as planned.
    assert cache.remove_release(plan).executed
    assert [r.label for r in cache.releases()] == ["prod"]


def test_removing_every_label_that_pins_an_entry(cache: aot.Cache, pinned) -> None:  # noqa: ANN001
    plan = cache.remove_release(["prod", "canary"])
    assert [m.key for m in plan.unpinned] == sorted([pinned["a1"].key, pinned["b1"].key])
    assert plan.still_pinned == () and cache.releases() == []
    assert sorted(v.key for v in cache.gc(older_than="0s").entries) == sorted([pinned["a1"].key, pinned["b1"].key])


def test_unknown_label_names_those_that_exist_and_read_only_is_refused(
    cache: aot.Cache, pinned, index_url: str, tmp_path: Path,  # noqa: ANN001
) -> None:
    with pytest.raises(CacheError, match=r"no release labelled 'nope'; the labels are canary, prod"):
        cache.remove_release(["canary", "nope"])
    assert [r.label for r in cache.releases()] == ["canary", "prod"]  # nothing removed
    with aot.Cache(index_url, blob_location=str(tmp_path / "blobs"), read_only=True) as reader:
        assert reader.remove_release("canary", dry_run=True).unpinned  # a plan reads only
        with pytest.raises(ReadOnlyCacheError, match="cannot remove a release: the cache at .* is read-only"):
            reader.remove_release("canary")
    assert [r.label for r in cache.releases()] == ["canary", "prod"]


def test_a_replica_loading_a_removed_label_fails_at_start_up(cache: aot.Cache, pinned) -> None:  # noqa: ANN001
    served = aot.load("rel.b", cache, release="prod")
    np.testing.assert_allclose(served(np.ones(3, np.float32)), 3.0)  # b1, not the ref'd b2
    cache.remove_release("prod")
    with pytest.raises(aot.ReleaseNotFoundError, match="no release labelled 'prod'"):
        aot.load("rel.b", cache, release="prod")
