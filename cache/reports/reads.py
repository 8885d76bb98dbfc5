"""The index reads of the listing reports (``aot ls``, ``show``), through the standard
library's SQLite reader for a folder cache (no SQLAlchemy import, ~0.3 s saved per
command), else through the SQL index."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from aot.cache.index.reader import SqliteReader

if TYPE_CHECKING:
    from aot.cache.cache import Cache
    from aot.cache.index.entry import IndexEntry
    from aot.cache.index.refs import Ref, ReleaseMember
    from aot.cache.index.sql import Index


class ListingReads(Protocol):
    def entries(self, name_glob: str | None = None) -> list[IndexEntry]: ...
    def by_name(self, name: str, env_fp: str | None = None, state: str | None = "ok") -> list[IndexEntry]: ...
    def get(self, key: str) -> IndexEntry | None: ...
    def find_key_prefix(self, prefix: str, *, limit: int | None = None) -> list[str]: ...
    def refs_named(self, name: str, env_fp: str | None = None) -> list[Ref]: ...
    def release_labels(self) -> list[str]: ...
    def release_members(self, label: str, name: str) -> tuple[ReleaseMember, ...] | None: ...


class _IndexReads:
    """The same reads over the SQL index (a database, a tiered cache)."""

    def __init__(self, index: Index) -> None:
        self._index = index
        self.entries = index.entries
        self.by_name = index.by_name
        self.get = index.get
        self.find_key_prefix = index.find_key_prefix
        self.refs_named = index.refs_named
        self.release_members = index.release_members

    def release_labels(self) -> list[str]:
        return [release.label for release in self._index.releases()]


def reads_of(cache: Cache) -> ListingReads:
    """The stdlib reader when the cache reads its own folder through it (a plain folder
    cache; a tiered cache's reports keep reading its SQL index), else the SQL index."""
    from aot.cache.tiered import TieredCache

    reader = cache.reader
    if isinstance(reader, SqliteReader) and not isinstance(cache, TieredCache):
        return reader
    return _IndexReads(cache.index)
