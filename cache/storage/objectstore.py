"""The raw storage layer under the blob cache: ``ObjectStore``, bytes by digest.

An object store keeps opaque payloads (already compressed by
:class:`aot.cache.storage.content.ContentStore`, which hashes, compresses, verifies and
repairs) under a sha256 digest. It knows nothing of zstd, manifests or the index.
Modelled on JAX's ``CacheInterface`` and dvc-objects' ODB over a FileSystem.

Implementations: a local folder, a SQL table in the index database, and fsspec
(``s3://``, ``gs://``, ``az://``, ``memory://``, ``file://``);
:func:`aot.cache.storage.locations.open_object_store` picks one by a location's
scheme. This module imports none of them. :func:`blob_path` is the one layout every
path-based store uses (``ab/<digest>.zst``), so a folder store and a ``file://``
store over the same folder see the same blobs.

Contract, for every implementation:

* ``write`` publishes all or nothing (temp file + rename, a transaction, or an
  object PUT, which is atomic): a reader never sees a partial payload under its
  final name. Writing an existing digest overwrites it (that is how a corrupt
  blob is repaired).
* ``modified`` times are UTC and come from the store's own clock, and ``now()``
  reads that same clock, so an age is always ``store.now() - modified`` and never
  mixes two machines' clocks. A store that cannot tell a blob's age reports it as
  ``now()``: too young for gc to delete.
* ``touch`` makes a blob young again (gc's grace period starts over).
* Batched calls (``exists``, ``stat``, ``delete``) take any iterable of digests and
  ignore digests that are absent.
* Optional: ``read_stream(digest) -> BinaryIO | None``, a seekable file on the payload (the
  caller closes it). A store that has one (the folder store, fsspec's ``file://``)
  is read in chunks, so verifying a blob holds a chunk, not the blob; the others
  are ``read`` whole (compressed).
* Errors are :class:`aot.errors.CacheError` (or ``ReadOnlyCacheError``) with advice;
  never a raw ``OSError`` or a library's own exception.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from aot.cache.storage.frames import blob_path, check_digest
from aot.errors import CacheError, ReadOnlyCacheError

__all__ = [
    "BlobStat",
    "ErrorTranslator",
    "ObjectStore",
    "blob_path",
    "check_digest",
    "digest_from_path",
    "read_only_error",
    "register_error_translator",
    "storage_error",
]

# Patterns are compiled on first use (re's cache), not by every process importing this.
_PATH_PATTERN = r"^([0-9a-f]{2})/([0-9a-f]{64})\.zst$"


def digest_from_path(relative: str) -> str | None:
    """The digest of a relative path laid out by :func:`blob_path`, else None."""
    match = re.fullmatch(_PATH_PATTERN, relative.replace("\\", "/"))
    if match is None or not match.group(2).startswith(match.group(1)):
        return None
    return match.group(2)


@dataclass(frozen=True, slots=True)
class BlobStat:
    """One stored payload: its digest, stored (compressed) size and last write/touch."""

    digest: str
    stored_size: int
    modified: datetime  # UTC, on the store's clock; ``now()`` when unknown


@runtime_checkable
class ObjectStore(Protocol):
    """Raw payloads by digest. See the module docstring for the contract."""

    read_only: bool

    @property
    def location(self) -> str:
        """Where the payloads live, for messages (no credentials)."""
        ...

    def read(self, digest: str) -> bytes | None:
        """The stored payload, or None if absent."""
        ...

    def write(self, digest: str, payload: bytes) -> None:
        """Publishes ``payload`` under ``digest``, all or nothing (overwrites)."""
        ...

    def exists(self, digests: Iterable[str]) -> set[str]:
        """The subset of ``digests`` that are stored."""
        ...

    def stat(self, digests: Iterable[str]) -> dict[str, BlobStat]:
        """Size and age of each stored digest among ``digests``."""
        ...

    def delete(self, digests: Iterable[str]) -> int:
        """Removes the stored ones among ``digests``; the stored bytes freed."""
        ...

    def list(self) -> Iterator[BlobStat]:
        """Every stored payload."""
        ...

    def touch(self, digest: str) -> None:
        """Marks a stored payload as just written (gc's grace starts over)."""
        ...

    def now(self) -> datetime:
        """The current UTC time on the clock that stamps ``modified``."""
        ...

    def close(self) -> None:
        ...


# ------------------------------------------------------------------------ errors

#: Turns an exception of a storage library into a CacheError with advice, or None
#: when it does not recognise it. ``what`` is the failed action ("write blob ab12..."),
#: ``where`` the store's location.
ErrorTranslator = Callable[[BaseException, str, str], "CacheError | None"]

_TRANSLATORS: list[ErrorTranslator] = []


def register_error_translator(translator: ErrorTranslator) -> None:
    """Adds a translator (e.g. for fsspec's exceptions), asked before the OS one."""
    if translator not in _TRANSLATORS:
        _TRANSLATORS.insert(0, translator)


def _os_advice(e: OSError) -> str:
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return "free disk space (e.g. `aot gc --max-size ...`) or move the cache (AOT_CACHE)"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "fix the permissions of the cache folder, or open the cache read-only"
    if e.errno == errno.EROFS:
        return "the file system is read-only: open the cache read-only or move it (AOT_CACHE)"
    return "check the cache folder or blob location (AOT_CACHE / AOT_BLOBS)"


def storage_error(exc: BaseException, what: str, where: str) -> CacheError:
    """The one translator of storage failures into :class:`CacheError` with advice.

    An :class:`AotError` passes through unchanged (it already says what to do);
    registered translators are asked first, then OS errors get advice by errno.
    """
    if isinstance(exc, CacheError):
        return exc
    for translator in _TRANSLATORS:
        translated = translator(exc, what, where)
        if translated is not None:
            return translated
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc) or type(exc).__name__
        code = f" [errno {exc.errno}]" if exc.errno is not None else ""
        return CacheError(f"cannot {what} at {where}: {reason}{code}; {_os_advice(exc)}")
    return CacheError(f"cannot {what} at {where}: {type(exc).__name__}: {exc}")


def read_only_error(what: str, where: str) -> ReadOnlyCacheError:
    return ReadOnlyCacheError(
        f"cannot {what}: the blob store at {where} was opened read-only; open the "
        f"cache without read_only=True to modify it"
    )
