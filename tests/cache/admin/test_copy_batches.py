"""Copies in batches (cache/admin/copy_batches.py): a push of many entries over few
blobs looks at each blob once per batch and verifies it once per run, not once per
entry; rows commit per batch, after their blobs, keeping the source's compile time;
an interrupted batch leaves no row and its blobs are not copied again."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

import aot
from aot.cache.admin import copy_batches
from aot.cache.admin.transfer import copy_entries
from aot.cache.pauses import set_hook
from aot.cache.storage.folder import FolderObjectStore


def many_entries(cache: aot.Cache, n: int) -> None:
    """``n`` more rows in ``cache``, each its own key, name and manifest, all over the
    blobs of the entries stored there (as a fleet's many names over few executables)."""
    from aot.artifact import Manifest
    from aot.fingerprint import Fingerprint, combined_key

    real = cache.index.entries()
    rows = []
    for i in range(n):
        base = real[i % len(real)]
        manifest = Manifest.from_json(base.manifest)
        name = f"many.n{i:04d}"
        parts = {**manifest.program.as_dict(), "name": name, "copy": str(i)}
        program = Fingerprint.of(manifest.program.kind, parts)
        key = combined_key(program, manifest.environment)
        manifest = dataclasses.replace(manifest, name=name, program=program, key=key)
        rows.append(dataclasses.replace(base, key=key, name=name, program_fp=program.digest, manifest=manifest.to_json()))
    cache.index.bulk_insert(rows)


@pytest.fixture
def source(open_folder_cache, compiled):  # noqa: ANN001, ANN201
    cache = open_folder_cache()
    cache.put(compiled.tiny)
    many_entries(cache, 2 * copy_batches.BATCH + 9)  # three batches after the first entry
    return cache


@pytest.fixture
def store_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, str]]:
    """(store location, method) -> calls, for the folder stores' reads and writes."""
    calls: Counter[tuple[str, str]] = Counter()
    for method in ("read", "read_stream", "stat", "exists", "write"):
        real = getattr(FolderObjectStore, method)

        def spy(self, *args, _real=real, _method=method, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            calls[self.location, _method] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(FolderObjectStore, method, spy)
    return calls


def test_a_push_of_many_entries_reads_each_blob_once(source, store_calls, tmp_path: Path) -> None:  # noqa: ANN001
    n = len(source.index.entries())
    # The blobs the entries share, and a manifest blob each in the destination (the
    # source's rows, but for the first one, were inserted without theirs).
    digests = {d for e in source.index.entries() for d in (e.exe_digest, e.hlo_digest) if d}
    digests |= {hashlib.sha256(e.manifest.encode()).hexdigest() for e in source.index.entries()}
    dest = aot.Cache(tmp_path / "dest")
    try:
        where = dest.blobs.location
        report = copy_entries(source, dest, jobs=2)
        assert (len(report.copied), report.skipped, report.failed) == (n, (), ())
        reads = store_calls[where, "read"] + store_calls[where, "read_stream"]
        # One copy per distinct blob, and each looked at a handful of times, not once
        # per entry (a copy entry by entry read every blob of every entry: 2 x n).
        assert store_calls[where, "write"] == len(digests) == 2 + n  # the shared two, a manifest each
        assert reads <= 2 * len(digests), dict(store_calls)
        assert store_calls[where, "stat"] <= 2 * (n // copy_batches.BATCH + 2), dict(store_calls)
        # Copies keep their identity: the source's compile time, every row, every blob.
        stored = {e.key: e for e in dest.index.entries()}
        assert {k: e.created_at for k, e in stored.items()} == {e.key: e.created_at for e in source.index.entries()}
        assert dest.verify().ok and dest.index.leased_digests() == set()

        store_calls.clear()
        again = copy_entries(source, dest, jobs=2)
        assert (again.copied, len(again.skipped)) == ((), n)
        reads = store_calls[where, "read"] + store_calls[where, "read_stream"]
        assert store_calls[where, "write"] == 0 and reads <= 2 * len(digests), dict(store_calls)
    finally:
        dest.close()


def test_an_interrupted_batch_commits_no_row_and_the_next_copy_writes_no_blob_again(
    source, store_calls, tmp_path: Path,  # noqa: ANN001
) -> None:
    n = len(source.index.entries())
    dest = aot.Cache(tmp_path / "dest")

    def stop(point: str) -> None:
        if point == "copy.blobs_ready":
            raise KeyboardInterrupt  # the user's ^C after the first batch's blobs

    previous = set_hook(stop)
    try:
        with pytest.raises(KeyboardInterrupt):
            copy_entries(source, dest, jobs=2)
    finally:
        set_hook(previous)
    try:
        where = dest.blobs.location
        rows = dest.index.entries()
        assert len(rows) == 1  # the first entry (copied alone); no row of the batch
        assert all(dest.blobs.check(d) is None for r in rows for d in (r.exe_digest, r.hlo_digest) if d)
        assert dest.index.leased_digests() == set()  # given back
        written = store_calls[where, "write"]
        # Every blob of the first batch arrived before the interruption: the two the
        # entries share, the first entry's manifest and the batch's manifests.
        assert written == 3 + copy_batches.BATCH
        resumed = copy_entries(source, dest, jobs=2)
        assert (len(resumed.copied), len(resumed.skipped), resumed.failed) == (n - 1, 1, ())
        # Nothing written again: only the manifests of the batches not reached.
        assert store_calls[where, "write"] == written + (n - 1 - copy_batches.BATCH)
        assert dest.verify().ok
    finally:
        dest.close()


def test_an_expired_lease_starts_the_batch_over(source, tmp_path: Path) -> None:  # noqa: ANN001
    """gc took the batch's expired lease before its rows were committed: the batch's
    blobs are looked at again (gc may have deleted them) and the rows committed."""
    dest = aot.Cache(tmp_path / "dest")
    taken = []

    def expire(point: str) -> None:
        if point == "copy.blobs_ready" and not taken:  # gc, once the lease expired
            with sqlite3.connect(tmp_path / "dest" / "index.sqlite") as conn:
                taken.append(conn.execute("DELETE FROM blob_leases").rowcount)
            dest.blobs.delete(dest.blobs.digests())

    previous = set_hook(expire)
    try:
        report = copy_entries(source, dest)
    finally:
        set_hook(previous)
    try:
        assert taken and taken[-1] > 0
        assert (len(report.copied), report.failed) == (len(source.index.entries()), ())
        assert dest.verify().ok and dest.index.leased_digests() == set()
    finally:
        dest.close()


def test_a_store_failing_midway_fails_the_entries_named_and_gives_the_leases_back(
    source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    n = len(source.index.entries())
    dest = aot.Cache(tmp_path / "dest")
    try:
        copy_entries(source, dest, ["tiny"])  # one entry there, the rest to copy

        def down(self, digests):  # noqa: ANN001, ANN202
            raise OSError(errno.EIO, "input/output error")

        monkeypatch.setattr(FolderObjectStore, "stat", down)
        report = copy_entries(source, dest)
        # The first entry goes alone (its blobs read, not stat'ed); in the batches, the
        # row there and the entries to copy fail, each named, and the push reports.
        first = source.index.entries()[0]
        assert report.copied == (first.key,) and len(report.failed) == n - 1
        assert source.entries("tiny")[0].key in dict(report.failed)
        assert all("input/output error" in why for _, why in report.failed), report.failed[:2]
        assert dest.index.leased_digests() == set() and len(dest.index.entries()) == 2
        monkeypatch.undo()
        again = copy_entries(source, dest)  # the store is back: the rest is copied
        assert (len(again.copied), len(again.skipped), again.failed) == (n - 2, 2, ())
    finally:
        dest.close()
