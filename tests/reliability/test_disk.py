"""Full disks and unwritable folders: a clear error, the index unchanged, nothing
half-written visible.

The tests run as root, where ``chmod`` does not stop writes, so an unwritable or full
blob folder is simulated by injecting ``OSError`` (ENOSPC, EDQUOT, EACCES, EROFS, EIO)
into the blob store's own ``os`` calls (``open``, ``write``, ``fsync``, ``replace``),
and, where ``mount`` works, by a real 1 MiB tmpfs that fills up and by a tmpfs
remounted read-only.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import types
from pathlib import Path
from typing import Any, Iterator

import pytest

import aot
from aot.cache.storage import folder as blobs_module
from aot.cache.cache import Cache

from tests.reliability import reliability_workers as workers
from tests.reliability.helpers import TinyArtifacts, check_scaled, snapshot

ERRORS = {
    errno.ENOSPC: "free disk space",
    errno.EDQUOT: "free disk space",
    errno.EACCES: "fix the permissions",
    errno.EROFS: "read-only",
    errno.EIO: "check the cache folder",
}


class FailingOs(types.SimpleNamespace):
    """The blob module's view of ``os``: ``call`` fails with ``err`` while the store
    writes its ``nth`` blob (1: the executable, 2: the portable HLO) of a put."""

    def __init__(self, call: str, nth: int, err: int) -> None:
        super().__init__()
        self._call, self._nth, self._err = call, nth, err
        self.blob = 0
        self.tmp_fd = -1
        self.failed = False

    def _fail(self, call: str) -> None:
        if call == self._call and self.blob == self._nth and not self.failed:
            self.failed = True
            raise OSError(self._err, os.strerror(self._err))

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        is_temp = str(path).endswith(".tmp")
        if is_temp:
            self.blob += 1
            self._fail("open")
        fd = os.open(path, flags, *args, **kwargs)
        if is_temp:
            self.tmp_fd = fd
        return fd

    def write(self, fd: int, data: Any) -> int:
        if fd == self.tmp_fd:
            self._fail("write")
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        if fd == self.tmp_fd:
            self._fail("fsync")
        os.fsync(fd)

    def replace(self, src: Any, dst: Any) -> None:
        self._fail("replace")
        os.replace(src, dst)


def state(cache: Cache) -> tuple[Any, ...]:
    """What a failed put must not change: rows, blob rows, visible blobs."""
    return (
        [(e.key, e.state, e.exe_digest, e.hlo_digest) for e in cache.index.entries()],
        [r.digest for r in cache.index.blob_rows()],
        sorted(cache.blobs.digests()),
    )


@pytest.fixture
def cache(tmp_path: Path, tiny: TinyArtifacts) -> Iterator[Cache]:
    with Cache(tmp_path / "cache") as c:
        c.put_artifact(tiny.by_size[1])
        yield c


@pytest.mark.parametrize("err", sorted(ERRORS), ids=[errno.errorcode[e] for e in sorted(ERRORS)])
@pytest.mark.parametrize("call", ["open", "write", "fsync", "replace"])
@pytest.mark.parametrize("nth", [1, 2], ids=["executable blob", "hlo blob"])
def test_blob_write_fails(
    call: str, nth: int, err: int, cache: Cache, tiny: TinyArtifacts, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = state(cache)
    artifact = tiny.by_size[2]
    failing = FailingOs(call, nth, err)
    monkeypatch.setattr(blobs_module, "os", failing)
    with pytest.raises(aot.CacheError) as caught:
        cache.put_artifact(artifact)
    monkeypatch.undo()
    assert failing.failed
    message = str(caught.value)
    assert not isinstance(caught.value, aot.ReadOnlyCacheError)
    assert TinyArtifacts.NAME in message and artifact.manifest.key[:12] in message, message
    assert os.strerror(err) in message and f"errno {err}" in message, message
    assert ERRORS[err] in message, message
    # no temp file is left, the index is unchanged
    assert cache.blobs.store.temp_files() == []
    rows, blob_rows, visible = state(cache)
    assert (rows, blob_rows) == before[:2]
    # nothing half-written is visible: a blob that did appear (the executable, when
    # the second write failed) is complete, and only an orphan that gc collects
    new = set(visible) - set(before[2])
    assert all(cache.blobs.check(d) is None for d in new)
    assert new <= set(cache.verify(quarantine=False).orphan_blobs)
    assert len(new) == (nth - 1)
    # the next put, with the disk back, succeeds
    entry = cache.put_artifact(artifact)
    check_scaled(cache.load(entry), 2)
    assert cache.verify().ok


def test_failing_folder_creation(cache: Cache, tiny: TinyArtifacts, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fan-out folder of a new blob cannot be created (EACCES)."""
    before = state(cache)
    real_mkdir = Path.mkdir

    def mkdir(self: Path, *args: Any, **kwargs: Any) -> None:
        if self.parent == cache.blobs.store.root:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(aot.CacheError) as caught:
        cache.put_artifact(tiny.by_size[3])
    monkeypatch.undo()
    assert "fix the permissions" in str(caught.value) and TinyArtifacts.NAME in str(caught.value)
    assert state(cache) == before


