"""The artifact store: an SQL index plus a blob store, holding artifacts by key.

:class:`ArtifactStore` finds, loads, stores and quarantines entries, delegating the
work to the modules below it: reading and storing an entry's artifact
(at the end of this module: read back verified, or stored under the gc protocol).
The local read-through tier (:mod:`aot.cache.tiered`), serving, the warm-up, admin
and reports take an ``ArtifactStore``; ``aot.Cache`` (:mod:`aot.cache.cache`) is one,
with the public methods that compose those layers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from aot.artifact import CONSTANTS, EXECUTABLE, PORTABLE_HLO, Artifact, Manifest
from aot.errors import (
    ArtifactNotFoundError, CacheError, CorruptArtifactError, IncompatibleEnvironmentError, ReadOnlyCacheError,
)
from aot.fingerprint import Fingerprint, environment_fingerprint, known_environment
from aot.signing import key_from, sign, verify
from aot.cache.storage.content import ContentStore
from aot.cache.index.entry import INDEX_FILE, IndexEntry, entry_digests, referenced_digests
from aot.cache.index.release_methods import ReleaseMethods
from aot.cache.index.refs import Ref, RefOrigin, ReleaseMember
from aot.cache.storage.locations import DATABASE, FOLDER, OBJECT, classify_location, open_object_store, same_database
from aot.cache.timeouts import Timeouts

if TYPE_CHECKING:
    from aot.executable import MeshExecutable
    from aot.cache.index.protocol import IndexReader
    from aot.cache.index.sql import Index
    from aot.cache.stats_recorder import StatsRecorder

log = logging.getLogger(__name__)

CACHE_ENV = "AOT_CACHE"

class BackgroundWork(Protocol):
    """Work running over a cache in other threads (``aot.load(background=True)``):
    :meth:`Cache.close` stops it before it closes the stores it reads."""

    def stop(self) -> None: ...


def default_location() -> str:
    """``$AOT_CACHE``, else the user's cache folder (e.g. ``~/.cache/jax-aot``)."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    import platformdirs  # not needed by a process that names its cache

    return platformdirs.user_cache_dir("jax-aot", appauthor=False)


def _lost_index_message(folder: Path) -> str | None:
    """What to say when a folder's index is missing or empty but its blobs are there."""
    index_file = folder / INDEX_FILE
    blobs = _count_blob_files(folder / "blobs")
    if not blobs:
        return None
    state = "is empty (0 bytes)" if index_file.is_file() else "is missing"
    return (
        f"the cache index {index_file} {state}, but {folder / 'blobs'} holds {blobs} "
        "blobs: the index was lost or truncated. Restore index.sqlite from a backup, or "
        "rebuild it (`aot bundle import` a bundle, or `aot warmup` again: stored blobs are "
        "reused; `aot gc` will not delete them while the index is empty)"
    )


def _count_blob_files(root: Path) -> int:
    """Blob files in a folder store, without opening the store (cheap, read-only)."""
    from aot.cache.storage.folder import FolderObjectStore

    if not root.is_dir():
        return 0
    return sum(1 for _ in FolderObjectStore(root, read_only=True).list())


def require_cache(
    location: str, why: str = "nothing was compiled into it yet",
    advice: str = "check the path or AOT_CACHE",
) -> None:
    """Raises :class:`CacheError` when ``location`` is a folder that holds no cache
    (a database URL is checked when it is opened), so that a mistyped path is never
    taken for an empty cache; says so when the index is missing or empty but blobs
    are there (a lost or truncated index)."""
    if classify_location(location).scheme is not None:  # a URL: checked when opened
        return
    folder = Path(location).expanduser()
    index_file = folder / INDEX_FILE
    if index_file.is_file() and index_file.stat().st_size > 0:
        return
    raise CacheError(_lost_index_message(folder) or f"no cache at {folder} ({why}); {advice}")


def load_executable(artifact: Artifact, *, current: Any, manifest_checked: bool = False) -> MeshExecutable:
    """:func:`aot.rehydrate.load_executable`, imported when an executable is loaded:
    listing and maintenance commands use this module without JAX."""
    from aot.rehydrate import load_executable as rehydrate

    return rehydrate(artifact, current=current, manifest_checked=manifest_checked)


