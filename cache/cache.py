"""The Cache facade: an SQL index plus a blob store, holding artifacts by key."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs

from aot.artifact import EXECUTABLE, PORTABLE_HLO, Artifact, Manifest
from aot.rehydrate import build_artifact, load_executable
from aot.computation import MeshComputation
from aot.errors import (
    ArtifactNotFoundError,
    CacheError,
    CorruptArtifactError,
    IncompatibleEnvironmentError,
    ReadOnlyCacheError,
)
from aot.executable import MeshExecutable
from aot.fingerprint import environment_fingerprint
from aot.lowering import lower, lower_pmap
from aot.signing import key_from, sign, verify
from aot.cache.blobs import BlobStore, FolderBlobStore
from aot.cache.entry import IndexEntry

if TYPE_CHECKING:
    from aot.cache.index import Index
    from aot.cache.sqlite_reader import SqliteReader

log = logging.getLogger(__name__)

CACHE_ENV = "AOT_CACHE"

CacheEntry = IndexEntry


def default_location() -> str:
    """``$AOT_CACHE``, else the user's cache folder (e.g. ``~/.cache/jax-aot``)."""
    return os.environ.get(CACHE_ENV) or platformdirs.user_cache_dir("jax-aot", appauthor=False)


def is_url(location: str) -> bool:
    return "://" in location


@dataclass(frozen=True, slots=True)
class CompileResult:
    """What :meth:`Cache.compile_entry` did: the executable, its entry, hit or miss."""

    executable: MeshExecutable
    entry: IndexEntry
    hit: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.entry.key,
            "name": self.entry.name,
            "signature": self.entry.signature,
            "hit": self.hit,
            "seconds": round(self.seconds, 4),
            "compile_seconds": self.entry.compile_seconds,
            "raw_size": self.entry.raw_size,
            "stored_size": self.entry.stored_size,
        }


