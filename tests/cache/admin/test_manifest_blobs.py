"""Each entry's manifest is a blob (schema 10): verify's notes, and the rows ``aot repair``
rebuilds from the blob store (only from a manifest whose blobs are intact and whose
signature verifies with the cache's key)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import aot
from aot.cache.admin.lost import LostKind
from aot.cache.admin.manifest_blobs import rebuild_rows


def test_the_manifest_blob_holds_the_rows_exact_text(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    entry = cache.put(compiled.tiny)
    assert entry.manifest_digest == hashlib.sha256(entry.manifest.encode()).hexdigest()
    assert cache.blobs.get(entry.manifest_digest) == entry.manifest.encode()


def test_verify_notes_an_entry_without_its_manifest_blob_and_a_store_writes_it(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    entry = cache.put(compiled.tiny)
    cache.blobs.delete(entry.manifest_digest)  # as a row stored before schema 10 has it
    report = cache.verify()
    assert report.ok and report.quarantined == () and report.problems == ()
    assert report.notes == (
        f"tiny ({entry.key[:12]}): manifest not in the blob store (written before format 10): "
        "repair cannot rebuild this entry",
    )
    again = cache.put(compiled.tiny)  # present: the row is kept, its manifest blob written
    assert again.key == entry.key and cache.blobs.get(entry.manifest_digest) == entry.manifest.encode()
    assert cache.verify().notes == ()


def test_a_manifest_is_rebuilt_only_with_its_blobs_intact_and_its_signature_valid(tmp_path: Path, compiled) -> None:  # noqa: ANN001
    with aot.Cache(tmp_path / "cache", signing_key=b"the cache's key") as cache:
        entry = cache.put(compiled.tiny)
        stats = list(cache.blobs.list())
        found = rebuild_rows(cache.blobs, stats, set(), signing_key=b"the cache's key")
        assert [e.key for e in found.entries] == [entry.key] and found.refused == ()
        (rebuilt,) = found.entries
        assert (rebuilt.manifest, rebuilt.manifest_digest, rebuilt.exe_digest, rebuilt.hlo_digest, rebuilt.stored_size) \
            == (entry.manifest, entry.manifest_digest, entry.exe_digest, entry.hlo_digest, entry.stored_size)
        assert set(found.blobs) == {entry.exe_digest, entry.hlo_digest, entry.manifest_digest}

        assert rebuild_rows(cache.blobs, stats, {entry.key}).entries == ()  # a salvaged row: not twice
        other = rebuild_rows(cache.blobs, stats, set(), signing_key=b"another key")
        assert other.entries == () and len(other.refused) == 1
        (refused,) = other.refused
        assert refused.kind is LostKind.REFUSED and refused.table == "artifacts"
        assert refused.subject == f"tiny ({entry.key[:12]})"
        assert "its signature does not verify with this cache's key" in refused.line()

        assert entry.exe_digest is not None
        cache.blobs.delete(entry.exe_digest)
        missing = rebuild_rows(cache.blobs, list(cache.blobs.list()), set(), signing_key=b"the cache's key")
        assert missing.entries == ()
        assert tuple(item.line() for item in missing.refused) == (
            f"artifacts: the entry tiny ({entry.key[:12]}): its manifest is in the blob store but its "
            f"executable blob {entry.exe_digest[:12]} is missing: not rebuilt",
        )