class ArtifactStore(ReleaseMethods):
    """A fingerprint-keyed artifact cache.

    ``location``: ``None`` -> ``$AOT_CACHE`` or the user cache folder; a folder (or
    ``file://`` URL) -> SQLite index and zstd blobs there; a SQLAlchemy URL
    (``postgresql+psycopg://...``, told by its dialect) -> a shared index, with blobs
    in the same database unless ``blob_location`` names another store: a folder,
    ``file://``, ``s3://``, ``gs://``, ``az://`` (:func:`~aot.cache.storage.locations.open_object_store`).
    ``cache.blobs`` is the :class:`~aot.cache.storage.content.ContentStore` over it.

    ``aot.Cache(..., local="/var/cache/aot")`` adds a local read-through tier for
    serving replicas: the object is then a :class:`~aot.cache.cache.TieredCache`
    (see :mod:`aot.cache.tiered`).

    ``cache.stats`` records serving statistics (:mod:`aot.cache.stats_recorder`). ``timeouts``:
    an :class:`aot.Timeouts` bounding its network waits (None: the environment's).

    ``create=False`` opens an existing cache only (the read commands): a folder or
    SQLite file that is missing, an empty or foreign database, or an index of an older
    schema is a :class:`CacheError` saying what was found; nothing is created or migrated.
    """

    _background: weakref.WeakSet[BackgroundWork] | None = None
    #: The local read-through tier (:class:`~aot.cache.tiered.TieredStore`); None: none.
    local: ArtifactStore | None = None

    def __init__(
        self,
        location: str | os.PathLike[str] | None = None,
        *,
        signing_key: str | bytes | None = None,
        read_only: bool = False,
        blob_location: str | os.PathLike[str] | None = None,
        require_signatures: bool = False,
        blob_mirror: bool = False,
        timeouts: Timeouts | None = None,
        create: bool = True,
    ) -> None:
        location = str(location) if location is not None else default_location()
        self.timeouts = _checked_timeouts(timeouts)
        self.create = create
        self.blob_mirror = blob_mirror
        self.location = location
        self.read_only = read_only
        self.signing_key = key_from(signing_key)
        self.require_signatures = require_signatures
        self.blob_location = str(blob_location) if blob_location is not None else None
        self._index: Index | None = None
        self._index_file: Path | None = None
        where = classify_location(location)
        described = None
        if where.kind == OBJECT:
            raise CacheError(
                f"{where.scheme}:// cannot hold a cache index: give a folder or a database URL "
                f"as the cache, and the object store as its blob location, e.g. "
                f"Cache('postgresql+psycopg://host/db', blob_location={location!r}) "
                f"(aot --cache URL --blobs {location})"
            )
        if where.kind == DATABASE:
            from aot.cache.index.sql import Index

            self._index = Index(location, read_only=read_only, timeouts=self.timeouts, create=create)
            described = _described_blobs(self)
            if self.blob_location is None or same_database(self.blob_location, location):
                from aot.cache.storage.database import SqlObjectStore

                store = SqlObjectStore(self._index.engine, read_only=read_only)
            else:
                store = self._open_blobs(self.blob_location)
        else:
            store = _open_folder(self, Path(where.target))
        self.blobs = ContentStore(store)
        if self._index is not None and not read_only:
            self._index.journal_to(weakref.ref(self))  # release sets and captured GPUs journaled as blobs
        if where.kind == DATABASE and described is None and not read_only and not blob_mirror:
            _record_description(self)
        try:
            self.reader: IndexReader = _open_reader(self)
        except BaseException:
            self.blobs.close()
            if self._index is not None:
                self._index.close()
            raise
        self._environment: dict[tuple[bool, str, str], Any] = {}
        self._start_stats()

    def _start_stats(self) -> None:
        """``self.stats``, flushed by :meth:`close` or when this object is collected."""
        self.stats = self.stats_cache.recorder()
        self._stats_finalizer = weakref.finalize(self, self.stats.close)

    @property
    def stats_cache(self) -> ArtifactStore:
        """The cache whose index keeps this one's statistics (a tier's may be its local one)."""
        return self

    def recorder(self) -> StatsRecorder:
        """A recorder of serving statistics into this cache's index, in memory when read-only (it
        never holds the cache: its finalizer flushes it); the last flush bounded by ``timeouts``."""
        from aot.cache.index.call_stats import IndexSink, SqliteFileSink
        from aot.cache.stats_recorder import StatsRecorder

        exit_seconds = self.timeouts.stats_exit_s if self.timeouts is not None else None
        if self.read_only:
            return StatsRecorder(self.display_location, exit_seconds=exit_seconds)
        index_file = self._index_file
        if index_file is not None:
            return StatsRecorder(str(index_file), lambda: SqliteFileSink(index_file), exit_seconds)
        index = self.index
        return StatsRecorder(index.url, lambda: IndexSink(index), exit_seconds)

    def _open_blobs(self, location: str) -> Any:
        engine = self._index.engine if self._index is not None and same_database(location, self.location) else None
        try:
            return open_object_store(location, read_only=self.read_only, engine=engine, timeouts=self.timeouts)
        except CacheError:
            if self._index is not None:
                self._index.close()
            raise

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.display_location!r}, read_only={self.read_only})"

    @property
    def index(self) -> Index:
        """The SQL index (SQLAlchemy), opened on first use."""
        if self._index is None:
            from aot.cache.index.sql import Index

            assert self._index_file is not None
            self._index = Index.for_folder(self._index_file.parent, read_only=self.read_only, create=self.create)
            if not self.read_only:
                self._index.journal_to(weakref.ref(self))
        return self._index

    def entries_named(self, name: str, *, state: str | None = "ok") -> list[IndexEntry]:
        """Every entry stored under ``name`` (all environments)."""
        return self.reader.by_name(name, state=state)

    def refs_named(self, name: str) -> list[Ref]:
        """The current refs of ``name``: the key each (signature, environment) serves."""
        return self.reader.refs_named(name)

    def release_members(self, label: str, name: str) -> tuple[ReleaseMember, ...] | None:
        """The refs of ``name`` in release ``label`` (None: no such label)."""
        return self.reader.release_members(label, name)

    def set_refs(
        self, entries: Iterable[IndexEntry], origin: RefOrigin, *, release_id: int | None = None,
    ) -> list[Ref]:
        """Declares each entry the one served for its (name, signature, environment)."""
        self.check_writable("set refs")
        targets = [(e.name, e.signature, e.env_fp, e.key) for e in entries]
        return self.index.set_refs(targets, origin, release_id=release_id) if targets else []

    def lookup(self, key: str) -> IndexEntry | None:
        """The row of ``key`` (None: not stored)."""
        return self.reader.get(key)

    def touch(self, key: str) -> None:
        """Records a use of ``key`` (last-used time for gc, hit count)."""
        if self.read_only:
            return
        self.reader.touch(key)

    @property
    def display_location(self) -> str:
        """``location`` for messages and logs: a database URL's password is masked."""
        if classify_location(self.location).kind == FOLDER:
            return self.location
        from aot.cache.index.advice import mask_url

        return mask_url(self.location)

    def hold_background(self, work: BackgroundWork) -> None:
        """Background loading over this cache: :meth:`close` stops it first."""
        if self._background is None:
            self._background = weakref.WeakSet()
        self._background.add(work)

    def close(self) -> None:
        # Loads still running read through this cache: cancel the rest, wait for them.
        for work in list(self._background or ()):
            work.stop()
        self._stats_finalizer()  # the last statistics, while the index is open
        if self.reader is not self._index:
            self.reader.close()
        self.blobs.close()
        if self._index is not None:
            self._index.close()

    def __enter__(self) -> ArtifactStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def environment(self):  # type: ignore[no-untyped-def]
        """This process's environment fingerprint, in the current x64 mode (an entry
        compiled under ``jax.enable_x64(True)`` is checked against an x64 environment),
        recomputed when ``XLA_FLAGS`` or ``LIBTPU_INIT_ARGS`` changes in this process
        (all are parts)."""
        import jax

        current = (
            bool(getattr(jax.config, "jax_enable_x64")), os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", ""),
        )
        if current not in self._environment:
            self._environment[current] = environment_fingerprint()
        return self._environment[current]

    def options(self) -> dict[str, Any]:
        """The keyword arguments that open this cache again elsewhere (a warm-up worker,
        the other end of a push): its signing key, signature policy, blob location and
        network bounds (absent when the environment's: the other process reads its own)."""
        options: dict[str, Any] = {
            "signing_key": self.signing_key, "require_signatures": self.require_signatures,
            "blob_location": self.blob_location,
        }
        if self.timeouts is not None:
            options["timeouts"] = self.timeouts
        return options

    def known_environment(self) -> Fingerprint | None:
        """This host's environment fingerprint without opening a device (a TPU may be
        held by a server), or None when it cannot be known so: what the reports compare
        entries with (:func:`aot.fingerprint.known_environment`)."""
        return known_environment(lambda: self.environment)

    # ------------------------------------------------------------------ writing

    def check_writable(self, what: str) -> None:
        """Raises :class:`ReadOnlyCacheError` naming ``what`` when the cache is read-only."""
        if self.read_only:
            if self._index_file is not None:
                from aot.cache.index.read_only import read_only_file_system

                if read_only_file_system(self._index_file.parent):
                    raise ReadOnlyCacheError(
                        f"cannot {what}: the cache at {self.display_location} is on a read-only "
                        "file system; copy it to a writable one (or compile in CI and ship a bundle)"
                    )
            raise ReadOnlyCacheError(
                f"cannot {what}: the cache at {self.display_location} is read-only; open it "
                "without read_only=True (or compile in CI and ship a bundle)"
            )

    def put_artifact(self, artifact: Artifact) -> IndexEntry:
        """Stores an artifact: blobs first (durable), the index row last.

        Safe against a concurrent gc (the protocol is in docs/reliability.md): the
        blobs are leased in the index before they are checked or written, and the
        lease is released in the transaction that commits the row.
        """
        return self.store_artifact(artifact)[0]

    def store_artifact(
        self, artifact: Artifact, *, created_at: datetime | None = None, replace_row: bool = False,
    ) -> tuple[IndexEntry, str]:
        """:meth:`put_artifact`, and what it did: ``"stored"``, ``"present"`` (stored
        and intact already: nothing written) or ``"repaired"`` (the stored row's blobs
        were missing or corrupt; blobs written again and the row replaced).
        ``created_at``: the compile time to keep (a bundle's entry), else now.
        ``replace_row``: replace the stored row of the key (a refreshed portable HLO)."""
        return _store_artifact(self, artifact, created_at=created_at, replace_row=replace_row)

    def copy_entry_from(self, source: ArtifactStore, entry: IndexEntry) -> tuple[IndexEntry, str]:
        """Stores ``source``'s entry here: its blobs copied as stored (no recompression,
        each verified), under the same gc protocol as :meth:`put_artifact`. Returns the
        stored entry and ``"stored"`` / ``"present"`` / ``"repaired"``."""
        return _copy_entry(self, source, entry)

    # ------------------------------------------------------------------ reading

    def resolve_key(self, key_or_prefix: str) -> str:
        if len(key_or_prefix) == 64 and self.index.get(key_or_prefix) is not None:
            return key_or_prefix
        keys = self.index.find_key_prefix(key_or_prefix, limit=3) if len(key_or_prefix) >= 4 else []
        if len(keys) == 1:
            return keys[0]
        if len(keys) > 1:
            raise ArtifactNotFoundError(
                f"key prefix {key_or_prefix!r} is ambiguous ({', '.join(k[:16] for k in keys)}, ...); "
                "give more characters"
            )
        raise ArtifactNotFoundError(
            f"no artifact with key {key_or_prefix!r} in the cache at {self.display_location}; "
            "`aot ls` lists what is stored"
        )

    def entry(self, key: str) -> IndexEntry:
        entry = self.index.get(self.resolve_key(key))
        assert entry is not None
        return entry

    def artifact(
        self, entry: IndexEntry | str, *, roles: Iterable[str] | None = None, manifest: Manifest | None = None,
    ) -> Artifact:
        """The manifest and its verified blobs; raises CorruptArtifactError, IntegrityError.

        ``roles`` (e.g. ``("portable_hlo",)``) reads only those blobs, so a corrupt or
        missing executable does not stop a recompilation from the portable HLO.
        ``manifest``: ``entry.manifest`` already parsed (still checked against the row).
        """
        if isinstance(entry, str):
            entry = self.entry(entry)
        return _read_artifact(self, entry, roles, manifest)

    def load(self, entry: IndexEntry | str, *, manifest: Manifest | None = None) -> MeshExecutable:
        """Rehydrates the executable of one entry (no recompilation).

        Not a use of the entry by itself: :meth:`get` and a :meth:`compile` hit record
        one (last-used time, hits), an ``aot.load`` dispatcher records its calls
        (:mod:`aot.cache.stats_recorder`), so that an entry loaded at start-up and never called
        ages (``aot gc --older-than``)."""
        if isinstance(entry, str):
            entry = self.entry(entry)
        start = time.perf_counter()
        # Only the executable: a damaged portable HLO must not block an intact one.
        artifact = self.artifact(entry, roles=(EXECUTABLE, CONSTANTS), manifest=manifest)
        checked = manifest is not None and artifact.manifest is manifest  # a tier reads its own
        executable = load_executable(artifact, current=self.environment, manifest_checked=checked)
        self.stats.loaded(self.environment.digest, entry, time.perf_counter() - start)
        return executable

    def get(self, key: str) -> MeshExecutable:
        """The executable stored under ``key`` (a full key or a unique prefix)."""
        entry = self.entry(key)
        executable = self.load(entry)
        self.touch(entry.key)  # handed out: a use (its calls are not counted)
        return executable

    def quarantine(self, entry: IndexEntry, reason: str) -> bool:
        """Marks ``entry`` unusable, only while its row still names the blobs and the
        manifest of ``entry`` (a stale snapshot must not condemn a rewritten row).
        False: read-only, or the row changed or is gone (re-read it)."""
        if self.read_only:
            log.warning("cannot quarantine %s (read-only cache): %s", entry.key[:12], reason)
            return False
        if not self.index.quarantine(entry.key, reason, expect=entry):
            log.info("not quarantining %s: its row changed since it was read", entry.key[:12])
            return False
        log.warning("quarantined %s", described(entry, reason))
        return True

    def reread(self, entry: IndexEntry) -> IndexEntry | None:
        """The row of ``entry.key`` as it is now (None: deleted)."""
        return self.reader.get(entry.key)

    def names(self) -> list[str]:
        """Every name stored (all environments and states)."""
        return self.reader.names()

    def entries(self, name: str | None = None) -> list[IndexEntry]:
        """Stored entries, all or those whose name matches a glob."""
        return self.index.entries(name)


