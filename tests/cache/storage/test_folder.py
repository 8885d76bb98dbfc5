"""Blob storage: ContentStore over every ObjectStore (round trip, dedup, verified reads,
corruption, repair, read-only), the folder store's disk errors, the ObjectStore
contract (ages, touch, batches), copies between stores, the error translator.
Picking a store by URL: test_locations.py."""

from __future__ import annotations

import datetime as dt
import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import zstandard

from aot.cache.storage import folder as blobs_mod
from aot.cache.storage.folder import FolderObjectStore
from aot.cache.storage.content import (
    DEFAULT_LEVEL,
    PROBLEM_MISMATCH,
    PROBLEM_MISSING,
    PROBLEM_UNDECODABLE,
    ContentStore,
    compress,
    digest_of,
)
from aot.cache.storage.objectstore import ObjectStore
from aot.errors import AotError, CacheError, CorruptArtifactError, ReadOnlyCacheError

BlobStore = ContentStore
ReadRaw = Callable[[BlobStore, str], "bytes | None"]
WriteRaw = Callable[[BlobStore, str, bytes], None]


def folder_store(root: Path, **kwargs: object) -> ContentStore:
    return ContentStore(FolderObjectStore(root), **kwargs)  # type: ignore[arg-type]

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
    assert isinstance(blob_store.store, ObjectStore)
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
    assert stored is not None and stored < len(executable_bytes) / 2


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


@pytest.mark.parametrize("bad", [
    "../../etc/passwd", "ABCDEF" * 10 + "ABCD", "ab", "g" * 64, "",
    "a" * 63 + "\n", "0" * 64 + "\n", "a" * 32 + "/" + "a" * 31, " " + "a" * 63, "\uff41" * 64,
])
def test_malformed_digests_are_refused(blob_store: BlobStore, bad: str) -> None:
    for op in (blob_store.get, blob_store.has, blob_store.delete, blob_store.check, blob_store.touch):
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
    store = folder_store(tmp_path)
    digest = store.put(COMPRESSIBLE)
    path = tmp_path / digest[:2] / f"{digest}.zst"
    assert store.store.path_for(digest) == path
    assert _all_files(tmp_path) == [path]
    assert (path.stat().st_mode & 0o777) == 0o444
    raw = path.read_bytes()
    assert zstandard.frame_content_size(raw) == len(COMPRESSIBLE)


def test_existing_good_blob_is_not_rewritten(tmp_path: Path) -> None:
    store = folder_store(tmp_path)
    digest = store.put(COMPRESSIBLE)
    before = store.store.path_for(digest).stat()
    folder_store(tmp_path, level=19).put(COMPRESSIBLE)
    after = store.store.path_for(digest).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_stray_files_are_never_blobs(tmp_path: Path) -> None:
    store = folder_store(tmp_path)
    digest = store.put(COMPRESSIBLE)
    other = digest_of(b"other")
    fan = tmp_path / other[:2]
    fan.mkdir(exist_ok=True)
    (fan / f".{other}.zst.1234.abcd.tmp").write_bytes(compress(b"other"))  # older layout's temp file
    (tmp_path / ".tmp").mkdir(exist_ok=True)
    (tmp_path / ".tmp" / f"{other}.1234.abcd.tmp").write_bytes(compress(b"other"))  # interrupted write
    (fan / f"{other}.zst.tmp").write_bytes(b"x")
    (tmp_path / "zz").mkdir()
    (tmp_path / "zz" / f"{other}.zst").write_bytes(compress(b"other"))  # wrong fan-out
    (tmp_path / digest[:2] / "README").write_text("not a blob")
    assert list(store.digests()) == [digest]
    assert not store.has(other)
    assert store.get(other) is None
    assert len(store.store.temp_files()) == 1


