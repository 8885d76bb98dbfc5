"""``aot.Cache`` opens a Cache, or a TieredCache with ``local=``, and every cache of
either class is an ``aot.Cache`` (aot.cache.opening)."""

from __future__ import annotations

from pathlib import Path

import pytest

import aot
from aot.cache.cache import Cache
from aot.cache.opening import open_cache
from aot.cache.tiered import TieredCache


def test_without_local_it_is_the_facade(tmp_path: Path) -> None:
    with aot.Cache(tmp_path / "c") as cache:
        assert type(cache) is Cache
        assert isinstance(cache, aot.Cache)
    assert issubclass(TieredCache, aot.Cache) and issubclass(Cache, aot.Cache)
    assert not isinstance(object(), aot.Cache) and not issubclass(int, aot.Cache)


def test_with_local_it_is_a_tiered_cache(tmp_path: Path) -> None:
    with Cache(tmp_path / "remote"):
        pass  # a remote with an index
    with aot.Cache(tmp_path / "remote", local=tmp_path / "tier", refresh=False) as cache:
        assert type(cache) is TieredCache and isinstance(cache, aot.Cache)
        assert cache.refresh is False and isinstance(cache.local, aot.Cache)
    with open_cache(tmp_path / "remote", local=tmp_path / "tier") as cache:
        assert type(cache) is TieredCache


def test_refresh_without_local_is_refused_as_before(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="refresh"):
        aot.Cache(tmp_path / "c", refresh=False)


def test_a_class_derived_from_aot_cache_is_constructed_as_usual(tmp_path: Path) -> None:
    class Mine(aot.Cache):
        pass

    with Mine(tmp_path / "c") as cache:
        assert type(cache) is Mine and isinstance(cache, Cache)
