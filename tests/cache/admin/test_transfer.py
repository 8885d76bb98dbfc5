"""Copying entries between caches (push / pull): blobs as stored, verified, idempotent,
under the gc protocol; from a folder cache to every backend and back."""

from __future__ import annotations

import numpy as np
import pytest

import aot
from aot.cache.admin.transfer import copy_entries


@pytest.fixture
def source(open_folder_cache, compiled):  # noqa: ANN001, ANN201
    cache = open_folder_cache()
    for artifact in compiled.all():
        cache.put(artifact)
    return cache


def test_copy_to_every_backend_and_back(cache: aot.Cache, source, compiled, tmp_path) -> None:  # noqa: ANN001
    report = copy_entries(source, cache, ["mlp.*"])
    assert sorted(report.copied) == sorted(a.manifest.key for a in compiled.mlp.values())
    assert report.skipped == report.failed == () and report.to_dict()["copied"] == 3
    for digest in cache.blobs.digests():  # byte for byte: no recompression
        assert cache.blobs.store.read(digest) == source.blobs.store.read(digest)
    fn = aot.load(compiled.MLP_NAME, cache=cache)
    for batch in compiled.MLP_BATCHES:
        np.testing.assert_array_equal(np.asarray(fn(compiled.params, compiled.inputs[batch])), compiled.expected[batch])
    again = copy_entries(source, cache)  # resumable: only what is missing
    assert again.copied == (compiled.tiny.manifest.key,) and len(again.skipped) == 3
    assert copy_entries(source, cache).to_dict()["copied"] == 0
    assert cache.verify().ok and cache.index.leased_digests() == set()
    back = aot.Cache(tmp_path / "back")
    try:
        assert len(copy_entries(cache, back).copied) == 4
        assert back.verify().ok
    finally:
        back.close()


def test_copy_repairs_and_refuses_damage(cache: aot.Cache, source, compiled) -> None:  # noqa: ANN001
    copy_entries(source, cache)
    entry = cache.entries(compiled.TINY_NAME)[0]
    cache.blobs.delete(entry.exe_digest)
    report = copy_entries(source, cache)
    assert report.repaired == (entry.key,) and len(report.skipped) == 3
    assert cache.verify().ok
    # a damaged source blob: that entry fails, named; nothing of it is committed
    other = source.entries(compiled.TINY_NAME)[0]
    source.blobs.store.write(other.exe_digest, b"rot")
    cache.index.delete([entry.key])
    cache.blobs.delete(entry.exe_digest)  # (an intact copy there would be used instead)
    report = copy_entries(source, cache)
    assert [k for k, _ in report.failed] == [other.key] and "corrupt" in report.failed[0][1]
    assert cache.index.get(other.key) is None and cache.index.leased_digests() == set()