def described(entry: IndexEntry, reason: str) -> str:
    """``tiny (e8c40d8df0dc): why``, naming the entry once (a library error's message
    often starts with the same words)."""
    head = f"{entry.name} ({entry.key[:12]})"
    return f"{head}: {reason.removeprefix(head + ': ')}"


def _open_reader(cache: ArtifactStore) -> IndexReader:
    """The index's read seam (:class:`~aot.cache.index.protocol.IndexReader`), chosen
    once, here: the SQL index of a database; for a folder cache the standard
    library's reader, so that serving and a fully cached warm-up never import
    SQLAlchemy, unless that reader cannot read the file (another schema version, a
    damaged file): then the SQL index, which migrates it or says what is wrong."""
    if cache._index_file is None:
        return cache.index
    from aot.cache.index.reader import SqliteReader

    try:
        return SqliteReader(cache._index_file, read_only=cache.read_only)
    except CacheError as exc:
        log.debug("stdlib reader: cannot read %s (%s); using the SQL index", cache._index_file, exc)
        return cache.index


def _open_folder(cache: ArtifactStore, folder: Path) -> Any:
    """The blob store of a folder cache; creates the folder, and the index of a new one."""
    cache._index_file = index_file = folder / INDEX_FILE
    if not cache.create and not cache.read_only:
        # create=False: a folder without an index is an error; a foreign or older index
        # is refused by the readers (the SQL index of create=False neither creates nor migrates).
        require_cache(
            str(folder), "opened with create=False, so nothing was created",
            "aot compile, aot warmup and aot bundle import create a cache; check the path or AOT_CACHE",
        )
        from aot.cache.index.reader import refuse_foreign

        refuse_foreign(index_file)
    if not cache.read_only:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot create the cache folder {folder}: {exc}") from exc
    elif not index_file.is_file() or index_file.stat().st_size == 0:
        raise CacheError(
            _lost_index_message(folder)
            or f"no cache at {folder} (opened read-only, so nothing was created); "
            "check the path or AOT_CACHE"
        )
    if not index_file.exists():
        cache.index  # noqa: B018 - creates the schema of a new cache now
    return cache._open_blobs(cache.blob_location or str(folder / "blobs"))


