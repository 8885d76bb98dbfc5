"""A local read-through tier for serving replicas: ``aot.Cache(remote, local=DIR)``.

``aot.Cache("postgresql+psycopg://reader@db/aot", blob_location="s3://bucket/aot",
read_only=True, local="/var/cache/aot")`` is a :class:`~aot.cache.cache.TieredCache`
(a :class:`TieredStore` with the public methods of ``aot.Cache``):

* The **remote** (``location`` and ``blob_location``) is the cache of record. Every
  method not listed below (``put``, ``compile``, ``entries``, ``verify``, ``gc``,
  bundles, push and pull) acts on it exactly as without a tier.
* The **local tier** is an ordinary folder cache (SQLite index + blob folder) that
  this process writes, whatever ``read_only`` says about the remote: ``aot --cache
  DIR ls`` inspects it, ``aot --cache DIR pull REMOTE`` fills it ahead of time,
  ``aot --cache DIR gc --older-than 30d`` trims it.
* **Serving reads go through the tier.** :meth:`TieredStore.entries_named` (what
  ``aot.load`` asks first) and :meth:`TieredStore.artifact` (every executable it
  loads, every portable HLO it recompiles): an entry the local tier holds intact is
  read there, with no remote round trip; any other entry of this environment is copied
  from the remote (its row, and its blobs as stored, each verified against its digest,
  under the gc protocol: :meth:`~aot.cache.store.ArtifactStore.copy_entry_from`) and then read
  locally. So a cold start costs one remote round trip per missing blob (fetched in
  parallel), and a warm one none for the blobs. A local copy that fails verification is
  quarantined there and fetched again.
* **Freshness: the remote's rows first.** Each ``aot.load`` asks the remote index for
  the name's rows (one indexed query) and serves those, so a replica started after CI
  stored new buckets or replaced a program serves the new ones, and one that loads
  again sees them too. Why not a time-to-live on local rows: a replaced or removed
  entry would keep being served for up to that long, and the saving is one query per
  ``aot.load``. ``refresh=False`` skips the query for names the local tier already
  holds (nothing remote at all after the first start), for replicas that are
  redeployed rather than refreshed.
* **Remote unreachable: the local tier serves.** If the remote index or blob store
  does not answer (a refused connection, a timeout: the bounds of
  :mod:`aot.cache.timeouts`, e.g. ``AOT_DB_CONNECT_TIMEOUT``), the rows the local tier
  holds are served, with a warning. A replica that starts while the remote is down
  serves its local tier (and cannot reach the remote until it is opened again); one
  with an empty local tier fails as it would without a tier.
* **Statistics** go to the remote index when it is writable, else to the local tier's
  index (:mod:`aot.cache.stats_recorder`): a read-only replica keeps them in its local tier.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from aot.artifact import EXECUTABLE, Artifact, Manifest
from aot.cache.store import ArtifactStore, default_location
from aot.cache.storage.content import ContentStore
from aot.cache.index.entry import IndexEntry
from aot.cache.index.refs import Ref, RefOrigin, ReleaseMember
from aot.cache.storage.locations import FOLDER, classify_location
from aot.errors import BlobLocationError, AotError, CacheError, CorruptArtifactError
from aot.signing import key_from

if TYPE_CHECKING:
    from aot.cache.storage.objectstore import BlobStat

log = logging.getLogger(__name__)

__all__ = ["TieredStore", "FETCH_THREADS"]

#: Entries fetched from the remote at once when a name's rows are missing locally.
FETCH_THREADS = 8


class _Unreachable:
    """The blob store of a remote that could not be opened: every call says so."""

    read_only = True

    def __init__(self, location: str, error: str) -> None:
        self._location = location
        self._error = error

    @property
    def location(self) -> str:
        return self._location

    def _fail(self) -> CacheError:
        return CacheError(f"the remote cache is unreachable ({self._error})")

    def read(self, digest: str) -> bytes | None:
        raise self._fail()

    def write(self, digest: str, payload: bytes) -> None:
        raise self._fail()

    def exists(self, digests: Iterable[str]) -> set[str]:
        raise self._fail()

    def stat(self, digests: Iterable[str]) -> dict[str, BlobStat]:
        raise self._fail()

    def delete(self, digests: Iterable[str]) -> int:
        raise self._fail()

    def list(self) -> Iterator[BlobStat]:
        raise self._fail()

    def touch(self, digest: str) -> None:
        raise self._fail()

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def close(self) -> None:
        pass


class _UnreachableIndex:
    """The index reader of a remote that could not be opened: every read says so (the
    tier's own methods read the local tier instead)."""

    read_only = True

    def __init__(self, message: str) -> None:
        self._message = message

    def __getattr__(self, name: str) -> Any:  # every read of the protocol
        if name.startswith("_"):
            raise AttributeError(name)
        raise CacheError(self._message)

    def touch(self, key: str) -> None:
        pass

    def close(self) -> None:
        pass


class TieredStore(ArtifactStore):
    """A remote cache read through a local folder cache (see the module docstring).

    ``local``: the local tier's folder (created if needed; always writable).
    ``refresh``: ask the remote for a name's rows even when the local tier holds
    some (the default; see "Freshness").
    """

    local: ArtifactStore  # always set: the tier is what this class adds

    def __init__(
        self, location: str | os.PathLike[str] | None = None, *, local: str | os.PathLike[str] | None = None,
        refresh: bool = True, **options: Any,
    ) -> None:
        """``options``: the remote's, as :class:`~aot.cache.store.ArtifactStore` takes them;
        the local tier shares its signing key and network bounds."""
        if local is None:
            raise TypeError("a tiered cache needs local=FOLDER")
        where = classify_location(local)
        if where.kind != FOLDER:
            raise CacheError(
                f"the local tier must be a folder (or file:// URL), got {local!r}: it is "
                "this host's own cache, next to the remote one"
            )
        self.refresh = refresh
        self.remote_error: str | None = None
        # Intact local rows seen by this process, by key (saves a lookup per load).
        self._held: dict[str, IndexEntry] = {}
        self._warned_offline = False
        self.timeouts = options.get("timeouts")  # the remote's; the local tier's statistics flush too
        shared = ("signing_key", "require_signatures", "timeouts")
        self.local = ArtifactStore(where.target, **{k: options[k] for k in shared if k in options})
        try:
            super().__init__(location, **options)
        except BlobLocationError:  # a misconfiguration, not an outage: never hidden by the tier
            self.local.close()
            raise
        except CacheError as exc:
            if self.local.index.is_empty():
                self.local.close()
                raise
            self._offline(location, exc, **options)

    def _offline(
        self, location: Any, exc: CacheError, *, read_only: bool = False, blob_location: Any = None,
        signing_key: Any = None, require_signatures: bool = False, **_: Any,
    ) -> None:
        """The remote could not be opened: serve the local tier alone."""
        self.location = str(location) if location is not None else default_location()
        self.read_only = read_only
        self.signing_key = key_from(signing_key)
        self.require_signatures = require_signatures
        self.blob_location = str(blob_location) if blob_location is not None else None
        self._index = None
        self._index_file = None
        self._environment = {}
        self.remote_error = str(exc)
        self.blobs = ContentStore(_Unreachable(self.blob_location or self.location, str(exc)))
        self.reader = _UnreachableIndex(self._unreachable())
        log.warning(
            "the remote cache %s is unreachable (%s); serving the local tier at %s",
            self.display_location, exc, self.local.location,
        )
        self._start_stats()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.display_location!r}, local={self.local.location!r}, "
            f"read_only={self.read_only})"
        )

    # ------------------------------------------------------------------ plumbing

    @property
    def index(self):  # type: ignore[no-untyped-def,override]
        if self.remote_error is not None:
            raise CacheError(self._unreachable())
        return super().index

    def _unreachable(self) -> str:
        return (
            f"the remote cache {self.display_location} is unreachable ({self.remote_error}); "
            f"the local tier at {self.local.location} serves what it holds (`aot --cache "
            f"{self.local.location} ls` lists it)"
        )

    def default_release(self) -> str | None:
        """The remote's declared default release; offline, the local tier's (None: the
        refs it holds, as an offline replica has always served)."""
        if self.remote_error is not None:
            return self.local.default_release()
        return super().default_release()

    @property
    def stats_cache(self) -> ArtifactStore:
        """Where statistics are kept: the remote when writable, else the local tier."""
        return self if not self.read_only and self.remote_error is None else self.local

    def close(self) -> None:
        super().close()
        self.local.close()

    # ------------------------------------------------------------------ serving reads

    def entries_named(self, name: str, *, state: str | None = "ok") -> list[IndexEntry]:
        """The remote's rows (entries of this environment missing locally are fetched
        now, in parallel); the local tier's when the remote does not answer."""
        if self.remote_error is None:
            if not self.refresh:
                held = self._local_rows(name, state)
                if held:
                    return held
            try:
                rows = super().entries_named(name, state=state)
                self._prefetch(rows)
                return rows
            except CacheError as exc:
                self._warn_offline(exc)
        return self._local_rows(name, state)

    def _local_rows(self, name: str, state: str | None) -> list[IndexEntry]:
        rows = self.local.entries_named(name, state=state)
        self._held.update((e.key, e) for e in rows if e.ok)
        return rows

    def _warn_offline(self, exc: BaseException) -> None:
        level = logging.DEBUG if self._warned_offline else logging.WARNING
        self._warned_offline = True
        log.log(
            level, "the remote cache %s did not answer (%s); serving the local tier at %s",
            self.display_location, exc, self.local.location,
        )

    def _prefetch(self, rows: list[IndexEntry]) -> None:
        """Copies the intact rows of this environment (and symbolic ones) that the local
        tier lacks. A remote blob that fails verification is left for the loader (which
        quarantines it); an unreachable remote raises CacheError."""
        env = self.environment.digest
        wanted = [e for e in rows if e.ok and (e.env_fp == env or e.exe_digest is None)]
        if not wanted:
            return
        self._local_rows(wanted[0].name, "ok")
        missing = [e for e in wanted if e.key not in self._held]
        if not missing:
            return
        log.info("local tier: fetching %d entries of %s from %s", len(missing), missing[0].name,
                 self.display_location)
        self.local.index  # noqa: B018 - opened once, before the threads share it
        if len(missing) == 1:
            results = [self._try_fetch(missing[0])]
        else:
            from concurrent.futures import ThreadPoolExecutor  # several entries to fetch only

            with ThreadPoolExecutor(max_workers=min(FETCH_THREADS, len(missing))) as pool:
                results = list(pool.map(self._try_fetch, missing))
        unreachable = [r for r in results if isinstance(r, CacheError)]  # not corrupt: unreachable
        if unreachable:
            raise unreachable[0]

    def _try_fetch(self, entry: IndexEntry) -> AotError | None:
        try:
            self._fetch(entry)
        except CacheError as exc:
            return exc
        except AotError as exc:  # damaged or unsigned at the remote: the loader says so
            log.warning("local tier: not fetched %s (%s): %s", entry.name, entry.key[:12], exc)
            return exc
        return None

    def _fetch(self, entry: IndexEntry) -> IndexEntry:
        """Copies ``entry`` (row and verified blobs, as stored) into the local tier."""
        stored, outcome = self.local.copy_entry_from(self, entry)
        log.debug("local tier: %s %s (%s)", outcome, entry.name, entry.key[:12])
        self._held[stored.key] = stored
        return stored

    def artifact(
        self, entry: IndexEntry | str, *, roles: Iterable[str] | None = None, manifest: Manifest | None = None,
    ) -> Artifact:
        """From the local tier when it holds the entry intact; else fetched into it
        first (when the executable is wanted, or the entry has none); the portable HLO
        of an entry the tier does not hold is read from the remote. ``manifest`` is
        not used: the tier's own row is read (and parsed)."""
        if isinstance(entry, str):
            entry = self.entry(entry)
        wanted = tuple(roles) if roles is not None else None
        here = self._held.get(entry.key) or self.local.index.get(entry.key)
        if here is not None and here.ok:
            try:
                return self.local.artifact(here, roles=wanted)
            except CorruptArtifactError as exc:
                if self.remote_error is not None:
                    raise
                log.warning("local tier: %s; fetching it again from %s", exc, self.display_location)
                self._held.pop(entry.key, None)
                self.local.quarantine(here, str(exc))
        if self.remote_error is not None:
            raise CacheError(
                f"{entry.name} ({entry.key[:12]}) is not in the local tier at "
                f"{self.local.location} and the remote cache is unreachable ({self.remote_error})"
            )
        if wanted is None or EXECUTABLE in wanted or entry.exe_digest is None:
            stored = self._fetch(entry)
            return self.local.artifact(stored, roles=wanted)
        return super().artifact(entry, roles=wanted)

    def touch(self, key: str) -> None:
        if self.remote_error is None:
            super().touch(key)
        self.local.touch(key)

    def quarantine(self, entry: IndexEntry, reason: str) -> bool:
        """Quarantines the row at the remote (when writable) and the tier's copy; what
        the remote answered (False when read-only or unreachable)."""
        done = False
        if self.remote_error is None:
            try:
                done = super().quarantine(entry, reason)
            except CacheError as exc:
                self._warn_offline(exc)
        self._held.pop(entry.key, None)
        here = self.local.index.get(entry.key)
        if here is not None and here.ok:
            self.local.quarantine(here, reason)
        return done

    def reread(self, entry: IndexEntry) -> IndexEntry | None:
        """The row as the remote has it now; the tier's when the remote does not answer."""
        if self.remote_error is None:
            try:
                return super().reread(entry)
            except CacheError as exc:
                self._warn_offline(exc)
        return self.local.reread(entry)

    def refs_named(self, name: str) -> list[Ref]:
        """The remote's refs of ``name``, recorded in the local tier as they are (so a
        replica serving its tier while the remote is down serves the same keys); the
        tier's own when the remote does not answer."""
        if self.remote_error is None:
            try:
                refs = super().refs_named(name)
            except CacheError as exc:
                self._warn_offline(exc)
            else:
                self._mirror_refs(name, refs)
                return refs
        return self.local.refs_named(name)

    def _mirror_refs(self, name: str, refs: list[Ref]) -> None:
        try:
            held = {r.slot: r.key for r in self.local.refs_named(name)}
            wanted = {r.slot: r.key for r in refs}
            if held == wanted:
                return
            index = self.local.index
            stale = set(held) - set(wanted)
            if stale:
                index.drop_refs(stale)
            changed = [(*slot, key) for slot, key in wanted.items() if held.get(slot) != key]
            if changed:
                index.set_refs(changed, RefOrigin(f"tier copy of {self.display_location}"))
        except AotError as exc:  # the tier serves without them: never fail a load here
            log.warning("local tier: could not record the refs of %s: %s", name, exc)

    def release_members(self, label: str, name: str) -> tuple[ReleaseMember, ...] | None:
        """The remote's members of ``name`` in ``label`` (recorded in the local tier
        under the same label when they differ); the tier's when the remote does not
        answer."""
        if self.remote_error is None:
            try:
                members = super().release_members(label, name)
            except CacheError as exc:
                self._warn_offline(exc)
            else:
                if members is not None:
                    self._mirror_release(label, name, members)
                return members
        return self.local.release_members(label, name)

    def _mirror_release(self, label: str, name: str, members: tuple[ReleaseMember, ...]) -> None:
        try:
            if self.local.release_members(label, name) == members:
                return
            index = self.local.index
            origin = RefOrigin(f"tier copy of {self.display_location}", release=label)
            # A new set: the other names' members of the current one, and these (one transaction).
            index.declare_release(
                label, [(m.name, m.signature, m.env_fp, m.key) for m in members], origin,
                set_refs=False, keep=lambda m: m.name != name,
            )
        except AotError as exc:
            log.warning("local tier: could not record release %s of %s: %s", label, name, exc)

    def names(self) -> list[str]:
        if self.remote_error is None:
            try:
                return super().names()
            except CacheError as exc:
                self._warn_offline(exc)
        return self.local.names()
