"""``aot.Cache`` is the public cache: an :class:`ArtifactStore` with the methods that
compose the layers above it, and a :class:`TieredCache` when ``local=`` is given."""

from __future__ import annotations

from pathlib import Path

import pytest

import aot
from aot.cache.cache import Cache, TieredCache
from aot.cache.store import ArtifactStore
from aot.cache.tiered import TieredStore


def test_without_local_it_is_the_cache(tmp_path: Path) -> None:
    with aot.Cache(tmp_path / "c") as cache:
        assert type(cache) is Cache and aot.Cache is Cache
        assert isinstance(cache, ArtifactStore)
    assert issubclass(TieredCache, aot.Cache) and issubclass(TieredCache, TieredStore)
    assert not isinstance(object(), aot.Cache) and not issubclass(int, aot.Cache)


def test_with_local_it_is_a_tiered_cache(tmp_path: Path) -> None:
    with Cache(tmp_path / "remote"):
        pass  # a remote with an index
    with aot.Cache(tmp_path / "remote", local=tmp_path / "tier", refresh=False) as cache:
        assert type(cache) is TieredCache and isinstance(cache, aot.Cache)
        assert cache.refresh is False and isinstance(cache.local, ArtifactStore)
        assert callable(cache.verify) and cache.verify().ok


def test_tier_options_without_local_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="refresh"):
        aot.Cache(tmp_path / "c", refresh=False)


def test_a_class_derived_from_aot_cache_is_constructed_as_usual(tmp_path: Path) -> None:
    class Mine(aot.Cache):
        pass

    with Mine(tmp_path / "c") as cache:
        assert type(cache) is Mine and isinstance(cache, Cache)
    with pytest.raises(TypeError, match="local="):
        Mine(tmp_path / "c", local=tmp_path / "tier")