def _checked_timeouts(timeouts: Any) -> Timeouts | None:
    if timeouts is None or isinstance(timeouts, Timeouts):
        return timeouts
    raise TypeError(
        f"timeouts must be an aot.Timeouts (or None: the environment's), got "
        f"{type(timeouts).__name__}: e.g. timeouts=aot.Timeouts(blob_read_s=2)"
    )


def _described_blobs(cache: ArtifactStore) -> Any:
    """A database cache's recorded description (None: none yet); sets
    ``blob_location`` to the recorded one when none was given, refuses another one
    unless ``blob_mirror`` (:mod:`aot.cache.index.description`)."""
    from aot.cache.index.description import choose_blob_location

    assert cache._index is not None
    try:
        found = cache._index.description()
        cache.blob_location = choose_blob_location(
            found, cache.blob_location, cache.location, mirror=cache.blob_mirror,
            shown_cache=cache.display_location,
        )
    except BaseException:
        cache._index.close()
        raise
    return found


def _record_description(cache: ArtifactStore) -> None:
    """Records a database cache's blob location (a new cache, or an old one whose blobs
    are found there: :func:`aot.cache.index.description.record_description`)."""
    from aot.cache.index.description import record_description

    try:
        record_description(cache.index, cache.blobs, cache.blob_location, cache.location, cache.display_location)
    except BaseException:
        cache.blobs.close()
        cache.index.close()
        raise


