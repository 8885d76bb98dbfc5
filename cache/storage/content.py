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

import builtins
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import zstandard

from aot.cache.storage.frames import (
    MAX_BLOB_BYTES,
    MAX_WINDOW_BYTES,
    PROBLEM_MISMATCH,
    PROBLEM_MISSING,
    PROBLEM_SIZE,
    PROBLEM_UNDECODABLE,
    check_digest,
    digest_of,
    inflate,
)
from aot.cache.storage.objectstore import BlobStat, ObjectStore, read_only_error, storage_error
from aot.errors import AotError, CacheError, CorruptArtifactError

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_LEVEL",
    "MAX_BLOB_BYTES",
    "MAX_WINDOW_BYTES",
    "PROBLEM_MISMATCH",
    "PROBLEM_MISSING",
    "PROBLEM_SIZE",
    "PROBLEM_UNDECODABLE",
    "REFRESH_AFTER_SECONDS",
    "ContentStore",
    "CopyReport",
    "StoredBlob",
    "compress",
    "digest_of",
    "inflate_frame",
]

#: zstd level of every store (see the module docstring).
DEFAULT_LEVEL = 3

#: Storing bytes that are already stored marks the blob as just written when it is
#: older than this (gc spares unreferenced blobs younger than its grace period).
REFRESH_AFTER_SECONDS = 60.0

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


def compress(data: bytes, level: int = DEFAULT_LEVEL) -> bytes:
    """One zstd frame with the content size in its header."""
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(data)


def inflate_frame(payload: bytes) -> bytes:
    """The bytes one zstd frame inflates to; :class:`CorruptArtifactError` if it is none."""
    try:
        return zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES).decompressobj().decompress(payload)
    except zstandard.ZstdError as e:
        raise CorruptArtifactError(f"not one zstd frame ({e}); nothing was stored") from e


def as_write(exc: CacheError) -> CacheError:
    """A store error met while looking for an intact copy, which is a write's first
    step: a write is what the user asked for, so it is called one (``cannot write
    blob``), with the store's reason and advice kept."""
    return type(exc)(str(exc).replace("cannot read blob", "cannot write blob", 1))


