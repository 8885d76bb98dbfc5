"""What a cache serves, as :class:`aot.Cache` methods: release labels (list, show,
promote, roll back, remove) and the history of refs. A mixin of the ArtifactStore, thin over
:class:`aot.cache.index.refs_sql.IndexRefs`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from aot.cache.index.refs import RefOrigin
from aot.errors import CacheError

if TYPE_CHECKING:
    from aot.cache.index.protocol import IndexReader
    from aot.cache.index.refs import Ref
    from aot.cache.index.releases import Release, ReleaseRemoval
    from aot.cache.index.sql import Index

__all__ = ["ReleaseMethods"]


class ReleaseMethods:
    """Release and ref-history methods of :class:`~aot.cache.store.ArtifactStore`."""

    reader: IndexReader
    display_location: Any

    @property
    def index(self) -> Index:  # ArtifactStore's
        raise NotImplementedError

    def check_writable(self, what: str) -> None:  # implemented by ArtifactStore
        raise NotImplementedError

    def _label_hint(self, label: str) -> str:
        from aot.cache.index.releases import label_hint  # not on a serving process's path

        return label_hint(label, self.reader.release_labels())

    def releases(self) -> list[Release]:
        """The current set of every release label (without members)."""
        return self.index.releases()

    def release(self, label: str) -> Release:
        """The current set of ``label`` with its members; CacheError when none."""
        found = self.index.release_set(label)
        if found is None:
            raise CacheError(f"no release labelled {label!r} in {self.display_location}"
                             f"{self._label_hint(label)}; `aot release ls` lists them")
        return found

    def release_history(self, label: str, limit: int | None = None) -> list[Release]:
        """Every set ``label`` pointed to, newest first (without members): each move --
        a declaration (crediting each manifest of the run that added members), a
        promotion (source ``promote SOURCE set ID``, with that set's commit), a rollback
        -- with when, host and user. CacheError when there is no such label."""
        found = self.index.release_history(label)
        if not found:
            raise CacheError(f"no release labelled {label!r} in {self.display_location}"
                             f"{self._label_hint(label)}; `aot release ls` lists them")
        return found[:limit] if limit is not None else found

    def promote(self, source: str, target: str, origin: RefOrigin | None = None) -> Release:
        """Points label ``target`` at the set ``source`` points to now: a new set of
        ``target`` that records the set promoted and its commit."""
        self.check_writable("promote a release")
        return self.index.promote(source, target, origin or RefOrigin(f"promote {source}", release=target))

    def rollback(self, label: str, origin: RefOrigin | None = None) -> Release:
        """Points ``label`` back at the set it pointed to before."""
        self.check_writable("roll back a release")
        return self.index.rollback(label, origin or RefOrigin(f"rollback {label}", release=label))

    def remove_release(
        self, labels: str | Iterable[str] | ReleaseRemoval, *, dry_run: bool = False,
    ) -> ReleaseRemoval:
        """Removes release labels (every set of each), so that what only they pinned
        becomes collectable by gc; a replica loading a removed label then fails at
        start-up (:class:`aot.ReleaseNotFoundError`). Returns the plan: the labels'
        current and rollback sets, the entries unpinned and those something else still
        pins. ``dry_run`` changes nothing; a plan from a dry run may be passed back to
        carry out exactly it. CacheError for an unknown label (naming those that exist);
        ReadOnlyCacheError on a read-only cache unless ``dry_run``."""
        if not dry_run:
            self.check_writable("remove a release")
        from aot.cache.index.releases import ReleaseRemoval  # a release's removal only

        if isinstance(labels, ReleaseRemoval):
            plan = labels
        else:
            plan = self.index.plan_release_removal([labels] if isinstance(labels, str) else list(labels))
        return plan if dry_run else self.index.remove_releases(plan)

    def default_release(self) -> str | None:
        """The release label a replica serves when it names none (``aot.load`` without
        ``release=`` and without ``AOT_RELEASE``); None: the cache declares no default,
        and such a replica serves the refs (docs/serving.md, "What is served")."""
        return self.reader.default_release()

    def set_default_release(self, label: str | None, origin: RefOrigin | None = None) -> str | None:
        """Declares ``label`` the release served by a replica that names none (None:
        the refs again). The label must exist; it is a label, not a set, so the default
        follows its promotions and rollbacks. Returns the previous default."""
        self.check_writable("set the default release")
        import sqlalchemy as sa

        from aot.cache.index.schema import DEFAULT_RELEASE

        if label is not None:
            self.release(label)  # CacheError naming `aot release ls` for an unknown label
        origin = origin or RefOrigin("release default")
        with self.index._write("set the default release") as conn:
            before = conn.execute(
                sa.select(DEFAULT_RELEASE.c.label).where(DEFAULT_RELEASE.c.id == 1)
            ).scalar_one_or_none()
            conn.execute(sa.delete(DEFAULT_RELEASE).where(DEFAULT_RELEASE.c.id == 1))
            conn.execute(sa.insert(DEFAULT_RELEASE).values(
                id=1, label=label, set_at=self.index.now(), host=origin.host, user=origin.user,
            ))
        return before

    def history(self, name: str, limit: int | None = None) -> list[Ref]:
        """Every change of the refs of ``name``, newest first."""
        return self.index.ref_history(name, limit=limit)