def test_read_only_cache(tmp_path: Path, tiny: TinyArtifacts) -> None:
    """Cache(read_only=True): writes refused with a clear error, nothing on disk changes,
    loading and compiling (without storing) still work."""
    location = tmp_path / "cache"
    with Cache(location) as writer:
        for n in (1, 2):
            writer.put_artifact(tiny.by_size[n])
    before = snapshot(location)
    with Cache(location, read_only=True) as cache:
        with pytest.raises(aot.ReadOnlyCacheError) as caught:
            cache.put_artifact(tiny.by_size[3])
        assert "read-only" in str(caught.value) and "read_only=True" in str(caught.value)
        with pytest.raises(aot.ReadOnlyCacheError):
            cache.gc()
        with pytest.raises(aot.ReadOnlyCacheError):
            cache.import_bundle(tmp_path / "nothing.bundle")
        for entry in cache.entries():
            check_scaled(cache.load(entry), int(entry.signature[4:-1]))
        exe = cache.compile(workers.scaled, aot.spec("f32[3]"), name=TinyArtifacts.NAME)
        check_scaled(exe, 3)
        fn = aot.load(TinyArtifacts.NAME, cache)
        check_scaled(fn, 2)
        report = cache.verify()
        assert report.ok and report.quarantined == ()
        assert len(cache.entries()) == 2
    # Nothing at all: a read-only open creates no -wal/-shm side files either.
    assert snapshot(location) == before


# ---------------------------------------------------------------- a real full disk


def mount_tmpfs(mount_point: Path, size: str) -> None:
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); "
                    "the injected-OSError tests cover full and read-only disks")


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB file system (root can mount one; otherwise the test skips). Big
    enough for SQLite's write-ahead log of the puts after space is freed: each put is
    two write transactions since writers lease their blobs (the WAL is reused, never
    shrunk, between checkpoints)."""
    mount_point = tmp_path / "tmpfs"
    mount_tmpfs(mount_point, "2m")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_cache_on_a_read_only_file_system(tmp_path: Path, tiny: TinyArtifacts) -> None:
    """A cache shipped on a read-only mount (a container image, a ro volume): opened
    read-only it serves; opened read-write it fails with a clear error."""
    mount_point = tmp_path / "ro"
    mount_tmpfs(mount_point, "4m")
    try:
        location = mount_point / "cache"
        with Cache(location) as writer:
            for n in (1, 2):
                writer.put_artifact(tiny.by_size[n])
        remount = subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], capture_output=True, text=True)
        if remount.returncode != 0:
            pytest.skip(f"cannot remount read-only: {remount.stderr.strip()}")
        with Cache(location, read_only=True) as cache:
            fn = aot.load(TinyArtifacts.NAME, cache, strict=True)
            check_scaled(fn, 1)
            check_scaled(fn, 2)
            assert cache.verify().ok
            with pytest.raises(aot.ReadOnlyCacheError):
                cache.put_artifact(tiny.by_size[3])
        with pytest.raises(aot.CacheError) as caught:
            Cache(location).put_artifact(tiny.by_size[3])
        message = str(caught.value)
        # from the index (SQLite cannot open it) or the blob store, whichever fails first
        assert str(location) in message and re.search("read_only=True|open the cache read-only", message), message
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(folder: Path, leave: int) -> Path:
    """Fill the file system of ``folder``, then free ``leave`` bytes."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        chunk = b"\0" * 4096
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def test_real_full_disk(tiny_tmpfs: Path, tiny: TinyArtifacts) -> None:
    """A 2 MiB tmpfs filled to the last few KiB: puts fail with a clear CacheError
    (from the blob store or from SQLite), every committed entry stays loadable, no
    temp file is left, and the cache works again once space is freed."""
    location = tiny_tmpfs / "cache"
    errors: list[str] = []
    with Cache(location) as cache:
        cache.put_artifact(tiny.by_size[1])
        filler = fill(tiny_tmpfs, leave=12 * 1024)
        for n in range(2, 12):
            try:
                cache.put_artifact(tiny.by_size[n])
            except aot.CacheError as exc:
                errors.append(str(exc))
        assert errors, "the tmpfs never filled up"
        for message in errors:
            assert "No space left" in message or "disk is full" in message, message
            assert TinyArtifacts.NAME in message and "free disk space" in message, message
        assert cache.blobs.store.temp_files() == []
        report = cache.verify()
        assert report.problems == (), report.to_dict()
        for entry in cache.entries():
            check_scaled(cache.load(entry), int(entry.signature[4:-1]))
        committed = len(cache.entries())
        filler.unlink()
        for n in range(2, 12):
            cache.put_artifact(tiny.by_size[n])
        assert len(cache.entries()) == 11 > committed
        cache.gc()
        assert cache.verify().ok