def _problem(digest: str, payload: bytes, size: int | None = None) -> str | None:
    return inflate(digest, payload, size, keep=False)[0]


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

    def _inflate(
        self, digest: str, size: int | None, *, keep: bool
    ) -> tuple[str | None, bytes | None, int]:
        """``(problem, data, stored size)`` of the stored blob (see
        :func:`~aot.cache.storage.frames.inflate`), streamed from the store when it has
        ``read_stream``; ``missing`` if absent."""
        check_digest(digest)
        opener = getattr(self.store, "read_stream", None)
        if opener is None:
            payload = self._read(digest)
            if payload is None:
                return PROBLEM_MISSING, None, 0
            found = self._call(f"read blob {digest}", lambda: inflate(digest, payload, size, keep=keep))
            return found[0], found[1], len(payload)
        stream = self._call(f"read blob {digest}", lambda: opener(digest))
        if stream is None:
            return PROBLEM_MISSING, None, 0
        with stream:
            found = self._call(f"read blob {digest}", lambda: inflate(digest, stream, size, keep=keep))
            return found[0], found[1], self._call(f"read blob {digest}", lambda: stream.seek(0, 2))

    def get(self, digest: str, size: int | None = None) -> bytes | None:
        """The verified uncompressed bytes; None if absent; CorruptArtifactError if bad.

        ``size`` is the uncompressed size the caller's manifest or index row declares:
        a blob of another size is corrupt, and reading it never holds more than
        ``size`` bytes (:data:`MAX_BLOB_BYTES` when not given).
        """
        problem, data, _ = self._inflate(digest, size, keep=True)
        if problem == PROBLEM_MISSING:
            return None
        if problem is not None or data is None:
            raise _corrupt(digest, self.location, problem or PROBLEM_UNDECODABLE)
        return data

    def check(self, digest: str, size: int | None = None) -> str | None:
        """None if the blob is intact (and of the declared ``size``, when given), else
        ``missing`` / ``digest mismatch`` / ``truncated/...`` / ``size differs...``.
        Streams: memory is bounded by a chunk, whatever the blob's size."""
        return self._inflate(digest, size, keep=False)[0]

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

    def digests(self) -> builtins.list[str]:  # builtins: `list` is a method here
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
        try:
            problem, _, stored = self._inflate(digest, len(data), keep=False)
        except CacheError as exc:
            raise as_write(exc) from exc
        if problem != PROBLEM_MISSING:
            if problem is None:
                self._refresh(digest)
                return StoredBlob(digest, len(data), stored, written=False)
            logger.warning("blob %s at %s is corrupt (%s); rewriting it", digest, self.location, problem)
        payload = compress(data, self.level)
        self._call(f"write blob {digest}", lambda: self.store.write(digest, payload))
        logger.debug("stored blob %s (%d bytes, %d stored)", digest, len(data), len(payload))
        return StoredBlob(digest, len(data), len(payload), written=True)

    def put(self, data: bytes) -> str:
        """Stores ``data`` (see :meth:`store_bytes`); its digest."""
        return self.store_bytes(data).digest

    def store_frame(self, payload: bytes, data: bytes | None = None) -> StoredBlob:
        """Stores ``payload``, one zstd frame compressed by someone else (JAX's
        persistent cache hands those over), as it is: no second compression. Its digest
        is that of the bytes it inflates to (``data``, when the caller inflated it
        already: :func:`inflate_frame`), so it is an ordinary blob (verify, copies).
        A frame that does not inflate raises :class:`CorruptArtifactError`."""
        data = inflate_frame(payload) if data is None else data
        digest = digest_of(data)
        if self.read_only:
            raise read_only_error(f"store blob {digest}", self.location)
        problem, _, stored = self._inflate(digest, len(data), keep=False)
        if problem is None:
            self._refresh(digest)
            return StoredBlob(digest, len(data), stored, written=False)
        if problem != PROBLEM_MISSING:
            logger.warning("blob %s at %s is corrupt (%s); rewriting it", digest, self.location, problem)
        self._call(f"write blob {digest}", lambda: self.store.write(digest, payload))
        return StoredBlob(digest, len(data), len(payload), written=True)

    def get_frame(self, digest: str, size: int | None = None) -> bytes | None:
        """The stored zstd frame of ``digest`` as stored (not inflated for the caller),
        after checking that it inflates to ``size`` bytes of that digest; None if
        absent; :class:`CorruptArtifactError` if not."""
        payload = self._read(digest)
        if payload is None:
            return None
        problem = self._call(f"read blob {digest}", lambda: _problem(digest, payload, size))
        if problem is not None:
            raise _corrupt(digest, self.location, problem)
        return payload

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
        destination's index (as :meth:`aot.cache.store.ArtifactStore.put_artifact` does).
        """
        if other.read_only:
            raise read_only_error("copy blobs", other.location)
        copied: list[str] = []
        present: list[str] = []
        sizes: dict[str, int] = {}
        total = 0
        for digest in dict.fromkeys(check_digest(d) for d in digests):
            try:
                problem, _, stored = other._inflate(digest, None, keep=False)
            except CacheError as exc:
                raise as_write(exc) from exc
            if problem is None:
                other._refresh(digest)
                present.append(digest)
                sizes[digest] = stored
                continue
            payload = self._read(digest)
            if payload is None:
                raise CorruptArtifactError(
                    f"blob {digest} is missing at {self.location}: if the source's blobs live "
                    "elsewhere, give their location (aot pull --from-blobs LOCATION; a shared "
                    "index records it: omit --from-blobs to use it); else run `aot verify` there"
                )
            problem = _problem(digest, payload)
            if problem is not None:
                raise _corrupt(digest, self.location, problem)
            other._call(f"write blob {digest}", lambda: other.store.write(digest, payload))
            copied.append(digest)
            sizes[digest] = len(payload)
            total += len(payload)
        return CopyReport(tuple(copied), tuple(present), total, sizes)

    def verified_among(self, digests: Iterable[str], *, verified: dict[str, int], jobs: int = 1) -> set[str]:
        """The ``digests`` stored here intact: one batched :meth:`stat`, then each blob
        not in ``verified`` (digest -> stored size, verified earlier in the caller's
        run; filled in here) read and verified, ``jobs`` at a time; one in it counts
        as intact while its stored size is unchanged."""
        wanted = sorted({check_digest(d) for d in digests})
        if not wanted:
            return set()
        found = self.stat(wanted)
        intact = {d for d, s in found.items() if verified.get(d) == s.stored_size}
        todo = [d for d in wanted if d in found and d not in intact]

        def one(digest: str) -> tuple[str, str | None]:
            return digest, self.check(digest)

        if jobs > 1 and len(todo) > 1:
            from concurrent.futures import ThreadPoolExecutor  # copies only: serving never needs it

            with ThreadPoolExecutor(max_workers=min(jobs, len(todo))) as pool:
                checked = list(pool.map(one, todo))
        else:
            checked = [one(d) for d in todo]
        for digest, problem in checked:
            if problem is None:
                intact.add(digest)
                verified[digest] = found[digest].stored_size
        return intact

    def copy_many(
        self, other: ContentStore, digests: Iterable[str], *, verified: dict[str, int], jobs: int = 1,
    ) -> tuple[dict[str, int], dict[str, AotError]]:
        """:meth:`copy_to` of a batch, with its round trips shared: one batched
        :meth:`stat` at ``other`` for every digest; a blob found there is read and
        verified only if this run has not verified it yet (``verified``: digest ->
        stored size, filled in by this call: what was verified or written), else its
        stored size must match; the rest are verified or copied ``jobs`` at a time.
        Returns the stored size at ``other`` of each digest now intact there, and the
        error of each that is not (a blob missing or corrupt at the source, a failed
        write): the caller fails only what uses it.

        Callers hold leases on ``digests`` in the destination's index, as for
        :meth:`copy_to`."""
        if other.read_only:
            raise read_only_error("copy blobs", other.location)
        wanted = list(dict.fromkeys(check_digest(d) for d in digests))
        try:
            found = other.stat(wanted)
        except CacheError as exc:
            raise as_write(exc) from exc
        sizes: dict[str, int] = {}
        stale: list[str] = []
        todo: list[str] = []
        for digest in wanted:
            there = found.get(digest)
            if there is not None and verified.get(digest) == there.stored_size:
                sizes[digest] = there.stored_size
                stale.append(digest)
            else:
                todo.append(digest)

        def one(digest: str) -> tuple[str, int | AotError]:
            try:
                report = self.copy_to(other, [digest])
            except AotError as exc:
                return digest, exc
            return digest, report.stored_sizes[digest]

        errors: dict[str, AotError] = {}
        if jobs > 1 and len(todo) > 1:
            from concurrent.futures import ThreadPoolExecutor  # copies only: serving never needs it

            with ThreadPoolExecutor(max_workers=min(jobs, len(todo))) as pool:
                done = list(pool.map(one, todo))
        else:
            done = [one(d) for d in todo]
        for digest, outcome in done:
            if isinstance(outcome, AotError):
                errors[digest] = outcome
            else:
                sizes[digest] = verified[digest] = outcome
        if stale:  # verified earlier in this run: refresh the age of the old ones
            try:
                now = other.now()
                for digest in stale:
                    if (now - found[digest].modified).total_seconds() > REFRESH_AFTER_SECONDS:
                        other.touch(digest)
            except AotError as e:
                logger.debug("could not refresh the age of blobs at %s: %s", other.location, e)
        return sizes, errors

    def close(self) -> None:
        self._call("close the blob store", self.store.close)
