"""Local object stores: a folder (the default blob store of a cache) and memory (tests).

Both keep opaque payloads by digest (see :mod:`aot.cache.storage.objectstore` for the
contract); hashing, compression and verification are :class:`aot.cache.storage.content.ContentStore`'s.
"""

from __future__ import annotations

import builtins
import errno
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO

from aot.cache.storage.objectstore import (
    BlobStat,
    blob_path,
    check_digest,
    digest_from_path,
    read_only_error,
    storage_error,
)
from aot.errors import CorruptArtifactError

logger = logging.getLogger(__name__)

__all__ = ["FolderObjectStore", "MemoryObjectStore", "TEMP_DIR", "TEMP_GRACE_SECONDS"]

#: Sub-folder of the temp files of writes in progress (never a fan-out folder).
TEMP_DIR = ".tmp"

#: A temp file untouched for this long belongs to a writer that died mid-write: it is
#: removed when the store is next opened for writing. A live write touches its file
#: at least once per chunk, so an hour is far beyond any real write.
TEMP_GRACE_SECONDS = 3600.0

_FANOUT_PATTERN = r"^[0-9a-f]{2}$"  # compiled on first use
_TMP_SUFFIX = ".tmp"


def _utc(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, timezone.utc)


class FolderObjectStore:
    """Payloads as files ``root/ab/<digest>.zst`` (:func:`blob_path`), mode 0444.

    A write goes to a temp file in ``root/.tmp``, is fsynced, renamed into place
    (:func:`os.replace`, atomic) and the folder fsynced: a crash leaves no blob or a
    complete one, plus perhaps a temp file, never listed as a blob and removed once
    stale (:data:`TEMP_GRACE_SECONDS`). Ages are file mtimes on this host's clock.
    """

    def __init__(
        self, root: str | os.PathLike[str], *, read_only: bool = False,
        temp_grace_seconds: float = TEMP_GRACE_SECONDS,
    ) -> None:
        self.root = Path(root).expanduser()
        self.read_only = read_only
        if not read_only:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise storage_error(e, "create the blob folder", str(self.root)) from e
            self.remove_stale_temp_files(temp_grace_seconds)

    def __repr__(self) -> str:
        return f"FolderObjectStore({str(self.root)!r}, read_only={self.read_only})"

    @property
    def location(self) -> str:
        return str(self.root)

    def path_for(self, digest: str) -> Path:
        return self.root / blob_path(digest)

    # -- reads --------------------------------------------------------------------

    def read(self, digest: str) -> bytes | None:
        stream = self.read_stream(digest)
        if stream is None:
            return None
        with stream:
            try:
                return stream.read()
            except OSError as e:
                raise storage_error(e, f"read blob {digest}", str(self.path_for(digest))) from e

    def read_stream(self, digest: str) -> BinaryIO | None:
        """The stored payload as a file to stream (the caller closes it), or None."""
        path = self.path_for(digest)
        try:
            return open(path, "rb")  # noqa: SIM115 - the caller closes it
        except FileNotFoundError:
            return None
        except IsADirectoryError as e:
            raise CorruptArtifactError(
                f"blob {digest} at {path} is not a regular file; move it away and run `aot verify`"
            ) from e
        except OSError as e:
            raise storage_error(e, f"read blob {digest}", str(path)) from e

    def exists(self, digests: Iterable[str]) -> set[str]:
        return {d for d in digests if self.path_for(d).is_file()}

    def _stat(self, digest: str) -> BlobStat | None:
        try:
            st = self.path_for(digest).stat()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise storage_error(e, f"look up blob {digest}", str(self.root)) from e
        return BlobStat(digest, st.st_size, _utc(st.st_mtime))

    def stat(self, digests: Iterable[str]) -> dict[str, BlobStat]:
        out = {}
        for digest in digests:
            found = self._stat(digest)
            if found is not None:
                out[digest] = found
        return out

    def list(self) -> Iterator[BlobStat]:
        try:
            fanouts = sorted(p.name for p in self.root.iterdir() if re.fullmatch(_FANOUT_PATTERN, p.name))
        except FileNotFoundError:
            return
        except OSError as e:
            raise storage_error(e, "list blobs", str(self.root)) from e
        for sub in fanouts:
            try:
                names = sorted(os.listdir(self.root / sub))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for name in names:
                digest = digest_from_path(f"{sub}/{name}")
                if digest is None:
                    continue
                found = self._stat(digest)
                if found is not None:
                    yield found

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    # -- temp files ---------------------------------------------------------------

    def temp_files(self) -> builtins.list[Path]:  # builtins: `list` is a method here
        """Temp files of writes in progress or interrupted (never blobs)."""
        folder = self.root / TEMP_DIR
        try:
            return sorted(p for p in folder.iterdir() if p.name.endswith(_TMP_SUFFIX))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def remove_stale_temp_files(self, older_than_seconds: float = TEMP_GRACE_SECONDS) -> int:
        """Deletes temp files untouched for ``older_than_seconds``; the bytes freed."""
        if self.read_only:
            raise read_only_error("remove temp files", str(self.root))
        cutoff = time.time() - older_than_seconds
        freed = 0
        for path in self.temp_files():
            try:
                st = path.stat()
                if st.st_mtime < cutoff:
                    path.unlink()
                    freed += st.st_size
            except OSError:
                continue  # gone already, or not ours to remove: harmless either way
        if freed:
            logger.info("removed %d bytes of stale temp files in %s", freed, self.root / TEMP_DIR)
        return freed

    # -- writes -------------------------------------------------------------------

    def write(self, digest: str, payload: bytes) -> None:
        path = self.path_for(digest)
        if self.read_only:
            raise read_only_error(f"store blob {digest}", str(self.root))
        temp_dir = self.root / TEMP_DIR
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temp_dir.mkdir(exist_ok=True)
        except OSError as e:
            raise storage_error(e, "create blob folder", str(path.parent)) from e
        tmp = temp_dir / f"{digest}.{os.getpid()}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
        fd = -1
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o644)
            view = memoryview(payload)
            while view:
                n = os.write(fd, view)
                if n <= 0:
                    raise OSError(errno.EIO, "short write")
                view = view[n:]
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.chmod(tmp, 0o444)
            os.replace(tmp, path)
        except BaseException as e:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(e, OSError):
                raise storage_error(e, f"write blob {digest}", str(path)) from e
            raise
        _fsync_dir(path.parent)

    def touch(self, digest: str) -> None:
        if self.read_only:
            raise read_only_error(f"touch blob {digest}", str(self.root))
        path = self.path_for(digest)
        try:
            os.utime(path)
        except FileNotFoundError:
            return
        except OSError as e:
            raise storage_error(e, f"touch blob {digest}", str(path)) from e

    def delete(self, digests: Iterable[str]) -> int:
        freed = 0
        for digest in digests:
            path = self.path_for(digest)
            if self.read_only:
                raise read_only_error(f"delete blob {digest}", str(self.root))
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as e:
                raise storage_error(e, f"delete blob {digest}", str(path)) from e
            freed += size
            logger.debug("deleted blob %s (%d bytes)", digest, size)
        return freed

    def close(self) -> None:
        pass


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable. Best effort: not every platform can open a directory."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class MemoryObjectStore:
    """Payloads in a dict, for tests. ``MemoryObjectStore(shares=other)`` sees the
    same payloads (as a second process would see a folder)."""

    def __init__(self, *, read_only: bool = False, shares: MemoryObjectStore | None = None) -> None:
        self.read_only = read_only
        self._data: dict[str, tuple[bytes, datetime]] = shares._data if shares is not None else {}
        self._lock: threading.Lock = shares._lock if shares is not None else threading.Lock()

    def __repr__(self) -> str:
        return f"MemoryObjectStore({len(self._data)} blobs, read_only={self.read_only})"

    @property
    def location(self) -> str:
        return f"memory (0x{id(self._data):x})"

    def read(self, digest: str) -> bytes | None:
        found = self._data.get(check_digest(digest))
        return found[0] if found is not None else None

    def write(self, digest: str, payload: bytes) -> None:
        check_digest(digest)
        if self.read_only:
            raise read_only_error(f"store blob {digest}", self.location)
        with self._lock:
            self._data[digest] = (bytes(payload), self.now())

    def exists(self, digests: Iterable[str]) -> set[str]:
        return {d for d in digests if check_digest(d) in self._data}

    def stat(self, digests: Iterable[str]) -> dict[str, BlobStat]:
        out = {}
        for digest in digests:
            found = self._data.get(check_digest(digest))
            if found is not None:
                out[digest] = BlobStat(digest, len(found[0]), found[1])
        return out

    def list(self) -> Iterator[BlobStat]:
        with self._lock:
            items = sorted(self._data.items())
        for digest, (payload, modified) in items:
            yield BlobStat(digest, len(payload), modified)

    def touch(self, digest: str) -> None:
        if self.read_only:
            raise read_only_error(f"touch blob {digest}", self.location)
        with self._lock:
            found = self._data.get(check_digest(digest))
            if found is not None:
                self._data[digest] = (found[0], self.now())

    def delete(self, digests: Iterable[str]) -> int:
        freed = 0
        for digest in digests:
            check_digest(digest)
            if self.read_only:
                raise read_only_error(f"delete blob {digest}", self.location)
            with self._lock:
                found = self._data.pop(digest, None)
            if found is not None:
                freed += len(found[0])
        return freed

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def close(self) -> None:
        pass
