"""A writer's blob lease and the error of losing it (the gc protocol,
docs/reliability.md): what a cache that writes needs without importing SQLAlchemy,
where :mod:`aot.cache.index.sql` takes and releases the leases."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aot.errors import CacheError

__all__ = ["Lease", "LeaseLostError"]


class LeaseLostError(CacheError):
    """A writer's lease expired and gc took it (with, perhaps, its blobs): start over."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A writer's pending references (see :meth:`aot.cache.index.sql.Index.lease`)."""

    token: str
    digests: frozenset[str]
    expires_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.token, "digests": sorted(self.digests), "expires_at": self.expires_at.isoformat()}
