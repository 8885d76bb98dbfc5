"""Value objects about stored blobs: one payload's size and age, what storing or
copying did.

Apart from :mod:`aot.cache.storage.objectstore` and :mod:`aot.cache.storage.content` (which still
export the names) because only listing, writing and copying blobs needs them, never
reading one: a serving process does not pay for defining them (a frozen dataclass
costs ~0.5 ms at import).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class BlobStat:
    """One stored payload: its digest, stored (compressed) size and last write/touch."""

    digest: str
    stored_size: int
    modified: datetime  # UTC, on the store's clock; ``now()`` when unknown


@dataclass(frozen=True, slots=True)
class StoredBlob:
    """What :meth:`~aot.cache.storage.content.ContentStore.store_bytes` did with some bytes."""

    digest: str
    size: int  # uncompressed
    stored_size: int  # the payload in the store
    written: bool  # False: an intact copy was there already

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "size": self.size, "stored_size": self.stored_size, "written": self.written}


@dataclass(frozen=True, slots=True)
class CopyReport:
    """What :meth:`~aot.cache.storage.content.ContentStore.copy_to` did."""

    copied: tuple[str, ...]
    present: tuple[str, ...]
    bytes_copied: int
    stored_sizes: dict[str, int]  # digest -> payload size in the destination

    def to_dict(self) -> dict[str, Any]:
        return {
            "copied": list(self.copied), "present": list(self.present),
            "bytes_copied": self.bytes_copied,
        }
