"""A local read-through tier for serving replicas (aot.cache.tiered), in front of the
fleet's shared cache: PostgreSQL + S3 (moto). A cold start reads each missing blob
once; a warm one reads none; a replica serves from its tier when the remote is down;
rows come from the remote first, so a replica started later sees new entries."""

from __future__ import annotations

import hashlib
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy.engine import url as sa_url

import aot
from aot.cache.storage.fsspec_store import FsspecObjectStore
from aot.cache.storage.objectstore import blob_path
from aot.cache.reports.stats import read_stats
from aot.cache.cache import TieredCache
from aot.errors import CacheError, CorruptArtifactError, SignatureNotFoundError

pytestmark = pytest.mark.postgres


class Fleet:
    """The shared cache (PostgreSQL + S3) and replicas with local tiers."""

    def __init__(self, url: str, blobs: str, root: Path) -> None:
        self.url, self.blobs, self.root = url, blobs, root
        self.opened: list[Any] = []

    def remote(self, **kwargs: Any) -> aot.Cache:
        cache = aot.Cache(self.url, blob_location=self.blobs, **kwargs)
        self.opened.append(cache)
        return cache

    def replica(self, tier: str = "tier", *, url: str | None = None, blobs: str | None = None, **kwargs: Any) -> Any:
        cache = aot.Cache(
            url or self.url, blob_location=blobs or self.blobs, read_only=True,
            local=self.root / tier, **kwargs,
        )
        self.opened.append(cache)
        return cache

    def close(self) -> None:
        for cache in self.opened:
            cache.close()


