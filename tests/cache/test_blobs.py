"""Blob stores: round trip, dedup, verified reads, corruption, read-only, disk errors."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import zstandard

from aot.cache import blobs as blobs_mod
from aot.cache.blobs import (
    DEFAULT_LEVEL,
    PROBLEM_MISMATCH,
    PROBLEM_MISSING,
    PROBLEM_UNDECODABLE,
    BlobStore,
    FolderBlobStore,
    compress,
    digest_of,
)
from aot.errors import AotError, CacheError, CorruptArtifactError, ReadOnlyCacheError

ReadRaw = Callable[[BlobStore, str], "bytes | None"]
WriteRaw = Callable[[BlobStore, str, bytes], None]

COMPRESSIBLE = b"HloModule jit_forward, entry_computation_layout={(f32[8,128])->f32[8,128]}\n" * 400


@pytest.fixture(scope="module")
def executable_bytes() -> bytes:
    """A real serialized XLA CPU executable (what the cache stores most)."""

    def mlp(w: jax.Array, x: jax.Array) -> jax.Array:
        return jax.nn.relu(x @ w).sum(axis=0)

    compiled = jax.jit(mlp).lower(
        jax.ShapeDtypeStruct((64, 32), jnp.float32), jax.ShapeDtypeStruct((16, 64), jnp.float32)
    ).compile()
    xla = compiled._executable.xla_executable
    return bytes(xla.client.serialize_executable(xla))


def test_digest_is_sha256_of_uncompressed_bytes() -> None:
    assert digest_of(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert DEFAULT_LEVEL == 3


def test_round_trip(blob_store: BlobStore) -> None:
    assert isinstance(blob_store, BlobStore)
    digest = blob_store.put(COMPRESSIBLE)
    assert digest == digest_of(COMPRESSIBLE)
    assert blob_store.has(digest)
    assert blob_store.get(digest) == COMPRESSIBLE
    assert blob_store.check(digest) is None
    assert list(blob_store.digests()) == [digest]
    stored = blob_store.stored_size(digest)
    assert stored is not None and 0 < stored < len(COMPRESSIBLE) // 10


def test_real_executable_round_trips_compressed(blob_store: BlobStore, executable_bytes: bytes) -> None:
    digest = blob_store.put(executable_bytes)
    assert blob_store.get(digest) == executable_bytes
    stored = blob_store.stored_size(digest)
    assert stored is not None and stored < len(executable_bytes) / 2  # measured ratio ~3x


def test_identical_bytes_are_stored_once(blob_store: BlobStore, read_raw: ReadRaw) -> None:
    d1 = blob_store.put(COMPRESSIBLE)
    before = read_raw(blob_store, d1)
    d2 = blob_store.put(bytes(COMPRESSIBLE))
    d3 = blob_store.put(b"something else")
    assert d1 == d2 != d3
    assert sorted(blob_store.digests()) == sorted({d1, d3})
    assert read_raw(blob_store, d1) == before


def test_absent_blob(blob_store: BlobStore) -> None:
    digest = digest_of(b"never stored")
    assert blob_store.get(digest) is None
    assert not blob_store.has(digest)
    assert blob_store.stored_size(digest) is None
    assert blob_store.check(digest) == PROBLEM_MISSING
    assert blob_store.delete(digest) == 0


def test_delete_frees_the_stored_bytes(blob_store: BlobStore) -> None:
    digest = blob_store.put(COMPRESSIBLE)
    keep = blob_store.put(b"keep me")
    size = blob_store.stored_size(digest)
    assert blob_store.delete(digest) == size
    assert not blob_store.has(digest)
    assert blob_store.get(digest) is None
    assert list(blob_store.digests()) == [keep]
    assert blob_store.delete(digest) == 0


def test_flipped_byte_is_detected(blob_store: BlobStore, read_raw: ReadRaw, write_raw: WriteRaw) -> None:
    digest = blob_store.put(COMPRESSIBLE)
    raw = bytearray(read_raw(blob_store, digest) or b"")
    raw[len(raw) // 2] ^= 0x40
    write_raw(blob_store, digest, bytes(raw))
    assert blob_store.check(digest) in (PROBLEM_MISMATCH, PROBLEM_UNDECODABLE)
    with pytest.raises(CorruptArtifactError) as err:
        blob_store.get(digest)
    assert digest in str(err.value) and "aot verify" in str(err.value)


def test_wrong_content_is_a_digest_mismatch(
    blob_store: BlobStore, write_raw: WriteRaw
) -> None:
    digest = blob_store.put(COMPRESSIBLE)
    write_raw(blob_store, digest, compress(b"a valid frame of other bytes"))
    assert blob_store.check(digest) == PROBLEM_MISMATCH
    with pytest.raises(CorruptArtifactError, match="digest mismatch"):
        blob_store.get(digest)


def test_truncated_blob_is_detected(
    blob_store: BlobStore, read_raw: ReadRaw, write_raw: WriteRaw
) -> None:
    digest = blob_store.put(COMPRESSIBLE)
    raw = read_raw(blob_store, digest) or b""
    write_raw(blob_store, digest, raw[: len(raw) // 2])
    assert blob_store.check(digest) == PROBLEM_UNDECODABLE
    with pytest.raises(CorruptArtifactError, match="truncated"):
        blob_store.get(digest)
    write_raw(blob_store, digest, b"")
    assert blob_store.check(digest) == PROBLEM_UNDECODABLE


def test_put_heals_a_corrupt_blob(
    blob_store: BlobStore, read_raw: ReadRaw, write_raw: WriteRaw
) -> None:
    digest = blob_store.put(COMPRESSIBLE)
    good = read_raw(blob_store, digest)
    write_raw(blob_store, digest, b"\x00garbage")
    assert blob_store.put(COMPRESSIBLE) == digest
    assert blob_store.get(digest) == COMPRESSIBLE
    assert read_raw(blob_store, digest) == good


@pytest.mark.parametrize("bad", ["../../etc/passwd", "ABCDEF" * 10 + "ABCD", "ab", "g" * 64, ""])
def test_malformed_digests_are_refused(blob_store: BlobStore, bad: str) -> None:
    for op in (blob_store.get, blob_store.has, blob_store.delete, blob_store.check):
        with pytest.raises(CorruptArtifactError, match="invalid blob digest"):
            op(bad)


def test_read_only_store_refuses_writes(
    blob_store: BlobStore, reopen_read_only: Callable[[BlobStore], BlobStore]
) -> None:
    digest = blob_store.put(COMPRESSIBLE)
    ro = reopen_read_only(blob_store)
    assert ro.read_only
    assert ro.get(digest) == COMPRESSIBLE
    with pytest.raises(ReadOnlyCacheError, match="read-only"):
        ro.put(b"new bytes")
    with pytest.raises(ReadOnlyCacheError):
        ro.put(COMPRESSIBLE)
    with pytest.raises(ReadOnlyCacheError):
        ro.delete(digest)
    assert list(blob_store.digests()) == [digest]


def test_concurrent_puts_of_the_same_bytes(blob_store: BlobStore) -> None:
    barrier = threading.Barrier(8)
    results: list[str] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait()
            results.append(blob_store.put(COMPRESSIBLE))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert set(results) == {digest_of(COMPRESSIBLE)}
    assert list(blob_store.digests()) == [digest_of(COMPRESSIBLE)]
    assert blob_store.get(digest_of(COMPRESSIBLE)) == COMPRESSIBLE


# ----------------------------------------------------------------- folder store only


def _all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_folder_layout(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path)
    digest = store.put(COMPRESSIBLE)
    path = tmp_path / digest[:2] / f"{digest}.zst"
    assert store.path_for(digest) == path
    assert _all_files(tmp_path) == [path]
    assert (path.stat().st_mode & 0o777) == 0o444
    raw = path.read_bytes()
    assert zstandard.frame_content_size(raw) == len(COMPRESSIBLE)


def test_existing_good_blob_is_not_rewritten(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path)
    digest = store.put(COMPRESSIBLE)
    before = store.path_for(digest).stat()
    FolderBlobStore(tmp_path, level=19).put(COMPRESSIBLE)
    after = store.path_for(digest).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_stray_files_are_never_blobs(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path)
    digest = store.put(COMPRESSIBLE)
    other = digest_of(b"other")
    fan = tmp_path / other[:2]
    fan.mkdir(exist_ok=True)
    (fan / f".{other}.zst.1234.abcd.tmp").write_bytes(compress(b"other"))  # interrupted write
    (fan / f"{other}.zst.tmp").write_bytes(b"x")
    (tmp_path / "zz").mkdir()
    (tmp_path / "zz" / f"{other}.zst").write_bytes(compress(b"other"))  # wrong fan-out
    (tmp_path / digest[:2] / "README").write_text("not a blob")
    assert list(store.digests()) == [digest]
    assert not store.has(other)
    assert store.get(other) is None
    assert len(store.temp_files()) == 1


def test_stale_temp_files_are_removed(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path)
    digest = store.put(COMPRESSIBLE)
    tmp = tmp_path / digest[:2] / f".{digest}.zst.99.beef.tmp"
    tmp.write_bytes(b"partial")
    assert store.remove_stale_temp_files(older_than_seconds=3600) == 0  # may be in progress
    os.utime(tmp, (0, 0))
    assert store.remove_stale_temp_files(older_than_seconds=3600) == len(b"partial")
    assert store.temp_files() == []
    assert store.get(digest) == COMPRESSIBLE


def _fail_with(code: int) -> Callable[..., object]:
    def fail(*args: object, **kwargs: object) -> object:
        raise OSError(code, os.strerror(code))

    return fail


@pytest.mark.parametrize(
    ("function", "code", "advice"),
    [
        ("write", errno.ENOSPC, "free disk space"),
        ("fsync", errno.ENOSPC, "free disk space"),
        ("replace", errno.EACCES, "permissions"),
        ("open", errno.EROFS, "read-only"),
    ],
)
def test_disk_errors_become_cache_errors_without_leftovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, function: str, code: int, advice: str
) -> None:
    store = FolderBlobStore(tmp_path)
    kept = store.put(b"already there")
    monkeypatch.setattr(blobs_mod.os, function, _fail_with(code))
    with pytest.raises(CacheError) as err:
        store.put(COMPRESSIBLE)
    monkeypatch.undo()
    message = str(err.value)
    assert os.strerror(code) in message and advice in message
    assert str(tmp_path) in message
    assert not isinstance(err.value, CorruptArtifactError)
    assert _all_files(tmp_path) == [store.path_for(kept)]
    assert store.temp_files() == []
    assert not store.has(digest_of(COMPRESSIBLE))
    assert store.put(COMPRESSIBLE) == digest_of(COMPRESSIBLE)  # works once the disk recovers


def test_unreadable_blob_is_a_cache_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FolderBlobStore(tmp_path)
    digest = store.put(COMPRESSIBLE)

    def denied(*args: object, **kwargs: object) -> object:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr("builtins.open", denied)
    with pytest.raises(CacheError, match="Permission denied"):
        store.get(digest)


def test_read_only_folder_store_does_not_create_the_folder(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path / "absent", read_only=True)
    assert list(store.digests()) == []
    assert store.get(digest_of(b"x")) is None
    assert not (tmp_path / "absent").exists()


def test_errors_are_aot_errors() -> None:
    assert issubclass(ReadOnlyCacheError, CacheError)
    assert issubclass(CorruptArtifactError, AotError)
