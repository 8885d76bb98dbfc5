"""Fixtures of the reliability tests: PostgreSQL databases, tiny artifacts, spies.

The PostgreSQL fixtures (``postgres_url``) are shared from tests/conftest.py.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import pytest

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
