"""``ContentStore``: content-addressed, compressed, verified blobs over any ObjectStore.

The only blob class the cache uses. A blob is addressed by the lowercase hex sha256
of its *uncompressed* bytes, so identical executables are stored once whatever
store or compression level wrote them. The payload an :class:`ObjectStore` keeps is
one zstd frame with the content size in its header, and every read decompresses and
re-hashes: :meth:`ContentStore.get` never returns bytes that do not match their
digest, it raises :class:`~aot.errors.CorruptArtifactError` instead.

The zstd level (:data:`DEFAULT_LEVEL`) trades the size of the stored files against
the time to write them, measured on real XLA executables and ``jax.export`` bytes
(benchmarks/README.md, "zstd level"): higher levels buy a little ratio for a much
slower write, which matters for the executables of large models; lower ones save
little time. Decompression is fast at every level.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import zstandard

from aot.cache.storage.objectstore import BlobStat, ObjectStore, check_digest, read_only_error, storage_error
from aot.errors import AotError, CorruptArtifactError

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_LEVEL",
    "PROBLEM_MISMATCH",
    "PROBLEM_MISSING",
    "PROBLEM_UNDECODABLE",
    "REFRESH_AFTER_SECONDS",
    "ContentStore",
    "CopyReport",
    "StoredBlob",
    "compress",
    "digest_of",
]

#: zstd level of every store (see the module docstring).
DEFAULT_LEVEL = 3

#: Storing bytes that are already stored marks the blob as just written when it is
#: older than this (gc spares unreferenced blobs younger than its grace period).
REFRESH_AFTER_SECONDS = 60.0

#: Problems reported by :meth:`ContentStore.check`.
PROBLEM_MISSING = "missing"
PROBLEM_MISMATCH = "digest mismatch"
PROBLEM_UNDECODABLE = "truncated/undecodable zstd frame"

T = TypeVar("T")

@dataclass(frozen=True, slots=True)
class StoredBlob:
    """What :meth:`ContentStore.store_bytes` did with some bytes."""

    digest: str
    size: int  # uncompressed
    stored_size: int  # the payload in the store
    written: bool  # False: an intact copy was there already

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "size": self.size, "stored_size": self.stored_size, "written": self.written}


@dataclass(frozen=True, slots=True)
class CopyReport:
    """What :meth:`ContentStore.copy_to` did."""

    copied: tuple[str, ...]
    present: tuple[str, ...]
    bytes_copied: int
    stored_sizes: dict[str, int]  # digest -> payload size in the destination

    def to_dict(self) -> dict[str, Any]:
        return {
            "copied": list(self.copied), "present": list(self.present),
            "bytes_copied": self.bytes_copied,
        }


def digest_of(data: bytes) -> str:
    """Lowercase hex sha256 of ``data`` (the uncompressed bytes)."""
    return hashlib.sha256(data).hexdigest()


def compress(data: bytes, level: int = DEFAULT_LEVEL) -> bytes:
    """One zstd frame with the content size in its header."""
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(data)


def _problem(digest: str, payload: bytes) -> tuple[str | None, bytes | None]:
    try:
        data = zstandard.ZstdDecompressor().decompress(payload)
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


class ContentStore:
    """Hashes, compresses, verifies, repairs and refreshes blobs kept by an ObjectStore."""

    def __init__(self, store: ObjectStore, *, level: int = DEFAULT_LEVEL) -> None:
        self.store = store
        self.level = level

    def __repr__(self) -> str:
        return f"ContentStore({self.store!r})"

    @property
    def read_only(self) -> bool:
        return bool(self.store.read_only)

    @property
    def location(self) -> str:
        return self.store.location

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Runs a store call; anything but an AotError becomes a CacheError with advice."""
        try:
            return fn()
        except AotError:
            raise
        except Exception as e:  # noqa: BLE001 - every library error is translated
            raise storage_error(e, what, self.location) from e

    # -- reads --------------------------------------------------------------------

    def _read(self, digest: str) -> bytes | None:
        check_digest(digest)
        return self._call(f"read blob {digest}", lambda: self.store.read(digest))

    def get(self, digest: str) -> bytes | None:
        """The verified uncompressed bytes; None if absent; CorruptArtifactError if bad."""
        payload = self._read(digest)
        if payload is None:
            return None
        problem, data = _problem(digest, payload)
        if problem is not None or data is None:
            raise _corrupt(digest, self.location, problem or PROBLEM_UNDECODABLE)
        return data

    def check(self, digest: str) -> str | None:
        """None if the blob is intact, else ``missing`` / ``digest mismatch`` / ``truncated/...``."""
        payload = self._read(digest)
        if payload is None:
            return PROBLEM_MISSING
        return _problem(digest, payload)[0]

    def has(self, digest: str) -> bool:
        """Whether a payload is stored under ``digest`` (not verified)."""
        return digest in self.exists([digest])

    def exists(self, digests: Iterable[str]) -> set[str]:
        wanted = [check_digest(d) for d in digests]
        return self._call("look up blobs", lambda: set(self.store.exists(wanted)))

    def stat(self, digests: Iterable[str]) -> dict[str, BlobStat]:
        wanted = [check_digest(d) for d in digests]
        return self._call("look up blobs", lambda: dict(self.store.stat(wanted)))

    def stored_size(self, digest: str) -> int | None:
        found = self.stat([digest]).get(digest)
        return found.stored_size if found is not None else None

    def list(self) -> Iterator[BlobStat]:
        """Every stored blob with its stored size and age (on the store's clock)."""
        iterator = self._call("list blobs", lambda: iter(self.store.list()))
        while True:
            item = self._call("list blobs", lambda: next(iterator, None))
            if item is None:
                return
            yield item

    def digests(self) -> list[str]:
        """Every stored digest, sorted."""
        return sorted(s.digest for s in self.list())

    def now(self) -> datetime:
        """The store's clock (ages are ``now() - modified``)."""
        return self._call("read the clock", self.store.now)

    # -- writes -------------------------------------------------------------------

    def store_bytes(self, data: bytes) -> StoredBlob:
        """Stores ``data`` unless an intact copy is there (then its age is refreshed);
        a corrupt copy is overwritten (repair)."""
        digest = digest_of(data)
        if self.read_only:
            raise read_only_error(f"store blob {digest}", self.location)
        existing = self._read(digest)
        if existing is not None:
            problem = _problem(digest, existing)[0]
            if problem is None:
                self._refresh(digest)
                return StoredBlob(digest, len(data), len(existing), written=False)
            logger.warning("blob %s at %s is corrupt (%s); rewriting it", digest, self.location, problem)
        payload = compress(data, self.level)
        self._call(f"write blob {digest}", lambda: self.store.write(digest, payload))
        logger.debug("stored blob %s (%d bytes, %d stored)", digest, len(data), len(payload))
        return StoredBlob(digest, len(data), len(payload), written=True)

    def put(self, data: bytes) -> str:
        """Stores ``data`` (see :meth:`store_bytes`); its digest."""
        return self.store_bytes(data).digest

    def _refresh(self, digest: str) -> None:
        """An existing blob is about to be referenced again: make it young, so that gc's
        orphan grace period starts over. (Correctness does not depend on it: writers
        hold leases, see docs/reliability.md; it keeps ages meaningful.)"""
        try:
            found = self.stat([digest]).get(digest)
            if found is not None and (self.now() - found.modified).total_seconds() > REFRESH_AFTER_SECONDS:
                self._call(f"touch blob {digest}", lambda: self.store.touch(digest))
        except AotError as e:
            logger.debug("could not refresh the age of blob %s: %s", digest, e)

    def touch(self, digest: str) -> None:
        check_digest(digest)
        self._call(f"touch blob {digest}", lambda: self.store.touch(digest))

    def delete(self, digests: str | Iterable[str]) -> int:
        """Removes the stored ones among ``digests`` (or one digest); the stored bytes freed.

        Only gc calls this on a live cache, inside the index's deletion lock (see
        :mod:`aot.cache.admin.maintenance`)."""
        wanted = [check_digest(digests)] if isinstance(digests, str) else [check_digest(d) for d in digests]
        if not wanted:
            return 0
        if self.read_only:
            raise read_only_error(f"delete blob {wanted[0]}", self.location)
        return self._call("delete blobs", lambda: int(self.store.delete(wanted)))

    def copy_to(self, other: ContentStore, digests: Iterable[str]) -> CopyReport:
        """Copies payloads to ``other`` as stored (no recompression), each verified
        against its digest on the way; intact copies already there are kept (and
        refreshed), corrupt ones overwritten. A missing or corrupt source raises
        :class:`CorruptArtifactError` naming the blob.

        Callers copying blobs for index rows hold leases on them in the
        destination's index (as :meth:`aot.cache.cache.Cache.put_artifact` does).
        """
        if other.read_only:
            raise read_only_error("copy blobs", other.location)
        copied: list[str] = []
        present: list[str] = []
        sizes: dict[str, int] = {}
        total = 0
        for digest in dict.fromkeys(check_digest(d) for d in digests):
            there = other._read(digest)
            if there is not None and _problem(digest, there)[0] is None:
                other._refresh(digest)
                present.append(digest)
                sizes[digest] = len(there)
                continue
            payload = self._read(digest)
            if payload is None:
                raise CorruptArtifactError(
                    f"blob {digest} is missing at {self.location}; run `aot verify` there"
                )
            problem = _problem(digest, payload)[0]
            if problem is not None:
                raise _corrupt(digest, self.location, problem)
            other._call(f"write blob {digest}", lambda: other.store.write(digest, payload))
            copied.append(digest)
            sizes[digest] = len(payload)
            total += len(payload)
        return CopyReport(tuple(copied), tuple(present), total, sizes)

    def close(self) -> None:
        self._call("close the blob store", self.store.close)