@pytest.fixture
def fleet(postgres_url: str, s3_url: str, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(postgres_url, s3_url, tmp_path)
    yield f
    f.close()


@pytest.fixture
def private_fleet(postgres_url: str, private_moto, tmp_path: Path) -> Iterator[tuple[Fleet, Any]]:  # noqa: ANN001
    """A fleet whose S3 server the test may stop."""
    server, _ = private_moto
    f = Fleet(postgres_url, "s3://private/blobs", tmp_path)
    yield f, server
    f.close()


@pytest.fixture
def remote_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every request the S3 blob store makes (reads, lookups, listings), by operation."""
    calls: list[str] = []
    for method in ("read", "exists", "stat", "list", "write", "touch", "delete"):
        real = getattr(FsspecObjectStore, method)

        def spy(self: Any, *args: Any, _real: Any = real, _name: str = method, **kwargs: Any) -> Any:
            if self.protocol == "s3":
                calls.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(FsspecObjectStore, method, spy)
    return calls


def dead_url(url: str) -> str:
    """``url`` with a port nobody listens on (whatever port the test server has)."""
    return sa_url.make_url(url).set(port=free_port()).render_as_string(hide_password=False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _check(fn: Any, compiled: Any, batches: Any = None) -> None:
    for batch in batches or compiled.MLP_BATCHES:
        out = fn(compiled.params, compiled.inputs[batch])
        np.testing.assert_array_equal(np.asarray(out), compiled.expected[batch])


def _store_mlp(cache: aot.Cache, compiled: Any, batches: Any = None) -> None:
    for batch in batches or compiled.MLP_BATCHES:
        cache.put(compiled.mlp[batch])


def test_cold_start_reads_each_missing_blob_once_and_a_warm_start_none(
    fleet: Fleet, compiled: Any, remote_reads: list[str]
) -> None:
    _store_mlp(fleet.remote(), compiled)
    remote_reads.clear()
    cold = fleet.replica()
    assert isinstance(cold, TieredCache) and isinstance(cold, aot.Cache)
    _check(aot.load(compiled.MLP_NAME, cache=cold, strict=True), compiled)
    blobs = {ref.digest for a in compiled.mlp.values() for ref in a.manifest.blobs.values()}
    assert sorted(remote_reads) == ["read"] * len(blobs)  # one GET per blob, nothing else
    cold.close()

    remote_reads.clear()
    warm = fleet.replica()
    _check(aot.load(compiled.MLP_NAME, cache=warm, strict=True), compiled)
    assert remote_reads == []
    tier = aot.Cache(fleet.root / "tier", read_only=True)
    assert sorted(e.key for e in tier.entries()) == sorted(a.manifest.key for a in compiled.mlp.values())
    assert tier.verify().ok
    tier.close()


def test_a_replica_serves_from_its_tier_while_s3_is_stopped(private_fleet, compiled, caplog) -> None:  # noqa: ANN001
    fleet, server = private_fleet
    remote = fleet.remote()
    _store_mlp(remote, compiled, (1, 2))
    _check(aot.load(compiled.MLP_NAME, cache=fleet.replica(), strict=True), compiled, (1, 2))
    remote.put(compiled.mlp[4])  # CI adds a bucket the tier has not seen yet
    server.stop()
    replica = fleet.replica()
    with caplog.at_level(logging.WARNING, logger="aot.cache.tiered"):
        fn = aot.load(compiled.MLP_NAME, cache=replica, strict=True)
    _check(fn, compiled, (1, 2))  # what the tier holds, strictly
    assert "did not answer" in caplog.text and str(fleet.root / "tier") in caplog.text
    with pytest.raises(SignatureNotFoundError):
        fn(compiled.params, compiled.inputs[4])


def test_a_replica_started_while_everything_remote_is_down(fleet: Fleet, compiled, caplog) -> None:  # noqa: ANN001
    _store_mlp(fleet.remote(), compiled)
    _check(aot.load(compiled.MLP_NAME, cache=fleet.replica(), strict=True), compiled)
    dead_db = dead_url(fleet.url)
    assert dead_db != fleet.url
    with caplog.at_level(logging.WARNING, logger="aot.cache.tiered"):
        replica = fleet.replica(url=dead_db, blobs=f"s3://nowhere-{free_port()}/x")
    assert replica.remote_error is not None and "unreachable" in caplog.text
    _check(aot.load(compiled.MLP_NAME, cache=replica, strict=True), compiled)
    with pytest.raises(CacheError, match="unreachable.*the local tier at .* serves what it holds"):
        replica.entries()
    # with nothing in its tier, a replica fails as it would without one
    with pytest.raises(CacheError, match="cannot open the cache index"):
        fleet.replica("empty-tier", url=dead_db)


def test_a_name_missing_from_the_tier_of_an_offline_replica_is_not_called_absent(fleet: Fleet, compiled) -> None:  # noqa: ANN001
    """Started while the index was down, a replica holds only its tier: a name stored at
    the remote but not in the tier may be there, and the error says so and what to do."""
    remote = fleet.remote()
    _store_mlp(remote, compiled, (1,))
    remote.compile(lambda x: x + 1, "f32[4]", name="h")  # stored at the remote only
    _check(aot.load(compiled.MLP_NAME, cache=fleet.replica(), strict=True), compiled, (1,))
    offline = fleet.replica(url=dead_url(fleet.url))
    assert offline.remote_error is not None
    with pytest.raises(SignatureNotFoundError) as caught:
        aot.load("h", cache=offline)
    message = str(caught.value)
    assert "nothing is stored" not in message
    assert message.startswith(
        f"aot.load('h'): 'h' is not in the local tier at {fleet.root / 'tier'}, and the remote cache "
    )
    assert "was unreachable when this cache was opened, so it may be stored there (" in message
    assert "Connection refused" in message
    assert "Check that the remote index is reachable (the URL, the network, the server), then open the cache again" in message


def test_a_replica_started_later_sees_new_entries(fleet: Fleet, compiled) -> None:  # noqa: ANN001
    remote = fleet.remote()
    _store_mlp(remote, compiled, (1,))
    first = aot.load(compiled.MLP_NAME, cache=fleet.replica(), strict=True)
    assert len(first.signatures) == 1
    remote.put(compiled.mlp[2])
    pinned = aot.load(compiled.MLP_NAME, cache=fleet.replica(refresh=False), strict=True)
    assert pinned.signatures == first.signatures  # refresh=False: the tier's rows
    later = aot.load(compiled.MLP_NAME, cache=fleet.replica(), strict=True)
    assert len(later.signatures) == 2
    _check(later, compiled, (1, 2))


def test_a_corrupt_local_copy_is_fetched_again(fleet: Fleet, compiled, remote_reads) -> None:  # noqa: ANN001
    _store_mlp(fleet.remote(), compiled, (1,))
    _check(aot.load(compiled.MLP_NAME, cache=fleet.replica(), strict=True), compiled, (1,))
    digest = compiled.mlp[1].manifest.blobs["executable"].digest
    path = fleet.root / "tier" / "blobs" / blob_path(digest)
    path.chmod(0o644)
    path.write_bytes(b"rotten")
    remote_reads.clear()
    _check(aot.load(compiled.MLP_NAME, cache=fleet.replica(), strict=True), compiled, (1,))
    assert remote_reads == ["read"]  # the executable again, nothing else
    tier = aot.Cache(fleet.root / "tier")
    assert tier.verify().ok
    tier.close()


def test_a_corrupt_remote_object_is_refused_and_never_executed(fleet: Fleet, compiled, monkeypatch) -> None:  # noqa: ANN001
    remote = fleet.remote()
    _store_mlp(remote, compiled, (1,))
    digest = compiled.mlp[1].manifest.blobs["executable"].digest
    from aot.cache.storage.content import compress

    remote.blobs.store.write(digest, compress(b"not the executable"))  # a valid frame, wrong bytes
    deserialized: list[str] = []
    import jax

    client_class = type(jax.devices()[0].client)
    real = client_class.deserialize_executable

    def spy(self: Any, serialized: Any, *args: Any, **kwargs: Any) -> Any:
        deserialized.append(hashlib.sha256(bytes(serialized)).hexdigest())
        return real(self, serialized, *args, **kwargs)

    monkeypatch.setattr(client_class, "deserialize_executable", spy)
    with pytest.raises(CorruptArtifactError, match=f"{digest}.*digest mismatch"):
        aot.load(compiled.MLP_NAME, cache=fleet.replica(), strict=True)
    assert digest not in deserialized
    tier = aot.Cache(fleet.root / "tier", read_only=True)
    assert tier.entries() == [] and not tier.blobs.has(digest)  # nothing kept
    tier.close()


def test_a_read_only_replica_keeps_its_statistics_in_its_tier(fleet: Fleet, compiled) -> None:  # noqa: ANN001
    remote = fleet.remote()
    _store_mlp(remote, compiled, (1,))
    replica = fleet.replica()
    fn = aot.load(compiled.MLP_NAME, cache=replica, strict=True)
    for _ in range(4):
        _check(fn, compiled, (1,))
    replica.close()
    assert read_stats(remote).rows == ()  # the remote is not written
    tier = aot.Cache(fleet.root / "tier")
    (row,) = read_stats(tier).rows
    assert (row.calls, row.loads) == (4, 1)
    assert tier.index.get(compiled.mlp[1].manifest.key).hits == 4
    tier.close()


def test_the_local_tier_must_be_a_folder(fleet: Fleet) -> None:
    with pytest.raises(CacheError, match="the local tier must be a folder"):
        aot.Cache(fleet.url, blob_location=fleet.blobs, local=fleet.blobs)


def test_a_replica_serves_the_remote_ref_and_keeps_it_when_the_remote_is_down(fleet: Fleet) -> None:
    """The tier records the remote's refs: offline, it serves the key the remote
    declared, not the row it fetched last nor the newest."""
    import jax

    from aot.cache.index.refs import RefOrigin

    def v1(x):  # noqa: ANN001, ANN202
        return jax.nn.gelu(x) * 3.0

    def v2(x):  # noqa: ANN001, ANN202
        return jax.nn.relu(x) * 3.0

    x = np.linspace(-3.0, 3.0, 8, dtype=np.float32)
    remote = fleet.remote()
    e1 = remote.compile_entry(v1, "f32[8]", name="act.tier").entry
    e2 = remote.compile_entry(v2, "f32[8]", name="act.tier").entry
    remote.set_refs([e2], RefOrigin("test v2"))
    np.testing.assert_array_equal(np.asarray(aot.load("act.tier", cache=fleet.replica(), strict=True)(x)),
                                  np.asarray(jax.jit(v2)(x)))
    remote.set_refs([e1], RefOrigin("test back to v1"))
    replica = fleet.replica()
    np.testing.assert_array_equal(np.asarray(aot.load("act.tier", cache=replica, strict=True)(x)),
                                  np.asarray(jax.jit(v1)(x)))
    assert [r.key for r in replica.local.refs_named("act.tier")] == [e1.key]
    held = {e.key for e in replica.local.entries("act.tier")}
    assert held == {e1.key, e2.key}
    offline = fleet.replica(url=dead_url(fleet.url),
                            blobs=f"s3://nowhere-{free_port()}/x")
    assert offline.remote_error is not None
    np.testing.assert_array_equal(np.asarray(aot.load("act.tier", cache=offline, strict=True)(x)),
                                  np.asarray(jax.jit(v1)(x)))