def test_stale_temp_files_are_removed_when_a_writer_opens_the_store(tmp_path: Path) -> None:
    store = FolderObjectStore(tmp_path)
    content = ContentStore(store)
    digest = content.put(COMPRESSIBLE)
    tmp = tmp_path / ".tmp" / f"{digest}.99.beef.tmp"
    tmp.write_bytes(b"partial")
    FolderObjectStore(tmp_path)  # may be a write in progress: kept
    FolderObjectStore(tmp_path, read_only=True)
    assert store.temp_files() == [tmp]
    os.utime(tmp, (0, 0))
    FolderObjectStore(tmp_path, read_only=True)  # a reader never deletes
    assert store.temp_files() == [tmp]
    FolderObjectStore(tmp_path)  # a writer removes what a dead writer left
    assert store.temp_files() == []
    assert content.get(digest) == COMPRESSIBLE


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
    store = folder_store(tmp_path)
    kept = store.put(b"already there")
    monkeypatch.setattr(blobs_mod.os, function, _fail_with(code))
    with pytest.raises(CacheError) as err:
        store.put(COMPRESSIBLE)
    monkeypatch.undo()
    message = str(err.value)
    assert os.strerror(code) in message and advice in message
    assert str(tmp_path) in message
    assert not isinstance(err.value, CorruptArtifactError)
    assert _all_files(tmp_path) == [store.store.path_for(kept)]
    assert store.store.temp_files() == []
    assert not store.has(digest_of(COMPRESSIBLE))
    assert store.put(COMPRESSIBLE) == digest_of(COMPRESSIBLE)  # works once the disk recovers


def test_unreadable_blob_is_a_cache_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = folder_store(tmp_path)
    digest = store.put(COMPRESSIBLE)

    def denied(*args: object, **kwargs: object) -> object:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr("builtins.open", denied)
    with pytest.raises(CacheError, match="Permission denied"):
        store.get(digest)


def test_read_only_folder_store_does_not_create_the_folder(tmp_path: Path) -> None:
    store = ContentStore(FolderObjectStore(tmp_path / "absent", read_only=True))
    assert list(store.digests()) == []
    assert store.get(digest_of(b"x")) is None
    assert not (tmp_path / "absent").exists()


def test_errors_are_aot_errors() -> None:
    assert issubclass(ReadOnlyCacheError, CacheError)
    assert issubclass(CorruptArtifactError, AotError)


# ----------------------------------------------------------------- the ObjectStore contract


def test_every_store_reports_sizes_and_ages_on_its_own_clock(blob_store: BlobStore) -> None:
    raw = blob_store.store
    before = raw.now()
    digest = blob_store.put(COMPRESSIBLE)
    other = blob_store.put(b"other bytes")
    absent = digest_of(b"absent")
    stats = raw.stat([digest, other, absent])
    assert set(stats) == {digest, other}
    assert stats[digest].stored_size == len(raw.read(digest) or b"")
    listed = {s.digest: s for s in raw.list()}
    assert listed == stats
    # ages are store.now() - modified, both on the store's clock (1 s of slack: the
    # SQLite clock has millisecond steps, file systems' mtimes their own granularity)
    assert before - dt.timedelta(seconds=1) <= stats[digest].modified <= raw.now() + dt.timedelta(seconds=1)
    assert raw.exists([digest, absent, other]) == {digest, other}


def test_touch_makes_a_blob_young_again(blob_store: BlobStore) -> None:
    digest = blob_store.put(COMPRESSIBLE)
    raw = blob_store.store
    _make_old(raw, digest)
    old = raw.stat([digest])[digest].modified
    assert raw.now() - old > dt.timedelta(hours=1)
    blob_store.put(COMPRESSIBLE)  # stored again: refreshed (the caller references it again)
    assert raw.now() - raw.stat([digest])[digest].modified < dt.timedelta(minutes=1)
    assert blob_store.get(digest) == COMPRESSIBLE


def _make_old(raw: ObjectStore, digest: str) -> None:
    """Make a stored blob two hours old, on its store's clock."""
    import sqlalchemy as sa

    from aot.cache.storage.folder import MemoryObjectStore
    from aot.cache.storage.database import SqlObjectStore
    from aot.cache.index.schema import BLOBS_DATA

    old = raw.now() - dt.timedelta(hours=2)
    if isinstance(raw, FolderObjectStore):
        os.utime(raw.path_for(digest), (old.timestamp(), old.timestamp()))
    elif isinstance(raw, MemoryObjectStore):
        raw._data[digest] = (raw._data[digest][0], old)
    elif isinstance(raw, SqlObjectStore):
        t = BLOBS_DATA
        with raw.engine.begin() as conn:
            conn.execute(sa.update(t).where(t.c.digest == digest).values(created_at=old))
    else:
        raise TypeError(raw)