# ---------------------------------------------------------------- an entry's artifact
# Reading checks the manifest against its index row, verifies its signature (when the
# cache has a key) and reads the blobs through the content store, which verifies each
# digest; any mismatch is a CorruptArtifactError naming the entry. Storing is the
# writer's side of the gc protocol: a writer leases the digests of an entry in the
# index, makes its blobs durable, then commits the row and releases the lease in one
# transaction, and starts over when gc took an expired lease meanwhile
# (docs/reliability.md). Storing an artifact and copying an entry from another cache
# (push, pull, the local tier) share it; what differs is how the blobs are written.

#: How many times a writer starts over when gc took its expired lease.
LEASE_ATTEMPTS = 3


def _read_artifact(
    cache: ArtifactStore, entry: IndexEntry, roles: Iterable[str] | None = None, parsed: Manifest | None = None,
) -> Artifact:
    """The manifest of ``entry`` and its verified blobs (only those of ``roles`` when
    given) (:meth:`Cache.artifact <aot.cache.store.ArtifactStore.artifact>`). ``parsed``:
    ``entry.manifest`` already parsed."""
    label = f"{entry.name} ({entry.key[:12]})"
    try:
        manifest = Manifest.from_json(entry.manifest) if parsed is None else parsed
    except CorruptArtifactError as exc:
        raise CorruptArtifactError(f"{label}: {exc}; run `aot verify` and recompile it") from None
    except IncompatibleEnvironmentError as exc:  # another format version: say which entry
        raise IncompatibleEnvironmentError(f"{label}: {exc}", exc.differences) from None
    if manifest.key != entry.key:
        raise CorruptArtifactError(
            f"{label}: the index row's manifest is for key {manifest.key[:12]}; "
            "run `aot verify` and recompile it"
        )
    verify(manifest, cache.signing_key, require=cache.require_signatures)
    wanted = set(roles) if roles is not None else None
    blobs: dict[str, bytes] = {}
    for role, ref in manifest.blobs.items():
        if wanted is not None and role not in wanted:
            continue
        try:
            data = cache.blobs.get(ref.digest, ref.size)  # verifies the digest and size
        except CorruptArtifactError as exc:
            raise CorruptArtifactError(f"{label}: {role} {exc}") from None
        if data is not None:
            blobs[ref.digest] = data
    # The store hashed each blob it returned: Artifact.blob need not hash them again.
    return Artifact(manifest, blobs, verified=dict(blobs))


