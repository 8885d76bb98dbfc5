"""A stale reader must not condemn fresh data.

A lazy dispatcher reads the rows of its name at start-up and loads each on its first
call. If gc evicted an entry and a warm-up stored it again meanwhile, the row now
names fresh blobs while the dispatcher's snapshot names blobs that are gone. Loading
the snapshot fails; the dispatcher must re-read the row and serve the fresh one, and
quarantine a row only while it still names the blobs that failed (a compare-and-set
in the index). On SQLite and on PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import aot
import aot.recompile as aot_recompile
from aot.cache.cache import Cache
from aot.cache.index.entry import referenced_digests
from aot.recompile import recompile

from tests.reliability import reliability_workers as workers
from tests.reliability.helpers import TinyArtifacts, check_scaled

N = 8


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return str(request.getfixturevalue("postgres_url"))
    return str(tmp_path / "cache")


@pytest.fixture(scope="module")
def rewarmed(tiny: TinyArtifacts) -> Any:
    """The entry stored again with other executable bytes under the same key (XLA
    output differs between compiles of one program; here, deterministically: the
    executable a serving process recompiled from the portable HLO)."""
    return recompile(tiny.by_size[N])


@pytest.fixture
def recompiles(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    calls: list[str] = []
    real = aot_recompile.recompile  # the fallback ladder imports it where it recompiles

    def counting(artifact: Any) -> Any:
        calls.append(artifact.manifest.key)
        return real(artifact)

    monkeypatch.setattr(aot_recompile, "recompile", counting)
    yield calls


def _evict(cache: Cache, key: str) -> None:
    """What gc does to an evicted entry: the row first, then its blobs."""
    entry = cache.index.get(key)
    assert entry is not None
    cache.index.delete([key])
    digests = sorted(referenced_digests(entry))  # its manifest blob too
    for digest in digests:
        cache.blobs.delete(digest)
    cache.index.delete_blob_rows(digests)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
def test_a_stale_lazy_dispatcher_serves_the_fresh_row(
    location: str, tiny: TinyArtifacts, rewarmed: Any, recompiles: list[str], strict: bool,
) -> None:
    old = tiny.by_size[N]
    key = old.manifest.key
    assert rewarmed.manifest.key == key
    assert rewarmed.manifest.blobs["executable"].digest != old.manifest.blobs["executable"].digest
    with Cache(location) as writer:
        writer.put_artifact(old)
        server = aot.load(TinyArtifacts.NAME, cache=Cache(location), lazy=True, strict=strict)
        _evict(writer, key)  # gc, then a warm-up stores the entry again
        writer.put_artifact(rewarmed)
        fresh = writer.index.get(key)
        assert fresh.exe_digest == rewarmed.manifest.blobs["executable"].digest

        out = server(np.arange(N, dtype=np.float32))  # loads its snapshot first
        np.testing.assert_allclose(np.asarray(out), workers.expected_scaled(N))
        assert recompiles == []  # the fresh row was served, not rebuilt
        row = writer.index.get(key)
        assert row.ok and row.exe_digest == fresh.exe_digest, row.state_reason
        assert writer.verify().ok
        # a strict server started now serves it too
        check_scaled(aot.load(TinyArtifacts.NAME, cache=Cache(location), strict=True), N)
        server.cache.close()


def test_a_stale_dispatcher_whose_row_is_gone_quarantines_nothing(
    location: str, tiny: TinyArtifacts, recompiles: list[str],
) -> None:
    key = tiny.by_size[N].manifest.key
    with Cache(location) as writer:
        writer.put_artifact(tiny.by_size[N])
        writer.put_artifact(tiny.by_size[N + 1])
        server = aot.load(TinyArtifacts.NAME, cache=Cache(location), lazy=True, strict=True)
        _evict(writer, key)
        with pytest.raises(aot.CorruptArtifactError, match="no intact artifact is left") as caught:
            server(np.arange(N, dtype=np.float32))
        assert key[:12] in str(caught.value) and "missing" in str(caught.value)
        assert writer.index.get(key) is None  # not re-created as a quarantined row
        check_scaled(server, N + 1)  # the other signature is unaffected
        server.cache.close()


def test_quarantine_is_a_compare_and_set_on_the_row(location: str, tiny: TinyArtifacts, rewarmed: Any) -> None:
    key = tiny.by_size[N].manifest.key
    with Cache(location) as cache:
        cache.put_artifact(tiny.by_size[N])
        stale = cache.index.get(key)
        _evict(cache, key)
        cache.put_artifact(rewarmed)
        fresh = cache.index.get(key)
        # a reader holding the old row cannot condemn the new one
        assert cache.quarantine(stale, "blob missing (stale read)") is False
        assert cache.index.get(key).ok
        # a damaged manifest is a new version of the row too
        assert cache.index.quarantine(key, "x", expect=fresh) is True
        row = cache.index.get(key)
        assert row.state == "quarantined" and row.state_reason == "x"
        # the same blobs and manifest: quarantined, whatever the state or use counters
        assert cache.quarantine(fresh, "again") is True
        assert cache.index.get(key).state_reason == "again"
