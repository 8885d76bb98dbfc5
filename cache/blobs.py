"""Content-addressed blob stores: folder, database and in-memory.

A blob is addressed by the lowercase hex sha256 of its *uncompressed* bytes, so
identical executables are stored once whatever store or compression level wrote
them. Every store keeps the bytes zstd-compressed (one frame, content size in the
frame header) and every read decompresses and re-hashes: :meth:`BlobStore.get`
never returns bytes that do not match their digest, it raises
:class:`~aot.errors.CorruptArtifactError` instead.

The zstd level (:data:`DEFAULT_LEVEL`) was chosen by measuring real XLA CPU
executables (``serialize_executable``) and ``jax.export`` bytes from jax 0.10.2 on
an AMD EPYC (2 cores); ratio = raw / compressed, speeds in MB/s of raw bytes::

    sample (raw bytes)              level:   1      3      6      9      19
    MLP 784-512-256-10 exe (16 KB)  ratio  3.00   3.09   3.20   3.20   3.42
                                    comp    313    296     94     43    3.1
    transformer layer exe (45 KB)   ratio  3.37   3.51   3.76   3.79   4.04
                                    comp    440    334     78     58    2.6
    8 transformer layers (215 KB)   ratio  6.95   7.06   7.36   7.69   8.51
                                    comp    444    172     26     43    1.9
    32 transformer layers (766 KB)  ratio  -      9.56   -      -     12.37
    MLP jax.export (2.7 KB)         ratio  1.78   1.83   1.87   1.87   1.98
    layer jax.export (4.4 KB)       ratio  1.74   1.80   1.84   1.84   1.93
    decompression: 0.4-1.1 GB/s at every level.

(one-shot timings on a shared 2-core machine: read the speeds as orders of magnitude.)
Level 3 files are 10-30% larger than level 19's but are written 50-100x faster;
levels 6-9 buy 3-8% more ratio for a 4-10x slower write, which matters for the
multi-hundred-MB executables of large models (level 19 would take minutes there).
Level 1 saves little time over 3 at a slightly worse ratio. Hence 3.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

import zstandard

from aot.errors import CacheError, CorruptArtifactError, ReadOnlyCacheError

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_LEVEL",
    "BlobStore",
    "FolderBlobStore",
    "MemoryBlobStore",
    "DatabaseBlobStore",
    "digest_of",
    "check_digest",
    "compress",
    "decompress_verified",
    "PROBLEM_MISSING",
    "PROBLEM_MISMATCH",
    "PROBLEM_UNDECODABLE",
]

#: A store that is asked to store bytes it already has marks the blob as just written
#: when it is older than this, so that gc, which spares unreferenced blobs younger than
#: its grace (``maintenance.ORPHAN_GRACE_SECONDS``, much longer), cannot take an old
#: orphan that a writer is about to reference.
REFRESH_AFTER_SECONDS = 60.0

#: zstd level of every store (see the measurements in the module docstring).
DEFAULT_LEVEL = 3

#: Problems reported by :meth:`BlobStore.check`.
PROBLEM_MISSING = "missing"
PROBLEM_MISMATCH = "digest mismatch"
PROBLEM_UNDECODABLE = "truncated/undecodable zstd frame"

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
_BLOB_NAME_RE = re.compile(r"^([0-9a-f]{64})\.zst$")
_FANOUT_RE = re.compile(r"^[0-9a-f]{2}$")
_TMP_SUFFIX = ".tmp"


def digest_of(data: bytes) -> str:
    """Lowercase hex sha256 of ``data`` (the uncompressed bytes)."""
    return hashlib.sha256(data).hexdigest()


def check_digest(digest: str) -> str:
    """Return ``digest`` if it is 64 lowercase hex characters, else raise.

    Digests come from manifests and index rows and become file names, so anything
    else (``../``, upper case, a truncated value) is refused.
    """
    if not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
        raise CorruptArtifactError(
            f"invalid blob digest {digest!r}: expected 64 lowercase hex characters "
            f"(a sha256); the manifest or index row naming it is damaged, run `aot verify`"
        )
    return digest


def compress(data: bytes, level: int = DEFAULT_LEVEL) -> bytes:
    """One zstd frame with the content size in its header."""
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(data)


def _decompress(stored: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompress(stored)


def _problem(digest: str, stored: bytes) -> tuple[str | None, bytes | None]:
    try:
        data = _decompress(stored)
    except zstandard.ZstdError:
        return PROBLEM_UNDECODABLE, None
    if digest_of(data) != digest:
        return PROBLEM_MISMATCH, None
    return None, data


def _corrupt(digest: str, where: str, problem: str) -> CorruptArtifactError:
    return CorruptArtifactError(
        f"blob {digest} at {where} is corrupt ({problem}); run `aot verify` to "
        f"quarantine the entries using it (they are recompiled on next use) and "
        f"`aot gc` to remove it"
    )


def decompress_verified(digest: str, stored: bytes, where: str) -> bytes:
    """Decompress ``stored`` and check that it hashes to ``digest``.

    Raises :class:`CorruptArtifactError` naming ``digest`` and ``where``.
    """
    problem, data = _problem(digest, stored)
    if problem is not None or data is None:
        raise _corrupt(digest, where, problem or PROBLEM_UNDECODABLE)
    return data


def _read_only_error(what: str, where: str) -> ReadOnlyCacheError:
    return ReadOnlyCacheError(
        f"cannot {what}: the blob store at {where} was opened read-only; open the "
        f"cache without read_only=True to modify it"
    )


@runtime_checkable
class BlobStore(Protocol):
    """Content-addressed storage of immutable byte strings."""

    read_only: bool

    def get(self, digest: str) -> bytes | None:
        """The verified uncompressed bytes, None if absent; CorruptArtifactError if bad."""
        ...

    def put(self, data: bytes) -> str:
        """Store ``data`` (idempotent: an existing good blob is never rewritten); its digest."""
        ...

    def has(self, digest: str) -> bool:
        """Whether a blob is stored under ``digest`` (not verified)."""
        ...

    def delete(self, digest: str) -> int:
        """Remove a blob; the stored bytes freed (0 if it was absent)."""
        ...

    def digests(self) -> Iterator[str]:
        """Every stored digest (sorted)."""
        ...

    def stored_size(self, digest: str) -> int | None:
        """Compressed size in the store, None if absent."""
        ...

    def check(self, digest: str) -> str | None:
        """None if the blob is intact, else ``missing`` / ``digest mismatch`` / ``truncated/...``."""
        ...


# ----------------------------------------------------------------------- folder


class FolderBlobStore:
    """Blobs as files ``root/ab/abcdef....zst`` (two-character fan-out), read-only.

    Writes go to a hidden temp file in the same folder, are flushed and fsynced,
    renamed into place with :func:`os.replace` (atomic), and the folder is fsynced,
    so a crash leaves either no blob or a complete one (plus possibly a stray
    ``.*.tmp`` file, never mistaken for a blob; see :meth:`remove_stale_temp_files`).
    """

    def __init__(self, root: str | Path, *, level: int = DEFAULT_LEVEL, read_only: bool = False) -> None:
        self.root = Path(root).expanduser()
        self.level = level
        self.read_only = read_only
        if not read_only:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise self._os_error("create the blob folder", self.root, e) from e

    def __repr__(self) -> str:
        return f"FolderBlobStore({str(self.root)!r}, level={self.level}, read_only={self.read_only})"

    def path_for(self, digest: str) -> Path:
        check_digest(digest)
        return self.root / digest[:2] / f"{digest}.zst"

    @staticmethod
    def _os_error(what: str, where: Path, e: OSError) -> CacheError:
        reason = e.strerror or str(e)
        if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            advice = "free disk space (e.g. `aot gc --max-size ...`) or move the cache (AOT_CACHE)"
        elif e.errno in (errno.EACCES, errno.EPERM):
            advice = "fix the permissions of the cache folder, or open the cache read-only"
        elif e.errno == errno.EROFS:
            advice = "the file system is read-only: open the cache read-only or move it (AOT_CACHE)"
        else:
            advice = "check the cache folder (AOT_CACHE)"
        return CacheError(f"cannot {what} {where}: {reason} [errno {e.errno}]; {advice}")

    # -- reads --------------------------------------------------------------------

    def _read(self, digest: str) -> bytes | None:
        path = self.path_for(digest)
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except IsADirectoryError as e:
            raise _corrupt(digest, str(path), "not a regular file") from e
        except OSError as e:
            raise self._os_error("read blob", path, e) from e

    def get(self, digest: str) -> bytes | None:
        stored = self._read(digest)
        if stored is None:
            return None
        return decompress_verified(digest, stored, str(self.path_for(digest)))

    def has(self, digest: str) -> bool:
        return self.path_for(digest).is_file()

    def stored_size(self, digest: str) -> int | None:
        try:
            return self.path_for(digest).stat().st_size
        except FileNotFoundError:
            return None

    def check(self, digest: str) -> str | None:
        stored = self._read(digest)
        if stored is None:
            return PROBLEM_MISSING
        return _problem(digest, stored)[0]

    def digests(self) -> Iterator[str]:
        try:
            fanouts = sorted(p for p in self.root.iterdir() if _FANOUT_RE.fullmatch(p.name) and p.is_dir())
        except FileNotFoundError:
            return
        for sub in fanouts:
            names = sorted(os.listdir(sub))
            for name in names:
                m = _BLOB_NAME_RE.fullmatch(name)
                if m and m.group(1).startswith(sub.name):
                    yield m.group(1)

    def temp_files(self) -> list[Path]:
        """Leftover temp files of interrupted writes (never blobs)."""
        if not self.root.is_dir():
            return []
        return sorted(
            p
            for sub in self.root.iterdir()
            if _FANOUT_RE.fullmatch(sub.name) and sub.is_dir()
            for p in sub.iterdir()
            if p.name.startswith(".") and p.name.endswith(_TMP_SUFFIX)
        )

    def remove_stale_temp_files(self, older_than_seconds: float = 3600.0) -> int:
        """Delete temp files older than ``older_than_seconds``; bytes freed.

        Young ones may belong to a write in progress in another process.
        """
        if self.read_only:
            raise _read_only_error("remove temp files", str(self.root))
        import time

        cutoff = time.time() - older_than_seconds
        freed = 0
        for p in self.temp_files():
            try:
                st = p.stat()
                if st.st_mtime < cutoff:
                    p.unlink()
                    freed += st.st_size
            except FileNotFoundError:
                continue
        return freed

    # -- writes -------------------------------------------------------------------

    def put(self, data: bytes) -> str:
        digest = digest_of(data)
        path = self.path_for(digest)
        if self.read_only:
            raise _read_only_error(f"store blob {digest}", str(self.root))
        existing = self._read(digest)
        if existing is not None:
            problem = _problem(digest, existing)[0]
            if problem is None:
                # The caller is about to reference it: make it young again, so that gc
                # (which spares orphans younger than its grace, by mtime) leaves it be
                # even if it is the old orphan of a killed writer.
                try:
                    if time.time() - path.stat().st_mtime > REFRESH_AFTER_SECONDS:
                        os.utime(path)
                except OSError:
                    pass
                return digest
            logger.warning("blob %s at %s is corrupt (%s); rewriting it", digest, path, problem)
        self._write_atomic(path, compress(data, self.level))
        logger.debug("stored blob %s (%d bytes)", digest, len(data))
        return digest

    def _write_atomic(self, path: Path, payload: bytes) -> None:
        folder = path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise self._os_error("create blob folder", folder, e) from e
        tmp = folder / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
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
        except OSError as e:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise self._os_error("write blob", path, e) from e
        except BaseException:
            if fd >= 0:
                os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _fsync_dir(folder)

    def delete(self, digest: str) -> int:
        path = self.path_for(digest)
        if self.read_only:
            raise _read_only_error(f"delete blob {digest}", str(self.root))
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        except OSError as e:
            raise self._os_error("delete blob", path, e) from e
        logger.debug("deleted blob %s (%d bytes)", digest, size)
        return size


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


# ----------------------------------------------------------------------- memory


class MemoryBlobStore:
    """In-memory store for tests; keeps compressed bytes so corruption can be simulated."""

    def __init__(self, *, level: int = DEFAULT_LEVEL, read_only: bool = False) -> None:
        self.level = level
        self.read_only = read_only
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MemoryBlobStore({len(self._data)} blobs)"

    def get(self, digest: str) -> bytes | None:
        check_digest(digest)
        stored = self._data.get(digest)
        if stored is None:
            return None
        return decompress_verified(digest, stored, "memory")

    def put(self, data: bytes) -> str:
        digest = digest_of(data)
        if self.read_only:
            raise _read_only_error(f"store blob {digest}", "memory")
        with self._lock:
            existing = self._data.get(digest)
            if existing is None or _problem(digest, existing)[0] is not None:
                self._data[digest] = compress(data, self.level)
        return digest

    def has(self, digest: str) -> bool:
        return check_digest(digest) in self._data

    def delete(self, digest: str) -> int:
        check_digest(digest)
        if self.read_only:
            raise _read_only_error(f"delete blob {digest}", "memory")
        with self._lock:
            stored = self._data.pop(digest, None)
        return len(stored) if stored is not None else 0

    def digests(self) -> Iterator[str]:
        yield from sorted(self._data)

    def stored_size(self, digest: str) -> int | None:
        stored = self._data.get(check_digest(digest))
        return len(stored) if stored is not None else None

    def check(self, digest: str) -> str | None:
        stored = self._data.get(check_digest(digest))
        if stored is None:
            return PROBLEM_MISSING
        return _problem(digest, stored)[0]

    # -- test helpers -------------------------------------------------------------

    def raw(self, digest: str) -> bytes:
        """The stored (compressed) bytes."""
        return self._data[check_digest(digest)]

    def set_raw(self, digest: str, stored: bytes) -> None:
        """Replace the stored bytes (to simulate corruption)."""
        self._data[check_digest(digest)] = stored


def __getattr__(name: str) -> object:
    # The database store needs SQLAlchemy, whose import is slow: load it on first use.
    if name == "DatabaseBlobStore":
        from aot.cache.dbblobs import DatabaseBlobStore

        return DatabaseBlobStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
