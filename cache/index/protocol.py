"""The one read seam of the index: what the cache and serving read from it.

Two implementations answer it: :class:`~aot.cache.index.reader.SqliteReader` (the
standard library's :mod:`sqlite3`, for a folder cache: serving never imports
SQLAlchemy) and :class:`~aot.cache.index.sql.Index` (SQLAlchemy: a database, or a
folder whose file the stdlib reader cannot read). A cache picks one when it opens
(:attr:`aot.cache.store.ArtifactStore.reader`) and reads through it from then on; writes, gc
and reports use the SQL index itself.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from aot.cache.index.entry import IndexEntry
from aot.cache.index.refs import Ref, ReleaseMember

__all__ = ["IndexReader"]


@runtime_checkable
class IndexReader(Protocol):
    """Reads of artifact rows, and the record of a use."""

    read_only: bool

    def get(self, key: str) -> IndexEntry | None:
        """The row of ``key`` as it is now (None: not stored)."""
        ...

    def by_name(self, name: str, env_fp: str | None = None, state: str | None = "ok") -> list[IndexEntry]:
        """Rows stored under ``name`` (for one environment; ``state=None``: any state),
        oldest first (``created_at``, then key)."""
        ...

    def refs_named(self, name: str, env_fp: str | None = None) -> list[Ref]:
        """The current refs of ``name`` (of one environment): which key each
        (signature, environment) serves."""
        ...

    def release_members(self, label: str, name: str) -> tuple[ReleaseMember, ...] | None:
        """The refs of ``name`` in release ``label``'s current set (None: no such label)."""
        ...

    def names(self) -> list[str]:
        """Every name with at least one row, sorted."""
        ...

    def touch(self, key: str) -> None:
        """Records a use of ``key`` (last-used time, hit count); nothing when read-only,
        and never fails a load (a database error is logged)."""
        ...

    def close(self) -> None:
        ...
