"""Memory is bounded by what is declared: a lying zstd frame or a bomb is corrupt, and
reading one never holds more than the declared size (RSS measured in a child).

The child process runs one read on a store in ``tmp_path`` and prints how much its
peak RSS (``ru_maxrss``) grew over the read; the bound is the acceptance one,
``2 x declared + 64 MB``, or tighter where streaming makes it so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aot.cache.storage.content import PROBLEM_MISMATCH, PROBLEM_SIZE, ContentStore, compress, digest_of
from aot.cache.storage.database import SqlObjectStore
from aot.cache.storage.folder import FolderObjectStore, MemoryObjectStore
from aot.cache.storage.fsspec_store import open_fsspec_store
from aot.errors import CorruptArtifactError

from tests.cache.storage.zstd_frames import bomb, claiming
from tests.reliability.rss import run_measured

MB = 1024 * 1024
GIB = 1024 * MB
TIB = 1024 * GIB
DECLARED = 8_700  # about the blobs of a small entry
ORIGINAL = bytes(range(256)) * 34  # 8704 bytes, stands for an executable

# Reads one blob in a fresh process and prints the growth of its peak RSS in bytes.
CHILD = """
import json, resource, sys
from aot.cache.storage.content import ContentStore
from aot.cache.storage.folder import FolderObjectStore
from aot.errors import CorruptArtifactError

root, digest, size, call = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
store = ContentStore(FolderObjectStore(root, read_only=True))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    outcome = repr(getattr(store, call)(digest, size))[:200]
except CorruptArtifactError as exc:
    outcome = "CorruptArtifactError: " + str(exc)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grew": (after - before) * 1024, "outcome": outcome}))
"""


def peak_growth(root: Path, digest: str, size: int | None, call: str) -> tuple[int, str]:
    found = run_measured(CHILD, str(root), digest, json.dumps(size), call, timeout=120)
    return int(found["grew"]), str(found["outcome"])


@pytest.fixture(params=["folder", "memory", "database", "fsspec-file"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> ContentStore:
    """A content store over each kind of object store (streamed or read whole)."""
    if request.param == "folder":
        return ContentStore(FolderObjectStore(tmp_path / "blobs"))
    if request.param == "memory":
        return ContentStore(MemoryObjectStore())
    if request.param == "fsspec-file":
        return ContentStore(open_fsspec_store(f"file://{tmp_path / 'fs'}"))
    return ContentStore(SqlObjectStore.open(f"sqlite:///{tmp_path / 'blobs.sqlite'}"))


def test_a_frame_claiming_a_tebibyte_is_corrupt_not_a_memory_error(blobs: ContentStore) -> None:
    digest = digest_of(ORIGINAL)
    blobs.store.write(digest, claiming(ORIGINAL, TIB))  # 8 bytes of header changed
    with pytest.raises(CorruptArtifactError, match=r"frame header claims 1099511627776 bytes, only 8704 are declared"):
        blobs.get(digest, len(ORIGINAL))
    with pytest.raises(CorruptArtifactError, match=r"claims 1099511627776 bytes, more than a blob may have"):
        blobs.get(digest)  # no size declared: the documented cap
    problem = blobs.check(digest, len(ORIGINAL))
    assert problem is not None and problem.startswith(PROBLEM_SIZE), problem
    blobs.store_bytes(ORIGINAL)  # storing the bytes again repairs it
    assert blobs.get(digest, len(ORIGINAL)) == ORIGINAL


@pytest.mark.parametrize("content_size", [True, False], ids=["size-in-header", "no-size-in-header"])
def test_a_bomb_is_refused_at_the_declared_size(blobs: ContentStore, content_size: bool) -> None:
    digest = digest_of(ORIGINAL)
    blobs.store.write(digest, bomb(GIB, content_size=content_size))  # 32 KiB stored
    expected = r"claims 1073741824 bytes, only 8704 are declared" if content_size else r"inflates beyond the 8704 bytes declared"
    with pytest.raises(CorruptArtifactError, match=expected) as caught:
        blobs.get(digest, len(ORIGINAL))
    assert "aot verify" in str(caught.value)
    problem = blobs.check(digest, len(ORIGINAL))
    assert problem is not None and problem.startswith(PROBLEM_SIZE), problem


def test_a_smaller_frame_of_the_right_digest_but_another_size_is_corrupt(blobs: ContentStore) -> None:
    digest = blobs.put(ORIGINAL)
    assert blobs.get(digest, len(ORIGINAL)) == ORIGINAL
    assert blobs.check(digest, len(ORIGINAL) + 1) == f"{PROBLEM_SIZE}: 8704 bytes, 8705 are declared"


@pytest.mark.parametrize("call", ["get", "check"])
@pytest.mark.parametrize("payload", ["lying frame", "bomb", "bomb without size"])
def test_reading_a_hostile_blob_grows_rss_by_less_than_the_bound(tmp_path: Path, call: str, payload: str) -> None:
    root = tmp_path / "blobs"
    digest = digest_of(ORIGINAL)
    stored = {
        "lying frame": lambda: claiming(ORIGINAL, TIB),
        "bomb": lambda: bomb(2 * GIB),
        "bomb without size": lambda: bomb(2 * GIB, content_size=False),
    }[payload]()
    FolderObjectStore(root).write(digest, stored)
    grew, outcome = peak_growth(root, digest, len(ORIGINAL), call)
    assert grew < 2 * len(ORIGINAL) + 64 * MB, (grew, outcome)
    assert PROBLEM_SIZE in outcome, outcome


def test_verifying_a_large_blob_with_a_wrong_digest_holds_a_chunk_not_the_blob(tmp_path: Path) -> None:
    """Streaming: the digest is computed chunk by chunk, so checking a 256 MiB blob
    (incompressible, so its payload is as large) holds neither payload nor blob, and
    reading it holds the blob once, not twice."""
    root = tmp_path / "blobs"
    data = os.urandom(256 * MB)
    wrong = digest_of(b"something else")
    FolderObjectStore(root).write(wrong, compress(data, 1))
    del data
    grew, outcome = peak_growth(root, wrong, None, "check")
    assert outcome == repr(PROBLEM_MISMATCH)
    assert grew < 64 * MB, grew
    grew, outcome = peak_growth(root, wrong, 256 * MB, "get")
    assert "digest mismatch" in outcome
    assert grew < 256 * MB + 64 * MB, grew