def _store_artifact(
    cache: ArtifactStore, artifact: Artifact, *, created_at: datetime | None = None, replace_row: bool = False,
) -> tuple[IndexEntry, str]:
    """Stores ``artifact`` in ``cache``: the entry, and ``"stored"``, ``"present"`` or
    ``"repaired"`` (:meth:`Cache.store_artifact <aot.cache.store.ArtifactStore.store_artifact>`).
    ``created_at``: the compile time the row keeps (a bundle's); else the index's now."""
    data: dict[str, bytes] = {}

    def write_blobs() -> dict[str, tuple[int, int]]:
        if not data:
            data.update((ref.digest, artifact.blob(role)) for role, ref in manifest.blobs.items())  # verified
        sizes = {}
        for digest, blob in data.items():
            stored = cache.blobs.store_bytes(blob)
            sizes[digest] = (stored.size, stored.stored_size)
        return sizes

    manifest = manifest_to_store(cache, artifact.manifest)
    return commit(cache, manifest, write_blobs, created_at=created_at, replace_row=replace_row)


def _copy_entry(cache: ArtifactStore, source: ArtifactStore, entry: IndexEntry) -> tuple[IndexEntry, str]:
    """Stores ``source``'s entry in ``cache``: its blobs copied as stored (no
    recompression, each verified), under the same protocol as :func:`store_artifact`.
    The row keeps the source's compile time (``created_at``): a copy is not newer."""
    manifest = manifest_to_copy(cache, source, entry)
    raw = {ref.digest: ref.size for ref in manifest.blobs.values()}

    def copy_blobs() -> dict[str, tuple[int, int]]:
        report = source.blobs.copy_to(cache.blobs, raw)
        return {d: (raw[d], report.stored_sizes[d]) for d in raw}

    return commit(cache, manifest, copy_blobs, created_at=entry.created_at)


