"""The Cache facade: an SQL index plus a blob store, holding artifacts by key."""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aot.artifact import EXECUTABLE, PORTABLE_HLO, Artifact, Manifest
from aot.build import build_artifact, build_symbolic_artifact
from aot.rehydrate import load_executable
from aot.errors import (
    ArtifactNotFoundError,
    CacheError,
    CorruptArtifactError,
    IncompatibleEnvironmentError,
    ReadOnlyCacheError,
)
from aot.executable import MeshExecutable
from aot.fingerprint import environment_fingerprint
from aot.signing import key_from, sign, verify
from aot.cache.storage.content import ContentStore
from aot.cache.index.entry import INDEX_FILE, IndexEntry
from aot.cache.storage.objectstore import DATABASE, FOLDER, OBJECT, classify_location, open_object_store

if TYPE_CHECKING:
    from aot.computation import MeshComputation
    from aot.cache.serving.background import BackgroundLoad
    from aot.cache.compile_result import CompileResult
    from aot.cache.index.sql import Index
    from aot.cache.index.reader import SqliteReader

log = logging.getLogger(__name__)

CACHE_ENV = "AOT_CACHE"

CacheEntry = IndexEntry


def __getattr__(name: str) -> Any:
    if name == "CompileResult":  # defined in aot.cache.compile_result: serving never compiles
        from aot.cache.compile_result import CompileResult

        return CompileResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default_location() -> str:
    """``$AOT_CACHE``, else the user's cache folder (e.g. ``~/.cache/jax-aot``)."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    import platformdirs  # not needed by a process that names its cache

    return platformdirs.user_cache_dir("jax-aot", appauthor=False)


def is_url(location: str) -> bool:
    """Whether ``location`` is a URL (a database, or file://), not a plain folder path.

    Recognised by scheme (:func:`aot.cache.storage.objectstore.classify_location`); an
    unknown scheme raises :class:`CacheError`.
    """
    return classify_location(location).scheme is not None


#: How many times a writer starts over when gc took its expired lease.
_LEASE_ATTEMPTS = 3


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
    if is_url(location):
        return
    folder = Path(location).expanduser()
    index_file = folder / INDEX_FILE
    if index_file.is_file() and index_file.stat().st_size > 0:
        return
    raise CacheError(_lost_index_message(folder) or f"no cache at {folder} ({why}); {advice}")


class Cache:
    """A fingerprint-keyed artifact cache.

    ``location``: ``None`` -> ``$AOT_CACHE`` or the user cache folder; a folder (or
    ``file://`` URL) -> SQLite index and zstd blobs there; a SQLAlchemy URL
    (``postgresql+psycopg://...``, told by its dialect) -> a shared index, with blobs
    in the same database unless ``blob_location`` names another store: a folder,
    ``file://``, ``s3://``, ``gs://``, ``az://`` (:func:`~aot.cache.storage.objectstore.open_object_store`).
    ``cache.blobs`` is the :class:`~aot.cache.storage.content.ContentStore` over it.

    ``local="/var/cache/aot"``: a local read-through tier for serving replicas (a
    folder cache this process writes): rows and blobs are read from it when present,
    otherwise fetched from ``location``, verified, and kept there; the replica keeps
    serving from it when the remote is unreachable. The object is then a
    :class:`~aot.cache.tiered.TieredCache` (see :mod:`aot.cache.tiered`).

    ``cache.stats`` records serving statistics (:mod:`aot.cache.serving.stats`).
    """

    _background: weakref.WeakSet[BackgroundLoad[Any]] | None = None

    def __new__(cls, *args: Any, local: str | os.PathLike[str] | None = None, **kwargs: Any) -> Cache:
        if local is not None and cls is Cache:
            from aot.cache.tiered import TieredCache

            return super().__new__(TieredCache)
        return super().__new__(cls)

    def __init__(
        self,
        location: str | os.PathLike[str] | None = None,
        *,
        signing_key: str | bytes | None = None,
        read_only: bool = False,
        blob_location: str | os.PathLike[str] | None = None,
        require_signatures: bool = False,
        local: str | os.PathLike[str] | None = None,  # taken by __new__: a TieredCache
    ) -> None:
        location = str(location) if location is not None else default_location()
        self.location = location
        self.read_only = read_only
        self.signing_key = key_from(signing_key)
        self.require_signatures = require_signatures
        self.blob_location = str(blob_location) if blob_location is not None else None
        self._index: Index | None = None
        self._index_elsewhere = False  # _index is an IndexProcess (adopt_index)
        self._index_file: Path | None = None
        self._reader: SqliteReader | None = None
        where = classify_location(location)
        if where.kind == OBJECT:
            raise CacheError(
                f"{where.scheme}:// cannot hold a cache index: give a folder or a database URL "
                f"as the cache, and the object store as its blob location, e.g. "
                f"Cache('postgresql+psycopg://host/db', blob_location={location!r}) "
                f"(aot --cache URL --blobs {location})"
            )
        if where.kind == DATABASE:
            from aot.cache.index.sql import Index

            self._index = Index(location, read_only=read_only)
            if self.blob_location is None or _same_database(self.blob_location, location):
                from aot.cache.storage.database import SqlObjectStore

                store = SqlObjectStore(self._index.engine, read_only=read_only)
            else:
                store = self._open_blobs(self.blob_location)
        else:
            folder = Path(where.target)
            self._index_file = folder / INDEX_FILE
            if not read_only:
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise CacheError(f"cannot create the cache folder {folder}: {exc}") from exc
            elif not self._index_file.is_file() or self._index_file.stat().st_size == 0:
                raise CacheError(
                    _lost_index_message(folder)
                    or f"no cache at {folder} (opened read-only, so nothing was created); "
                    "check the path or AOT_CACHE"
                )
            if not self._index_file.exists():
                self.index  # noqa: B018 - creates the schema of a new cache now
            store = self._open_blobs(self.blob_location or str(folder / "blobs"))
        self.blobs = ContentStore(store)
        self._environment: dict[tuple[bool, str], Any] = {}
        self._start_stats()

    def _start_stats(self) -> None:
        """``self.stats``, flushed by :meth:`close` or when this object is collected."""
        from aot.cache.serving.stats import recorder_for

        self.stats = recorder_for(self)
        self._stats_finalizer = weakref.finalize(self, self.stats.close)

    def _open_blobs(self, location: str) -> Any:
        engine = self._index.engine if self._index is not None and _same_database(location, self.location) else None
        try:
            return open_object_store(location, read_only=self.read_only, engine=engine)
        except CacheError:
            if self._index is not None:
                self._index.close()
            raise

    def __repr__(self) -> str:
        return f"Cache({self.display_location!r}, read_only={self.read_only})"

    @property
    def index(self) -> Index:
        """The SQL index (SQLAlchemy), opened on first use."""
        if self._index is None:
            from aot.cache.index.sql import Index

            assert self._index_file is not None
            self._index = Index.for_folder(self._index_file.parent, read_only=self.read_only)
        return self._index

    def adopt_index(self, index: Any) -> None:
        """Uses ``index`` as this folder cache's SQL index: an
        :class:`~aot.cache.index.process.IndexProcess` with the same index open in a
        helper process (``aot warmup`` starts one before it imports JAX, so that this
        process never imports SQLAlchemy). :meth:`close` closes it."""
        if self._index is not None or self._index_file is None or self.read_only:
            raise ValueError(
                f"{self!r} cannot adopt an index: its own is open, or it is not a writable folder cache"
            )
        self._index = index
        self._index_elsewhere = True  # reads stay here, through the stdlib reader

    def _serving_reader(self) -> SqliteReader | None:
        """The stdlib reader of a folder cache, while SQLAlchemy is not loaded here."""
        if (self._index is not None and not self._index_elsewhere) or self._index_file is None:
            return None
        if self._reader is None:
            from aot.cache.index.reader import SqliteReader

            try:
                self._reader = SqliteReader(self._index_file, read_only=self.read_only)
            except CacheError as exc:
                log.debug("serving reader unavailable (%s); using the SQL index", exc)
                return None
        return self._reader

    def entries_named(self, name: str, *, state: str | None = "ok") -> list[IndexEntry]:
        """Every entry stored under ``name`` (all environments)."""
        reader = self._serving_reader()
        if reader is not None:
            return reader.by_name(name, state=state)
        return self.index.by_name(name, state=state)

    def lookup(self, key: str) -> IndexEntry | None:
        """The row of ``key`` (None: not stored); through the standard library's sqlite3
        while SQLAlchemy is not loaded here (a fully cached warm-up never loads it, nor
        does one whose index is in a helper process: :meth:`adopt_index`)."""
        reader = self._serving_reader()
        if reader is not None:
            return reader.by_key(key)
        return self.index.get(key)

    def touch(self, key: str) -> None:
        """Records a use of ``key`` (last-used time for gc, hit count)."""
        if self.read_only:
            return
        reader = self._serving_reader()
        if reader is not None:
            reader.touch(key)
        else:
            self.index.touch(key)

    @property
    def display_location(self) -> str:
        """``location`` for messages and logs: a database URL's password is masked."""
        if classify_location(self.location).kind == FOLDER:
            return self.location
        from aot.cache.index.sql import mask_url

        return mask_url(self.location)

    def hold_background(self, work: BackgroundLoad[Any]) -> None:
        """Background loading over this cache: :meth:`close` stops it first."""
        if self._background is None:
            self._background = weakref.WeakSet()
        self._background.add(work)

    def close(self) -> None:
        # Loads still running read through this cache: cancel the rest, wait for them.
        for work in list(self._background or ()):
            work.stop()
        self._stats_finalizer()  # the last statistics, while the index is open
        if self._reader is not None:
            self._reader.close()
        self.blobs.close()
        if self._index is not None:
            self._index.close()

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def environment(self):  # type: ignore[no-untyped-def]
        """This process's environment fingerprint, in the current x64 mode (an entry
        compiled under ``jax.enable_x64(True)`` is checked against an x64 environment),
        recomputed when ``XLA_FLAGS`` changes in this process (both are parts)."""
        import jax

        current = (bool(jax.config.jax_enable_x64), os.environ.get("XLA_FLAGS", ""))
        if current not in self._environment:
            self._environment[current] = environment_fingerprint()
        return self._environment[current]

    # ------------------------------------------------------------------ writing

    def _check_writable(self, what: str) -> None:
        if self.read_only:
            raise ReadOnlyCacheError(
                f"cannot {what}: the cache at {self.display_location} is read-only; open it "
                "without read_only=True (or compile in CI and ship a bundle)"
            )

    def put(self, item: MeshComputation | MeshExecutable | Artifact) -> IndexEntry:
        """Stores a computation (compiling it), an executable or an artifact."""
        self._check_writable("store an artifact")
        from aot.computation import MeshComputation  # serving never stores one

        if isinstance(item, MeshComputation) and item.symbolic:
            artifact = build_symbolic_artifact(item)
        elif isinstance(item, MeshComputation):
            executable = item.compile()
            artifact = build_artifact(executable, item.portable_hlo(executable))
        elif isinstance(item, MeshExecutable):
            computation = getattr(item, "computation", None)
            hlo = computation.portable_hlo(item) if computation is not None else None
            artifact = build_artifact(item, hlo)
        elif isinstance(item, Artifact):
            artifact = item
        else:
            raise TypeError(
                f"Cache.put takes a MeshComputation, MeshExecutable or Artifact, got "
                f"{type(item).__name__}"
            )
        return self.put_artifact(artifact)

    def put_artifact(self, artifact: Artifact) -> IndexEntry:
        """Stores an artifact: blobs first (durable), the index row last.

        Safe against a concurrent gc (the protocol is in docs/reliability.md): the
        blobs are leased in the index before they are checked or written, and the
        lease is released in the transaction that commits the row.
        """
        return self.store_artifact(artifact)[0]

    def store_artifact(self, artifact: Artifact) -> tuple[IndexEntry, str]:
        """:meth:`put_artifact`, and what it did: ``"stored"``, ``"present"`` (stored
        and intact already: nothing written) or ``"repaired"`` (the stored row's blobs
        were missing or corrupt; blobs written again and the row replaced)."""
        data: dict[str, bytes] = {}

        def write_blobs() -> dict[str, tuple[int, int]]:
            if not data:
                data.update((ref.digest, artifact.blob(role)) for role, ref in manifest.blobs.items())  # verified
            sizes = {}
            for digest, blob in data.items():
                stored = self.blobs.store_bytes(blob)
                sizes[digest] = (stored.size, stored.stored_size)
            return sizes

        manifest = self._manifest_to_store(artifact.manifest)
        return self._commit(manifest, write_blobs)

    def _manifest_to_store(self, manifest: Manifest) -> Manifest:
        """``manifest`` checked (name rule) and signed with this cache's key."""
        from aot.cache.names import check_name

        self._check_writable("store an artifact")
        check_name(manifest.name)  # before any blob is written
        if self.signing_key is not None:
            if manifest.hmac is None:
                return sign(manifest, self.signing_key)
            verify(manifest, self.signing_key)  # signed elsewhere: only if this cache could load it
        return manifest

    def _commit(
        self, manifest: Manifest, write_blobs: Callable[[], dict[str, tuple[int, int]]],
    ) -> tuple[IndexEntry, str]:
        """The writer's side of the gc protocol (docs/reliability.md): lease the digests,
        make the blobs durable (``write_blobs`` -> digest: (size, stored size)), then
        commit the row and release the lease in one transaction; start over if gc took
        an expired lease meanwhile."""
        from aot.cache.index.leases import LeaseLostError
        from aot.cache.pauses import reached  # writers only: serving never imports it

        existing = self.lookup(manifest.key)
        broken = False
        if existing is not None and existing.ok:
            if all(self.blobs.check(d) is None for d in _entry_digests(existing)):
                # Stored and intact. XLA's executables are not byte-identical from one
                # compile to the next, so writing this one would only leave an orphan
                # blob behind (and `aot verify` reports orphans).
                return existing, "present"
            broken = True
        entry = IndexEntry(
            key=manifest.key,
            name=manifest.name,
            program_fp=manifest.program.digest,
            env_fp=manifest.environment.digest,
            signature=manifest.signature,
            platform=manifest.environment.as_dict().get("platform", "?"),
            manifest=manifest.to_json(),
            exe_digest=_digest_of(manifest, EXECUTABLE),  # None: a symbolic entry
            hlo_digest=_digest_of(manifest, PORTABLE_HLO),
            raw_size=0,
            stored_size=0,
            compile_seconds=manifest.compile_seconds,
        )
        digests = {ref.digest for ref in manifest.blobs.values()}
        label = f"{manifest.name!r} ({manifest.key[:12]})"
        for attempt in range(1, _LEASE_ATTEMPTS + 1):
            reached("put.start")
            try:
                lease = self.index.lease(digests)
            except CacheError as exc:
                raise type(exc)(f"storing {label}: {exc}") from exc
            try:
                reached("put.leased")
                sizes = write_blobs()
                reached("put.blobs_ready")
                final = replace(
                    entry,
                    raw_size=sum(size for size, _ in sizes.values()),
                    stored_size=sum(stored for _, stored in sizes.values()),
                )
                added = self.index.add(final, blob_sizes=sizes, lease=lease, stamp=True, replace=broken)
            except LeaseLostError as exc:
                log.warning("%s (attempt %d of %d)", exc, attempt, _LEASE_ATTEMPTS)
                continue
            except BaseException as exc:
                self.index.release(lease)
                if isinstance(exc, CacheError):  # full disk, permissions: say which entry
                    raise type(exc)(f"storing {label}: {exc}") from exc
                raise
            reached("put.committed")
            log.info(
                "%s %s (%s) key %s", "stored" if added else "already had", manifest.name,
                manifest.signature, manifest.key[:12],
            )
            outcome = "repaired" if broken else ("stored" if added else "present")
            return self.lookup(entry.key) or final, outcome
        raise CacheError(
            f"storing {label}: its blob leases expired {_LEASE_ATTEMPTS} times before the "
            "row could be committed (each lease lasts an hour on the database clock); is the "
            "blob store very slow, or this process being suspended?"
        )

    def copy_entry_from(self, source: Cache, entry: IndexEntry) -> tuple[IndexEntry, str]:
        """Stores ``source``'s entry here: its blobs copied as stored (no recompression,
        each verified), under the same gc protocol as :meth:`put_artifact`. Returns the
        stored entry and ``"stored"`` / ``"present"`` / ``"repaired"``."""
        try:
            manifest = Manifest.from_json(entry.manifest)
        except CorruptArtifactError as exc:
            raise CorruptArtifactError(f"{entry.name} ({entry.key[:12]}): {exc}") from None
        verify(manifest, source.signing_key, require=source.require_signatures)
        manifest = self._manifest_to_store(manifest)
        raw = {ref.digest: ref.size for ref in manifest.blobs.values()}

        def copy_blobs() -> dict[str, tuple[int, int]]:
            report = source.blobs.copy_to(self.blobs, raw)
            return {d: (raw[d], report.stored_sizes[d]) for d in raw}

        return self._commit(manifest, copy_blobs)

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

    def artifact(self, entry: IndexEntry | str, *, roles: Iterable[str] | None = None) -> Artifact:
        """The manifest and its verified blobs; raises CorruptArtifactError, IntegrityError.

        ``roles`` (e.g. ``("portable_hlo",)``) reads only those blobs, so a corrupt or
        missing executable does not stop a recompilation from the portable HLO.
        """
        if isinstance(entry, str):
            entry = self.entry(entry)
        label = f"{entry.name} ({entry.key[:12]})"
        try:
            manifest = Manifest.from_json(entry.manifest)
        except CorruptArtifactError as exc:
            raise CorruptArtifactError(f"{label}: {exc}; run `aot verify` and recompile it") from None
        except IncompatibleEnvironmentError as exc:  # another format version: say which entry
            raise IncompatibleEnvironmentError(f"{label}: {exc}", exc.differences) from None
        if manifest.key != entry.key:
            raise CorruptArtifactError(
                f"{label}: the index row's manifest is for key {manifest.key[:12]}; "
                "run `aot verify` and recompile it"
            )
        verify(manifest, self.signing_key, require=self.require_signatures)
        wanted = set(roles) if roles is not None else None
        blobs: dict[str, bytes] = {}
        for role, ref in manifest.blobs.items():
            if wanted is not None and role not in wanted:
                continue
            try:
                data = self.blobs.get(ref.digest)  # the store verifies the digest
            except CorruptArtifactError as exc:
                raise CorruptArtifactError(f"{label}: {role} {exc}") from None
            if data is not None:
                blobs[ref.digest] = data
        # The store hashed each blob it returned: Artifact.blob need not hash them again.
        return Artifact(manifest, blobs, verified=dict(blobs))

    def load(self, entry: IndexEntry | str) -> MeshExecutable:
        """Rehydrates the executable of one entry (no recompilation).

        Not a use of the entry by itself: :meth:`get` and a :meth:`compile` hit record
        one (last-used time, hits), an ``aot.load`` dispatcher records its calls
        (:mod:`aot.cache.serving.stats`), so that an entry loaded at start-up and never called
        ages (``aot gc --older-than``)."""
        if isinstance(entry, str):
            entry = self.entry(entry)
        start = time.perf_counter()
        # Only the executable: a damaged portable HLO must not block an intact one.
        artifact = self.artifact(entry, roles=(EXECUTABLE,))
        executable = load_executable(artifact, current=self.environment)
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
        log.warning("quarantined %s (%s): %s", entry.name, entry.key[:12], reason)
        return True

    def reread(self, entry: IndexEntry) -> IndexEntry | None:
        """The row of ``entry.key`` as it is now (None: deleted)."""
        reader = self._serving_reader()
        if reader is not None:
            return reader.by_key(entry.key)
        return self.index.get(entry.key)

    def names(self) -> list[str]:
        """Every name stored (all environments and states)."""
        reader = self._serving_reader()
        if reader is not None:
            return reader.names()
        return self.index.names()

    def compile_entry(
        self, fn: Callable[..., Any], *args: Any, name: str | None = None, pmap: bool = False,
        **lower_kwargs: Any,
    ) -> CompileResult:
        """Lowers ``fn``; on a hit loads the stored executable, on a miss compiles and stores."""
        from aot.cache.compile_result import CompileResult
        from aot.lowering import lower, lower_pmap  # serving never lowers

        start = time.perf_counter()
        computation = (lower_pmap if pmap else lower)(fn, *args, name=name, **lower_kwargs)
        if computation.symbolic:
            return self._store_symbolic(computation, start)
        if not self.read_only:
            from aot.cache.names import check_name

            check_name(computation.name)  # before an XLA compile that could not be stored
        key = computation.fingerprint
        entry = self.index.get(key)
        if entry is not None and entry.ok:
            try:
                executable = self.load(entry)
                self.touch(entry.key)
                return CompileResult(executable, entry, True, time.perf_counter() - start)
            except (CorruptArtifactError, IncompatibleEnvironmentError) as exc:
                self.quarantine(entry, str(exc))
        executable = computation.compile()
        if self.read_only:
            log.info("read-only cache: compiled %s without storing it", computation.name)
            artifact = build_artifact(executable, None)
            stored = _unstored_entry(artifact)
        else:
            artifact = build_artifact(executable, computation.portable_hlo(executable))
            stored = self.put_artifact(artifact)
        return CompileResult(executable, stored, False, time.perf_counter() - start)

    def compile(
        self, fn: Callable[..., Any], *args: Any, name: str | None = None, pmap: bool = False,
        **lower_kwargs: Any,
    ) -> Any:
        """Lower ``fn``; on a hit load the stored executable, on a miss compile and store.

        With symbolic specs (``"f32[b,784]"``) the shape-polymorphic program is stored
        and the result is ``aot.load(name)``'s dispatcher (lazy), which compiles it for
        each concrete shape it is called with.
        """
        result = self.compile_entry(fn, *args, name=name, pmap=pmap, **lower_kwargs)
        if result.executable is None:
            from aot.cache.serving.loader import Dispatcher

            return Dispatcher(self, result.entry.name)
        return result.executable

    def _store_symbolic(self, computation: MeshComputation, start: float) -> CompileResult:
        """Stores a symbolic computation's portable HLO (nothing to compile yet)."""
        from aot.cache.compile_result import CompileResult

        entry = self.index.get(computation.fingerprint)
        if entry is not None and entry.ok:
            return CompileResult(None, entry, True, time.perf_counter() - start)
        if self.read_only:
            raise ReadOnlyCacheError(
                f"cannot store the symbolic program {computation.name} "
                f"({computation.signature}): the cache at {self.display_location} is "
                "read-only, and a symbolic program has no executable to return without "
                "storing it; open the cache writable or lower with concrete specs"
            )
        stored = self.put_artifact(build_symbolic_artifact(computation))
        return CompileResult(None, stored, False, time.perf_counter() - start)

    def entries(self, name: str | None = None) -> list[IndexEntry]:
        """Stored entries, all or those whose name matches a glob."""
        return self.index.entries(name)

    # ------------------------------------------------------------------ maintenance

    def verify(self, *, quarantine: bool = True) -> Any:
        from aot.cache.admin.maintenance import verify_cache

        return verify_cache(self, quarantine=quarantine)

    def gc(
        self, max_size: int | str | None = None, older_than: Any = None, *, dry_run: bool = False,
        superseded: bool = False, force: bool = False,
    ) -> Any:
        """Plan-then-execute garbage collection; ``force`` deletes blobs even when the
        index is empty (it refuses otherwise: a lost index is not an empty cache)."""
        from aot.cache.admin.maintenance import collect_garbage

        return collect_garbage(
            self, max_size=max_size, older_than=older_than, dry_run=dry_run,
            superseded=superseded, force=force,
        )

    def export_bundle(self, path: str | os.PathLike[str], names: str | Iterable[str] | None = None) -> Any:
        """Every intact entry whose name matches one of the globs ``names`` (all if None)."""
        from aot.cache.admin.bundle import export_bundle

        if isinstance(names, str):  # one glob, not its characters
            names = [names]
        return export_bundle(self, Path(path), list(names) if names else None)

    def import_bundle(self, path: str | os.PathLike[str]) -> Any:
        from aot.cache.admin.bundle import import_bundle

        return import_bundle(self, Path(path))

    def explain(self, name: str, *args: Any, fn: Callable[..., Any] | None = None, **lower_kwargs: Any) -> Any:
        from aot.cache.reports.explain import explain

        return explain(self, name, *args, fn=fn, **lower_kwargs)


def _entry_digests(entry: IndexEntry) -> list[str]:
    return [d for d in (entry.exe_digest, entry.hlo_digest) if d]


def _same_database(a: str, b: str) -> bool:
    """Whether two locations are the same database URL (then one engine serves both)."""
    if classify_location(a).kind != DATABASE or classify_location(b).kind != DATABASE:
        return False
    from sqlalchemy.engine import make_url

    return make_url(a) == make_url(b)


def _unstored_entry(artifact: Artifact) -> IndexEntry:
    manifest = artifact.manifest
    size = manifest.raw_size
    return IndexEntry(
        key=manifest.key, name=manifest.name, program_fp=manifest.program.digest,
        env_fp=manifest.environment.digest, signature=manifest.signature,
        platform=manifest.environment.as_dict().get("platform", "?"),
        manifest=manifest.to_json(), exe_digest=_digest_of(manifest, EXECUTABLE),
        hlo_digest=None, raw_size=size, stored_size=0,
        compile_seconds=manifest.compile_seconds,
    )


def _digest_of(manifest: Manifest, role: str) -> str | None:
    ref = manifest.blobs.get(role)
    return ref.digest if ref is not None else None
