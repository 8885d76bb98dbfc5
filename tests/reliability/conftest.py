"""Fixtures of the reliability tests: PostgreSQL databases, tiny artifacts, spies.

The PostgreSQL fixtures (``postgres_url``) are shared from tests/conftest.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import pytest

from aot.cache.cache import Cache

from tests.reliability.helpers import DeserializeSpy, TinyArtifacts



@pytest.fixture(autouse=True)
def _no_cache_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's AOT_SIGNING_KEY / AOT_CACHE must not change what the tests see."""
    monkeypatch.delenv("AOT_SIGNING_KEY", raising=False)
    monkeypatch.delenv("AOT_CACHE", raising=False)




# ---------------------------------------------------------------- shared objects


@pytest.fixture(scope="session")
def tiny() -> TinyArtifacts:
    return TinyArtifacts(24)


@pytest.fixture
def deserialize_spy(monkeypatch: pytest.MonkeyPatch) -> DeserializeSpy:
    client_class = type(jax.devices()[0].client)
    original = client_class.deserialize_executable
    spy = DeserializeSpy()

    def deserialize_executable(self: Any, serialized: Any, *args: Any, **kwargs: Any) -> Any:
        spy.digests.append(hashlib.sha256(bytes(serialized)).hexdigest())
        return original(self, serialized, *args, **kwargs)

    monkeypatch.setattr(client_class, "deserialize_executable", deserialize_executable)
    return spy


@pytest.fixture(params=["folder", "sqlite-db"])
def make_cache(request: pytest.FixtureRequest, tmp_path: Path, tiny: TinyArtifacts) -> Iterator[Callable[..., Cache]]:
    """A cache with rel.tiny f32[1], f32[2], f32[3]; call again to open it again."""
    location = str(tmp_path / "cache") if request.param == "folder" else f"sqlite:///{tmp_path / 'c.sqlite'}"
    opened: list[Cache] = []

    def make(**kwargs: Any) -> Cache:
        cache = Cache(location, **kwargs)
        opened.append(cache)
        return cache

    first = make()
    for n in (1, 2, 3):
        first.put_artifact(tiny.by_size[n])
    yield make
    for cache in opened:
        cache.close()