def manifest_to_copy(cache: ArtifactStore, source: ArtifactStore, entry: IndexEntry) -> Manifest:
    """The manifest of ``source``'s ``entry`` as ``cache`` stores it: parsed, its
    signature checked as the source requires, checked and signed as for a store."""
    try:
        manifest = Manifest.from_json(entry.manifest)
    except CorruptArtifactError as exc:
        raise CorruptArtifactError(f"{entry.name} ({entry.key[:12]}): {exc}") from None
    verify(manifest, source.signing_key, require=source.require_signatures)
    return manifest_to_store(cache, manifest)


def manifest_to_store(cache: ArtifactStore, manifest: Manifest) -> Manifest:
    """``manifest`` checked (name rule) and signed with ``cache``'s key."""
    from aot.cache.names import check_name  # writers only: serving never imports it

    cache.check_writable("store an artifact")
    check_name(manifest.name)  # before any blob is written
    if cache.signing_key is not None:
        if manifest.hmac is None:
            return sign(manifest, cache.signing_key)
        verify(manifest, cache.signing_key)  # signed elsewhere: only if this cache could load it
    return manifest


def commit(
    cache: ArtifactStore, manifest: Manifest, write_blobs: Callable[[], dict[str, tuple[int, int]]],
    *, created_at: datetime | None = None, replace_row: bool = False,
) -> tuple[IndexEntry, str]:
    """The writer's side of the gc protocol: lease the digests, make the blobs durable
    (``write_blobs`` -> digest: (size, stored size)), then commit the row and release
    the lease in one transaction; start over if gc took an expired lease meanwhile."""
    from aot.cache.index.leases import LeaseLostError
    from aot.cache.pauses import reached  # writers only: serving never imports it
    from aot.platforms.cuda import replaces_defaults

    existing = cache.lookup(manifest.key)
    broken = False
    # A GPU entry compiled again once its autotune results were captured replaces the row
    # compiled with XLA's defaults, a refreshed export (replace_row) the stored row (old blobs: gc's).
    replacing = existing is not None and existing.ok and (replace_row or replaces_defaults(existing.manifest, manifest.autotune))
    if existing is not None and existing.ok and not replacing:
        if stored_intact(cache, existing):
            # Stored and intact. XLA's executables are not byte-identical from one
            # compile to the next, so writing this one would only leave an orphan
            # blob behind (and `aot verify` reports orphans).
            add_manifest_blob(cache, existing)
            return existing, "present"
        broken = True
    entry = entry_of(manifest)
    digests = {ref.digest for ref in manifest.blobs.values()} | referenced_digests(entry)
    label = f"{manifest.name!r} ({manifest.key[:12]})"
    for attempt in range(1, LEASE_ATTEMPTS + 1):
        reached("put.start")
        try:
            lease = cache.index.lease(digests)
        except CacheError as exc:
            raise type(exc)(f"storing {label}: {exc}") from exc
        try:
            reached("put.leased")
            sizes = write_blobs()
            raw_size = sum(size for size, _ in sizes.values())  # the artifact's, as its manifest says
            sizes.update(store_manifest(cache, entry))  # last: the artifact's blobs first
            reached("put.blobs_ready")
            final = replace(entry, raw_size=raw_size, stored_size=sum(stored for _, stored in sizes.values()))
            added = cache.index.add(final, blob_sizes=sizes, lease=lease, stamp=True, replace=broken or replacing,
                                    created_at=created_at)
        except LeaseLostError as exc:
            log.warning("%s (attempt %d of %d)", exc, attempt, LEASE_ATTEMPTS)
            continue
        except BaseException as exc:
            cache.index.release(lease)
            if isinstance(exc, CacheError):  # full disk, permissions: say which entry
                raise type(exc)(f"storing {label}: {exc}") from exc
            raise
        reached("put.committed")
        # A manifest blob no row may reference now: ours when another writer committed the
        replaced = existing if added else final  # key first, else the replaced row's
        stale = {d for d in (replaced.manifest_digest if replaced else None,) if d and (d != final.manifest_digest or not added)}
        if stale:
            log.debug("dropped unreferenced blobs %s", cache.index.drop_unreferenced(stale, cache.blobs.delete))
        log.info(
            "%s %s (%s) key %s", "stored" if added else "already had", manifest.name,
            manifest.signature, manifest.key[:12],
        )
        outcome = "repaired" if broken else ("stored" if added else "present")
        return cache.lookup(entry.key) or final, outcome
    raise CacheError(
        f"storing {label}: its blob leases expired {LEASE_ATTEMPTS} times before the "
        "row could be committed (each lease lasts an hour on the database clock); is the "
        "blob store very slow, or this process being suspended?"
    )