def test_a_sql_store_stamps_and_reads_ages_on_the_database_clock(
    blob_store: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer whose clock is 15 minutes behind must not make its blobs look old (the
    stamp is the server's) and a gc whose clock is ahead must not see them as old."""
    from aot.cache.storage import database as dbblobs_mod
    from aot.cache.index import engine, gc_protocol, queries, schema, sql
    from aot.cache.storage.database import SqlObjectStore

    if not isinstance(blob_store.store, SqlObjectStore):
        pytest.skip("the database clock is the SQL store's")
    real = dt.datetime.now(dt.timezone.utc)
    for skew in (dt.timedelta(minutes=-15), dt.timedelta(hours=2)):

        class Skewed(dt.datetime):
            @classmethod
            def now(cls, tz=None):  # noqa: ANN001, ANN206
                return dt.datetime.now(tz) + skew

        # The client's clock, wherever it is read.
        for module in (schema, engine, queries, gc_protocol, sql, dbblobs_mod):
            if hasattr(module, "datetime"):
                monkeypatch.setattr(module, "datetime", Skewed)
        monkeypatch.setattr(schema, "utcnow", lambda: dt.datetime.now(dt.timezone.utc) + skew)
        digest = blob_store.put(COMPRESSIBLE + str(skew).encode())
        modified = blob_store.store.stat([digest])[digest].modified
        assert abs(modified - real) < dt.timedelta(minutes=1)
        assert abs(blob_store.now() - real) < dt.timedelta(minutes=1)
        monkeypatch.undo()


def test_copy_to_moves_payloads_as_stored_and_verifies_them(
    blob_store: BlobStore, tmp_path: Path, read_raw: ReadRaw, write_raw: WriteRaw,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aot.cache.storage import content as content_mod
    from aot.cache.storage.folder import MemoryObjectStore

    a = blob_store.put(COMPRESSIBLE)
    b = blob_store.put(b"second blob" * 100)
    target = ContentStore(MemoryObjectStore())
    kept = target.put(b"second blob" * 100)
    calls: list[int] = []
    real_compress = content_mod.compress
    monkeypatch.setattr(content_mod, "compress", lambda *a, **k: calls.append(1) or real_compress(*a, **k))
    report = blob_store.copy_to(target, [a, b, a])
    assert calls == []  # no recompression
    assert report.copied == (a,) and report.present == (kept,)
    assert target.store.read(a) == read_raw(blob_store, a)  # byte for byte
    assert report.bytes_copied == len(read_raw(blob_store, a) or b"")
    assert target.get(a) == COMPRESSIBLE
    assert blob_store.copy_to(target, [a, b]).copied == ()  # idempotent
    # a corrupt copy at the destination is repaired; a corrupt source is refused
    target.store.write(a, b"rot")
    assert blob_store.copy_to(target, [a]).copied == (a,)
    assert target.get(a) == COMPRESSIBLE
    write_raw(blob_store, b, compress(b"not the second blob"))
    fresh = ContentStore(MemoryObjectStore())
    with pytest.raises(CorruptArtifactError, match=b):
        blob_store.copy_to(fresh, [b])
    assert fresh.digests() == []
    with pytest.raises(CorruptArtifactError, match="missing"):
        blob_store.copy_to(fresh, [digest_of(b"never stored")])


def test_storage_errors_go_through_one_translator_with_an_extension_point(tmp_path: Path) -> None:
    from aot.cache.storage import objectstore

    class LibraryError(Exception):
        pass

    class Flaky(FolderObjectStore):
        def read(self, digest: str) -> bytes | None:
            raise LibraryError("throttled by the service")

        read_stream = read  # the streaming read the content store prefers

    store = ContentStore(Flaky(tmp_path))
    with pytest.raises(CacheError, match="LibraryError: throttled"):
        store.get(digest_of(b"x"))

    def translate(exc: BaseException, what: str, where: str) -> CacheError | None:
        if isinstance(exc, LibraryError):
            return CacheError(f"cannot {what} at {where}: {exc}; retry later")
        return None

    objectstore.register_error_translator(translate)
    try:
        with pytest.raises(CacheError, match="throttled by the service; retry later"):
            store.get(digest_of(b"x"))
    finally:
        objectstore._TRANSLATORS.remove(translate)