class Cache:
    """A fingerprint-keyed artifact cache.

    ``location``: ``None`` -> ``$AOT_CACHE`` or the user cache folder; a folder ->
    SQLite index and zstd blobs there; a SQLAlchemy URL (``postgresql+psycopg://...``)
    -> a shared index, with blobs in the same database unless ``blob_location`` names
    a folder.
    """

    def __init__(
        self,
        location: str | os.PathLike[str] | None = None,
        *,
        signing_key: str | bytes | None = None,
        read_only: bool = False,
        blob_location: str | os.PathLike[str] | None = None,
        require_signatures: bool = False,
    ) -> None:
        location = str(location) if location is not None else default_location()
        self.location = location
        self.read_only = read_only
        self.signing_key = key_from(signing_key)
        self.require_signatures = require_signatures
        self._index: Index | None = None
        self._index_file: Path | None = None
        self._reader: SqliteReader | None = None
        if is_url(location):
            from aot.cache.index import Index

            self._index = Index(location, read_only=read_only)
            if blob_location is not None:
                self.blobs: BlobStore = FolderBlobStore(Path(blob_location), read_only=read_only)
            else:
                from aot.cache.dbblobs import DatabaseBlobStore

                self.blobs = DatabaseBlobStore(self._index.engine, read_only=read_only)
        else:
            folder = Path(location).expanduser()
            if not read_only:
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise CacheError(f"cannot create the cache folder {folder}: {exc}") from exc
            elif not (folder / "index.sqlite").exists():
                raise CacheError(
                    f"no cache at {folder} (opened read-only, so nothing was created); "
                    "check the path or AOT_CACHE"
                )
            self._index_file = folder / "index.sqlite"
            if not self._index_file.exists():
                self.index  # noqa: B018 - creates the schema of a new cache now
            blob_root = Path(blob_location) if blob_location is not None else folder / "blobs"
            self.blobs = FolderBlobStore(blob_root, read_only=read_only)
        self._environment = None
        self._environment_of: tuple[bool, str] | None = None

    def __repr__(self) -> str:
        return f"Cache({self.display_location!r}, read_only={self.read_only})"

    @property
    def index(self) -> Index:
        """The SQL index (SQLAlchemy), opened on first use."""
        if self._index is None:
            from aot.cache.index import Index

            assert self._index_file is not None
            self._index = Index.for_folder(self._index_file.parent, read_only=self.read_only)
        return self._index

    def _serving_reader(self) -> SqliteReader | None:
        """The stdlib reader of a folder cache, while SQLAlchemy is not loaded yet."""
        if self._index is not None or self._index_file is None:
            return None
        if self._reader is None:
            from aot.cache.sqlite_reader import SqliteReader

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
        if not is_url(self.location):
            return self.location
        from aot.cache.index import mask_url

        return mask_url(self.location)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._index is not None:
            self._index.close()

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def environment(self):  # type: ignore[no-untyped-def]
        # Recomputed when x64 or XLA_FLAGS change in this process (both are parts).
        import jax

        current = (bool(jax.config.jax_enable_x64), os.environ.get("XLA_FLAGS", ""))
        if self._environment is None or self._environment_of != current:
            self._environment = environment_fingerprint()
            self._environment_of = current
        return self._environment

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
        if isinstance(item, MeshComputation):
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
        """Blobs first (durable), index row last, in one transaction."""
        self._check_writable("store an artifact")
        manifest = artifact.manifest
        if self.signing_key is not None:
            if manifest.hmac is None:
                manifest = sign(manifest, self.signing_key)
            else:  # signed elsewhere: store it only if this cache could load it
                verify(manifest, self.signing_key)
        existing = self.index.get(manifest.key)
        if existing is not None and existing.ok and all(
            self.blobs.check(d) is None for d in (existing.exe_digest, existing.hlo_digest) if d
        ):
            # Stored and intact. XLA's executables are not byte-identical from one compile
            # to the next, so writing this one would only leave an orphan blob behind
            # (and `aot verify` reports orphans).
            return existing
        sizes: dict[str, tuple[int, int]] = {}
        for role, ref in manifest.blobs.items():
            data = artifact.blob(role)  # verifies the digest
            try:
                digest = self.blobs.put(data)
            except CacheError as exc:  # full disk, permissions: say which entry
                raise type(exc)(f"storing {manifest.name!r} ({manifest.key[:12]}): {exc}") from exc
            stored = self.blobs.stored_size(digest) or len(data)
            sizes[digest] = (len(data), stored)
        entry = IndexEntry(
            key=manifest.key,
            name=manifest.name,
            program_fp=manifest.program.digest,
            env_fp=manifest.environment.digest,
            signature=manifest.signature,
            platform=manifest.environment.as_dict().get("platform", "?"),
            manifest=manifest.to_json(),
            exe_digest=manifest.blobs[EXECUTABLE].digest,
            hlo_digest=manifest.blobs[PORTABLE_HLO].digest if PORTABLE_HLO in manifest.blobs else None,
            raw_size=sum(size for size, _ in sizes.values()),
            stored_size=sum(stored for _, stored in sizes.values()),
            compile_seconds=manifest.compile_seconds,
        )
        try:
            added = self.index.add(entry, blob_sizes=sizes)
        except CacheError as exc:
            raise type(exc)(f"storing {manifest.name!r} ({manifest.key[:12]}): {exc}") from exc
        log.info(
            "%s %s (%s) key %s", "stored" if added else "already had", manifest.name,
            manifest.signature, manifest.key[:12],
        )
        return self.index.get(entry.key) or entry

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
        return Artifact(manifest, blobs)

    def load(self, entry: IndexEntry | str) -> MeshExecutable:
        """Rehydrates the executable of one entry (no recompilation)."""
        if isinstance(entry, str):
            entry = self.entry(entry)
        # Only the executable: a damaged portable HLO must not block an intact one.
        artifact = self.artifact(entry, roles=(EXECUTABLE,))
        executable = load_executable(artifact, current=self.environment)
        self.touch(entry.key)
        return executable

    def get(self, key: str) -> MeshExecutable:
        """The executable stored under ``key`` (a full key or a unique prefix)."""
        return self.load(self.entry(key))

    def quarantine(self, entry: IndexEntry, reason: str) -> None:
        if self.read_only:
            log.warning("cannot quarantine %s (read-only cache): %s", entry.key[:12], reason)
            return
        self.index.quarantine(entry.key, reason)
        log.warning("quarantined %s (%s): %s", entry.name, entry.key[:12], reason)

    def compile_entry(
        self, fn: Callable[..., Any], *args: Any, name: str | None = None, pmap: bool = False,
        **lower_kwargs: Any,
    ) -> CompileResult:
        """Lowers ``fn``; on a hit loads the stored executable, on a miss compiles and stores."""
        start = time.perf_counter()
        computation = (lower_pmap if pmap else lower)(fn, *args, name=name, **lower_kwargs)
        key = computation.fingerprint
        entry = self.index.get(key)
        if entry is not None and entry.ok:
            try:
                executable = self.load(entry)
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
    ) -> MeshExecutable:
        """Lower ``fn``; on a hit load the stored executable, on a miss compile and store."""
        return self.compile_entry(fn, *args, name=name, pmap=pmap, **lower_kwargs).executable

    def entries(self, name: str | None = None) -> list[IndexEntry]:
        """Stored entries, all or those whose name matches a glob."""
        return self.index.entries(name)

    # ------------------------------------------------------------------ maintenance

    def verify(self, *, quarantine: bool = True) -> Any:
        from aot.cache.maintenance import verify_cache

        return verify_cache(self, quarantine=quarantine)

    def gc(
        self, max_size: int | str | None = None, older_than: Any = None, *, dry_run: bool = False,
    ) -> Any:
        from aot.cache.maintenance import collect_garbage

        return collect_garbage(self, max_size=max_size, older_than=older_than, dry_run=dry_run)

    def export_bundle(self, path: str | os.PathLike[str], names: str | Iterable[str] | None = None) -> Any:
        """Every intact entry whose name matches one of the globs ``names`` (all if None)."""
        from aot.cache.bundle import export_bundle

        if isinstance(names, str):  # one glob, not its characters
            names = [names]
        return export_bundle(self, Path(path), list(names) if names else None)

    def import_bundle(self, path: str | os.PathLike[str]) -> Any:
        from aot.cache.bundle import import_bundle

        return import_bundle(self, Path(path))

    def explain(self, name: str, *args: Any, fn: Callable[..., Any] | None = None, **lower_kwargs: Any) -> Any:
        from aot.cache.explain import explain

        return explain(self, name, *args, fn=fn, **lower_kwargs)


def _unstored_entry(artifact: Artifact) -> IndexEntry:
    manifest = artifact.manifest
    size = manifest.raw_size
    return IndexEntry(
        key=manifest.key, name=manifest.name, program_fp=manifest.program.digest,
        env_fp=manifest.environment.digest, signature=manifest.signature,
        platform=manifest.environment.as_dict().get("platform", "?"),
        manifest=manifest.to_json(), exe_digest=manifest.blobs[EXECUTABLE].digest,
        hlo_digest=None, raw_size=size, stored_size=0,
        compile_seconds=manifest.compile_seconds,
    )