def unstored_entry(artifact: Artifact) -> IndexEntry:
    """The entry of an artifact compiled into a read-only cache (not stored)."""
    manifest = artifact.manifest
    return replace(
        entry_of(manifest), hlo_digest=None, raw_size=manifest.raw_size, stored_size=0,
    )


def store_manifest(cache: ArtifactStore, entry: IndexEntry) -> dict[str, tuple[int, int]]:
    """The exact manifest text of ``entry``'s row (its signature covers it) stored as a
    blob, which ``aot repair`` rebuilds a lost row from: {digest: (size, stored size)}."""
    stored = cache.blobs.store_bytes(entry.manifest.encode())
    if stored.digest != entry.manifest_digest:  # entry_of hashed the same text: a bug if not
        raise CorruptArtifactError(
            f"{entry.name} ({entry.key[:12]}): the manifest blob's digest {stored.digest[:12]} is not "
            f"the row's {str(entry.manifest_digest)[:12]}"
        )
    return {stored.digest: (stored.size, stored.stored_size)}


def add_manifest_blob(cache: ArtifactStore, entry: IndexEntry) -> None:
    """The manifest blob of a row written before schema 10 (its digest backfilled, its
    blob never written), stored now: the row already references it, so gc keeps it."""
    if entry.manifest_digest is None or cache.blobs.read_only or cache.blobs.has(entry.manifest_digest):
        return
    store_manifest(cache, entry)
    log.info("stored the manifest blob of %s (%s), written before schema 10", entry.name, entry.key[:12])


def entry_of(manifest: Manifest) -> IndexEntry:
    """The index row of ``manifest``, sizes not known yet."""
    text = manifest.to_json()
    return IndexEntry(
        key=manifest.key,
        name=manifest.name,
        program_fp=manifest.program.digest,
        env_fp=manifest.environment.digest,
        signature=manifest.signature,
        platform=manifest.environment.as_dict().get("platform", "?"),
        manifest=text,
        exe_digest=digest_of(manifest, EXECUTABLE),  # None: a symbolic entry
        hlo_digest=digest_of(manifest, PORTABLE_HLO),
        const_digest=digest_of(manifest, CONSTANTS),
        raw_size=0,
        stored_size=0,
        compile_seconds=manifest.compile_seconds,
        manifest_digest=hashlib.sha256(text.encode()).hexdigest(),
    )


def stored_intact(cache: ArtifactStore, entry: IndexEntry) -> bool:
    """Whether every blob of ``entry``'s row is stored in ``cache`` and intact: each
    read and verified against its digest (a single entry's copy or store, and the
    check that a copy has nothing to do: :mod:`aot.cache.admin.up_to_date`)."""
    return all(cache.blobs.check(d) is None for d in entry_digests(entry))


def digest_of(manifest: Manifest, role: str) -> str | None:
    ref = manifest.blobs.get(role)
    return ref.digest if ref is not None else None
