"""jax-aot as the backend of JAX's persistent compilation cache (``aot.jax_cache``).

One line plugs a jax-aot cache into JAX's persistent cache; from then on every
``jax.jit``/``pmap`` compile of the process goes through it, under JAX's own key::

    import aot
    aot.jax_cache.install("postgresql+psycopg://ci@db/aot", blob_location="s3://bucket/aot",
                          local="/var/cache/aot-jit")

or, for an unchanged script, ``AOT_JAX_CACHE=<location>`` with
``python -m aot.cache.jax_cache script.py ARGS`` (or ``aot.jax_cache.install_from_env()``
at the top of the script). See docs/jax-cache.md.

* Entries are KIND ``jit`` rows of the index (:mod:`aot.cache.index.jit`): JAX's key,
  the jitted function's name, the digest of JAX's zstd payload, stored as it came (no
  second compression) and verified on every read; signed (HMAC) when the cache has a
  signing key. ``local=`` keeps a verified copy of each blob in a folder in front of
  the remote store.
* JAX applies its own settings: ``jax_enable_compilation_cache``,
  ``jax_persistent_cache_min_compile_time_secs`` and
  ``jax_persistent_cache_min_entry_size_bytes`` decide whether ``put`` is called.
* Never raises into a ``jit`` call: a corrupt, unreadable, unsigned or unreachable
  entry is a miss with one warning per key, and the fresh compile's ``put`` repairs it.
* Compile once per fleet (``compile_once``, on by default for a PostgreSQL index):
  a miss claims the key in the index for a short lease (``claim_seconds``, 30 s) that a
  heartbeat thread of the holder renews while it compiles
  (:class:`~aot.cache.index.claim_heartbeat.ClaimHeartbeat`: one per backend, a daemon
  started at the first claim, stopped at uninstall and exit); another process that
  misses it meanwhile waits (polling with backoff, at most ``wait_seconds``) for the
  holder's entry and loads it, and compiles itself when the holder's claim expires (a
  holder killed mid-compile: within the lease) or the bound is reached. A claim is
  given up when its compile returns (JAX's compile event, on the compiling thread), and
  renewed for at most ``wait_seconds``.
* A multi-process job (a pod slice under ``jax.distributed``; ``slice_share``, on by
  default): one process compiles each program for the job and hands the binary to the
  others (JAX's ``jax_share_binary_between_hosts``, bounded by
  ``AOT_SLICE_WAIT_SECONDS``); JAX writes from process 0 only, so only process 0 claims
  keys, and the key is made the same in every process (on CPU JAX's is not), so that
  every process hits in the next run.
* A warm start from the local tier pays nothing for the remote: :func:`install` opens
  neither the index nor the blob store; a key is first looked up in the local tier's
  own rows (:mod:`aot.cache.jax_cache.local_rows`) and served after its blob's digest
  (and its HMAC, under a signing key) was checked. The remote is opened on the first
  local miss; the hits served before are recorded in the index then, or when the
  backend closes (at exit).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aot.cache.index.claim_heartbeat import ClaimHeartbeat
from aot.cache.jax_cache.local_rows import LocalRows
from aot.cache.index.jit_records import MIN_COMPILE_TIME_HINT, JitEntry, function_name, sign_entry, signature_problem
from aot.cache.pauses import reached
from aot.cache.storage.content import ContentStore, digest_of, inflate_frame
from aot.cache.storage.locations import open_object_store
from aot.cache.timeouts import Timeouts
from aot.errors import UsageError
from aot.jaxcompat import distributed as jaxdist
from aot.jaxcompat import persistent_cache as jaxpc
from aot.slices import wait_seconds as slice_wait_seconds

if TYPE_CHECKING:  # imported when a cache is opened: a warm local start never needs it
    from aot.cache.store import ArtifactStore

log = logging.getLogger(__name__)

__all__ = [
    "ENV",
    "ENV_BLOBS",
    "ENV_LOCAL",
    "ENV_COMPILE_ONCE",
    "ENV_CLAIM_SECONDS",
    "ENV_WAIT_SECONDS",
    "JaxCacheBackend",
    "JaxCacheCounts",
    "install",
    "install_from_env",
    "installed",
    "share_between_hosts",
    "uninstall",
]

#: The cache location (folder or database URL) :func:`install_from_env` installs.
ENV = "AOT_JAX_CACHE"
#: Its blob location (``s3://...``), when the index is a database.
ENV_BLOBS = "AOT_JAX_CACHE_BLOBS"
#: A folder for the local tier of blobs.
ENV_LOCAL = "AOT_JAX_CACHE_LOCAL"
#: Compile once per fleet: ``1``/``0`` (default: on for a PostgreSQL index), and its
#: bounds in seconds (:data:`CLAIM_SECONDS`, :data:`WAIT_SECONDS`).
ENV_COMPILE_ONCE = "AOT_JAX_CACHE_COMPILE_ONCE"
ENV_CLAIM_SECONDS = "AOT_JAX_CACHE_CLAIM_SECONDS"
ENV_WAIT_SECONDS = "AOT_JAX_CACHE_WAIT_SECONDS"

#: A compile claim's lease: its holder's heartbeat renews it every third of it while
#: it compiles, so a killed holder's waiters compile themselves at most this long after
#: its last beat; and the longest a waiter waits.
CLAIM_SECONDS = 30.0
WAIT_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class JaxCacheCounts:
    """What this process's backend did (the index keeps the fleet's counts: ``aot stats``)."""

    hits: int
    misses: int
    puts: int
    errors: int
    waits: int

    def to_dict(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "puts": self.puts, "errors": self.errors, "waits": self.waits}


class JaxCacheBackend:
    """JAX's ``get``/``put`` over a jax-aot cache (see the module docstring)."""

    def __init__(
        self, cache: ArtifactStore | None = None, *, local: str | os.PathLike[str] | None = None, owns: bool = False,
        compile_once: bool | None = None, claim_seconds: float = CLAIM_SECONDS, wait_seconds: float = WAIT_SECONDS,
        opener: Callable[[], ArtifactStore] | None = None, location: str | None = None,
        signing_key: bytes | None = None, read_only: bool = False, timeouts: Timeouts | None = None,
    ) -> None:
        """Over ``cache``, or over the cache ``opener`` opens when first needed (then
        ``location``, ``signing_key``, ``read_only`` and ``timeouts`` describe it until
        it is open)."""
        if cache is None and (opener is None or location is None):
            raise TypeError("JaxCacheBackend needs a cache, or an opener and its location")
        self._cache = cache
        self._opener = opener
        self._open_lock = threading.Lock()
        self.location = cache.location if cache is not None else str(location)
        self.signing_key = cache.signing_key if cache is not None else signing_key
        self.read_only = cache.read_only if cache is not None else read_only
        self.timeouts = cache.timeouts if cache is not None else timeouts
        self.owns = owns
        self.local = ContentStore(open_object_store(str(local))) if local is not None else None
        self.rows = LocalRows(local) if local is not None else None
        shared = (cache.index.dialect if cache is not None else _dialect(self.location)) == "postgresql"
        self.compile_once = shared if compile_once is None else compile_once
        self.claim_seconds = claim_seconds
        self.wait_seconds = wait_seconds
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._claimed: dict[str, int] = {}  # key -> the thread compiling it
        self._heartbeat: ClaimHeartbeat | None = None  # renews _claimed; started at the first claim
        self._warned: set[str] = set()
        self._missed_at: dict[str, float] = {}  # key -> when get missed it (compile time)
        self._lock = threading.Lock()
        self._counts = {"hits": 0, "misses": 0, "puts": 0, "errors": 0, "waits": 0}
        self._unrecorded: list[JitEntry] = []  # local hits served before the remote was open

    def __repr__(self) -> str:
        return f"JaxCacheBackend({self.display_location!r}, local={self.local is not None})"

    @property
    def display_location(self) -> str:
        if self._cache is not None:
            return self._cache.display_location
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", self.location)

    @property
    def remote_open(self) -> bool:
        """Whether the cache (index, blob store) was opened; a warm local start never does."""
        return self._cache is not None

    @property
    def cache(self) -> ArtifactStore:
        """The jax-aot cache, opened on first use (the first local miss)."""
        if self._cache is None:
            with self._open_lock:
                if self._cache is None and self._opener is not None:
                    started = time.perf_counter()
                    self._cache = self._opener()
                    log.debug("jax-aot cache: opened %s in %.3f s", self.display_location,
                              time.perf_counter() - started)
        assert self._cache is not None
        self._record_unrecorded(self._cache.index)
        return self._cache

    @property
    def claimed(self) -> frozenset[str]:
        """The keys whose compile this process claimed and still holds."""
        with self._lock:
            return frozenset(self._claimed)

    @property
    def heartbeat(self) -> ClaimHeartbeat | None:
        """The thread renewing the claims (None until the first claim, and once closed)."""
        return self._heartbeat

    @property
    def counts(self) -> JaxCacheCounts:
        with self._lock:
            return JaxCacheCounts(**self._counts)

    def _count(self, what: str) -> None:
        with self._lock:
            self._counts[what] += 1

    def _warn(self, key: str, message: str, *args: Any) -> None:
        """One warning per key and process; later ones are debug."""
        with self._lock:
            first = key not in self._warned
            self._warned.add(key)
        log.log(logging.WARNING if first else logging.DEBUG, message, *args)

    # -- JAX's interface --------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """JAX's payload for ``key``, verified; None: a miss (then JAX compiles)."""
        try:
            # This thread's previous compile is over: a claim it did not store (too
            # fast or too small for JAX to write) is given up, so no one waits on it.
            self._release_claims(thread=threading.get_ident())
            local = self._local_hit(key)
            if local is not None:
                return local
            found = self._read(key)
            if found is not None or not self.compile_once or self.read_only or _not_the_writer():
                return self._counted(key, found)
            reached("jit.missed")
            return self._counted(key, self._claim_or_wait(key))
        except Exception as e:  # noqa: BLE001 - never raise into a jit call
            self._count("errors")
            self._warn(key, "jax-aot cache: could not read %s (%s: %s); compiling it", key, type(e).__name__, e)
            return None

    def put(self, key: str, value: bytes) -> None:
        """Stores JAX's payload under ``key``; a failure is a warning, never an error."""
        try:
            if self.read_only:
                return
            self._store(key, value)
            self._count("puts")
        except Exception as e:  # noqa: BLE001 - never raise into a jit call
            self._count("errors")
            self._warn(key, "jax-aot cache: could not store %s (%s: %s)", key, type(e).__name__, e)
        finally:
            self._release_claims({key})

    # -- reading ----------------------------------------------------------------------

    def _local_hit(self, key: str) -> bytes | None:
        """``key``'s payload from the local tier's own row and verified blob, without
        the remote (None: not there, or not usable: then the remote decides)."""
        if self.rows is None or self.local is None:
            return None
        entry = self.rows.get(key)
        if entry is None or signature_problem(self.signing_key, entry) is not None:
            return None
        try:
            payload = self.local.get_frame(entry.digest, entry.size)
        except Exception as e:  # noqa: BLE001 - a bad local copy: the remote's is fetched
            self._warn(key, "jax-aot cache: local copy of %s is unusable (%s); asking the remote", key, e)
            return None
        if payload is None:
            return None
        self._count("hits")
        if self._cache is not None:
            self._cache.index.jit_record(entry.name, key=key, hit=True, saved_seconds=entry.compile_seconds)
        else:
            with self._lock:
                self._unrecorded.append(entry)
        return payload

    def _record_unrecorded(self, index: Any) -> None:
        """Records in the index the local hits served before it was open."""
        with self._lock:
            entries, self._unrecorded = self._unrecorded, []
        for entry in entries:
            index.jit_record(entry.name, key=entry.key, hit=True, saved_seconds=entry.compile_seconds)

    def _counted(self, key: str, found: tuple[bytes, JitEntry] | None) -> bytes | None:
        index = self.cache.index
        if found is None:
            self._count("misses")
            with self._lock:
                self._missed_at[key] = time.perf_counter()
            index.jit_record(function_name(key), hit=False)
            return None
        payload, entry = found
        self._count("hits")
        index.jit_record(entry.name, key=key, hit=True, saved_seconds=entry.compile_seconds)
        return payload

    def _read(self, key: str) -> tuple[bytes, JitEntry] | None:
        """The verified payload of ``key``'s row (None: no usable row; warned)."""
        entry = self.cache.index.jit_get(key)
        if entry is None:
            return None
        refused = signature_problem(self.cache.signing_key, entry)
        if refused is not None:
            self._warn(key, "jax-aot cache: entry %s is %s; not executing it, compiling instead", key, refused)
            return None
        payload = self._payload(entry)
        if payload is None:
            return None
        self._keep_row(entry)
        return payload, entry

    def _keep_row(self, entry: JitEntry) -> None:
        if self.rows is not None:
            try:
                self.rows.put(entry)
            except OSError as e:  # the tier is a convenience
                log.warning("jax-aot cache: could not keep the local row of %s: %s", entry.key, e)

    def _payload(self, entry: JitEntry) -> bytes | None:
        if self.local is not None:
            try:
                payload = self.local.get_frame(entry.digest, entry.size)
                if payload is not None:
                    return payload
            except Exception as e:  # noqa: BLE001 - a bad local copy is fetched again
                log.warning("jax-aot cache: local copy of %s is unusable (%s); fetching it again", entry.key, e)
        try:
            payload = self.cache.blobs.get_frame(entry.digest, entry.size)
        except Exception as e:  # noqa: BLE001 - corrupt or unreachable: a miss
            self._warn(entry.key, "jax-aot cache: entry %s (%s) is unusable: %s; compiling it again",
                       entry.key, entry.name, e)
            return None
        if payload is None:
            self._warn(entry.key, "jax-aot cache: the blob of %s (%s) is missing; compiling it again",
                       entry.key, entry.name)
            return None
        if self.local is not None:
            try:
                self.local.store_frame(payload)
            except Exception as e:  # noqa: BLE001 - the tier is a convenience
                log.warning("jax-aot cache: could not keep a local copy of %s: %s", entry.key, e)
        return payload

    # -- compile once per fleet ---------------------------------------------------------

    def _claim_or_wait(self, key: str) -> tuple[bytes, JitEntry] | None:
        """A miss: claim the compile (None: compile it), or wait for the holder's entry."""
        index = self.cache.index
        deadline = time.monotonic() + self.wait_seconds
        delay = 0.05
        waited = False
        while True:
            other = index.jit_claim(key, self.holder, self.claim_seconds)
            if other is None:
                self._hold(key, index)
                # Stored between our miss and our claim (its holder released it)? Then
                # load it: read after claiming, or a holder quick to store and release
                # gets its program compiled twice.
                found = self._read(key)
                if found is not None:
                    self._release_claims({key})
                    return found
                reached("jit.claimed")
                return None
            if not waited:
                waited = True
                self._count("waits")
                log.info("jax-aot cache: %s is being compiled by %s; waiting for it", key, other)
            if time.monotonic() >= deadline:
                log.warning("jax-aot cache: waited %.0f s for %s to compile %s; compiling it here",
                            self.wait_seconds, other, key)
                return None
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, 1.0)
            found = self._read(key)
            if found is not None:
                return found

    def _hold(self, key: str, index: Any) -> None:
        """``key`` is claimed by this thread: its claim is renewed until it is released
        (by the put, or when the compile returns), for at most ``wait_seconds``."""
        with self._lock:
            self._claimed[key] = threading.get_ident()
            if self._heartbeat is None:
                self._heartbeat = ClaimHeartbeat(index, self.holder, self.claim_seconds)
                self._heartbeat.start()
            self._heartbeat.hold(key, for_seconds=self.wait_seconds)

    def compile_done(self) -> None:
        """A compile of this thread returned (JAX's event): the claim it held, stored
        or not, is given up (a compile too short for JAX to store leaves no entry to
        wait for). Never raises."""
        try:
            self._release_claims(thread=threading.get_ident())
        except Exception as e:  # noqa: BLE001 - never raise into a jit call; the claim expires
            log.warning("jax-aot cache: could not release a compile claim (%s: %s)", type(e).__name__, e)

    def _release_claims(self, keys: set[str] | None = None, *, thread: int | None = None) -> None:
        with self._lock:
            done = {
                k for k, t in self._claimed.items()
                if (keys is None or k in keys) and (thread is None or t == thread)
            }
            for k in done:
                del self._claimed[k]
                if self._heartbeat is not None:
                    self._heartbeat.drop(k)
        if done:
            self.cache.index.jit_unclaim(done, self.holder)

    def _stop_heartbeat(self, *, wait: bool = True) -> None:
        with self._lock:
            beat, self._heartbeat = self._heartbeat, None
        if beat is not None:
            beat.close(wait=wait)

    # -- writing ----------------------------------------------------------------------

    def _store(self, key: str, value: bytes) -> JitEntry:
        data = inflate_frame(value)
        digest = digest_of(data)
        name = function_name(key)
        index = self.cache.index
        lease = index.lease([digest])
        try:
            stored = self.cache.blobs.store_frame(value, data)
        except BaseException:
            index.release(lease)
            raise
        with self._lock:
            missed_at = self._missed_at.pop(key, None)
        # JAX records whole seconds; the time from our miss to this put is the compile's.
        seconds = time.perf_counter() - missed_at if missed_at is not None else float(jaxpc.compile_time_of(data))
        secret = self.cache.signing_key
        entry = JitEntry(
            key=key, name=name, digest=digest, size=len(data), stored_size=stored.stored_size,
            compile_seconds=seconds, platform=_platform(),
            signature=sign_entry(secret, key, name, digest, len(data)) if secret is not None else None,
        )
        index.jit_add(entry, lease=lease)
        if self.local is not None:
            try:
                self.local.store_frame(value, data)
            except Exception as e:  # noqa: BLE001 - the tier is a convenience
                log.warning("jax-aot cache: could not keep a local copy of %s: %s", key, e)
            else:
                self._keep_row(entry)
        log.debug("jax-aot cache: stored %s (%d bytes, %s)", key, stored.stored_size,
                  "written" if stored.written else "blob present")
        return entry

    def flush(self) -> None:
        """Records the local hits not yet in the index (opens only the index, not the
        blob store, when the cache is still closed); never raises."""
        with self._lock:
            pending = bool(self._unrecorded)
        if not pending or self.read_only:
            return
        try:
            if self._cache is not None:
                self._record_unrecorded(self._cache.index)
                return
            index = _open_index(self.location, self.timeouts)
            try:
                self._record_unrecorded(index)
            finally:
                index.close()
        except Exception as e:  # noqa: BLE001 - statistics are a convenience
            log.warning("jax-aot cache: could not record %s's local hits: %s", self.display_location, e)

    def close(self) -> None:
        self._stop_heartbeat()
        self._release_claims()
        self.flush()
        if self.local is not None:
            self.local.close()
        if self.owns and self._cache is not None:
            self._cache.close()


def _signing_key(value: str | bytes | None) -> bytes | None:
    """The cache's signing key as :class:`Cache` will take it (``AOT_SIGNING_KEY`` when
    None), importing :mod:`aot.signing` (and the artifact model) only when there is one."""
    if value is None and not os.environ.get("AOT_SIGNING_KEY"):
        return None
    from aot.signing import key_from

    return key_from(value)


def _dialect(location: str) -> str:
    """The database dialect a location names (\"\" for a folder), without SQLAlchemy."""
    match = re.match(r"^([A-Za-z][A-Za-z0-9.\-]*)(\+[A-Za-z0-9_]+)?://", location)
    if match is None:
        return ""
    scheme = match.group(1).lower()
    return "postgresql" if scheme in ("postgresql", "postgres") else scheme


def _open_index(location: str, timeouts: Timeouts | None = None) -> Any:
    """Only the index of the cache at ``location`` (for recording statistics)."""
    if _dialect(location) in ("postgresql", "sqlite"):
        from aot.cache.index.sql import Index

        return Index(location, timeouts=timeouts)
    from aot.cache.store import ArtifactStore

    return ArtifactStore(location, timeouts=timeouts).index


def _platform() -> str:
    import jax

    return str(jax.default_backend())


_installed: tuple[JaxCacheBackend, jaxpc.Installed] | None = None
_install_lock = threading.Lock()
_listening = False  # JAX's compile event reaches the installed backend (registered once)


def _compile_done() -> None:
    found = _installed
    if found is not None:
        found[0].compile_done()


def install(
    target: ArtifactStore | str | os.PathLike[str],
    *,
    blob_location: str | os.PathLike[str] | None = None,
    local: str | os.PathLike[str] | None = None,
    signing_key: str | bytes | None = None,
    read_only: bool = False,
    compile_once: bool | None = None,
    claim_seconds: float = CLAIM_SECONDS,
    wait_seconds: float = WAIT_SECONDS,
    timeouts: Timeouts | None = None,
    slice_share: bool = True,
) -> JaxCacheBackend:
    """Makes the jax-aot cache ``target`` (a :class:`~aot.cache.store.ArtifactStore`, a folder
    or a database URL) JAX's persistent compilation cache in this process; replaces a
    previous :func:`install`. Returns the backend (``.counts``: this process's hits).
    ``timeouts`` (an :class:`aot.Timeouts`) bound the waits of the cache opened at a
    location (None: the environment's); a :class:`Cache` target keeps its own.
    ``slice_share`` (default on): in a multi-process job (``jax.distributed``), one
    process compiles each program for the job and every process hits in the next run
    (:func:`share_between_hosts`)."""
    if not isinstance(target, (str, os.PathLike)):  # a Cache
        if timeouts is not None:
            raise UsageError(
                "aot.jax_cache.install(<an open Cache>, timeouts=...): an open cache keeps the "
                "bounds it was opened with; pass timeouts= to aot.Cache(...) instead, or give "
                "install a location"
            )
        backend = JaxCacheBackend(
            target, local=local, compile_once=compile_once, claim_seconds=claim_seconds, wait_seconds=wait_seconds,
        )
    else:
        where = os.fspath(target)

        def opener() -> ArtifactStore:
            from aot.cache.store import ArtifactStore

            return ArtifactStore(
                where, blob_location=blob_location, signing_key=signing_key, read_only=read_only,
                timeouts=timeouts,
            )

        # Opened on the first local miss (no local tier: the first lookup).
        backend = JaxCacheBackend(
            None, opener=opener, location=where, signing_key=_signing_key(signing_key), read_only=read_only,
            timeouts=timeouts, local=local, owns=True, compile_once=compile_once,
            claim_seconds=claim_seconds, wait_seconds=wait_seconds,
        )
    global _installed, _listening
    with _install_lock:
        if not _listening:
            jaxpc.on_compile_done(_compile_done)
            _listening = True
        previous = _installed
        state = previous[1] if previous is not None else None
        new_state = jaxpc.install_backend(jaxpc.make_backend(backend.get, backend.put, backend.display_location))
        _installed = (backend, state if state is not None else new_state)
    if previous is not None:
        previous[0].close()
    if slice_share:
        share_between_hosts()
    log.info("JAX's persistent compilation cache is the jax-aot cache at %s", backend.display_location)
    min_seconds = _min_compile_seconds()
    if min_seconds > 0:
        log.info("jax-aot cache: %s", MIN_COMPILE_TIME_HINT.format(seconds=min_seconds))
    return backend


def _min_compile_seconds() -> float:
    """JAX's ``jax_persistent_cache_min_compile_time_secs`` (0 if it cannot be read)."""
    import jax

    try:
        return float(getattr(jax.config, "jax_persistent_cache_min_compile_time_secs"))
    except (AttributeError, TypeError, ValueError):
        return 0.0


def _not_the_writer() -> bool:
    """True in a process of a multi-process job other than process 0: JAX writes the
    persistent cache from process 0 only, so a claim here would never be fulfilled
    (its slice shares process 0's binary instead: :func:`share_between_hosts`)."""
    if jaxdist.client() is None:
        return False
    import jax

    return jax.process_index() != 0


#: JAX's settings before :func:`install` shared binaries (what :func:`uninstall` puts back).
_shared_before: tuple[bool, bool, int] | None = None


def share_between_hosts(enable: bool = True) -> None:
    """Compile once per slice for ``jax.jit`` in a multi-process job: JAX's own
    ``jax_share_binary_between_hosts`` (the process of a program's lowest device
    compiles, writes the cache and hands the binary to the others through the job's
    key-value store), bounded by ``AOT_SLICE_WAIT_SECONDS``; and a persistent-cache key
    that every process of the job computes alike (on CPU JAX's is each process's own:
    :func:`aot.jaxcompat.persistent_cache.slice_invariant_keys`), so that in the next
    run every process hits. Single-process programs are untouched."""
    import jax

    global _shared_before
    if enable and _shared_before is None:
        _shared_before = (
            jaxpc.slice_invariant_keys(True), getattr(jax.config, "jax_share_binary_between_hosts"),
            getattr(jax.config, "jax_share_binary_between_hosts_timeout_ms"),
        )
    elif not enable and _shared_before is not None:
        keys, flag, timeout_ms = _shared_before
        _shared_before = None
        jaxpc.slice_invariant_keys(keys)
        jax.config.update("jax_share_binary_between_hosts", flag)
        jax.config.update("jax_share_binary_between_hosts_timeout_ms", timeout_ms)
        return
    jaxpc.slice_invariant_keys(enable)
    jax.config.update("jax_share_binary_between_hosts", enable)
    if enable:
        jax.config.update("jax_share_binary_between_hosts_timeout_ms", int(slice_wait_seconds() * 1000))


def uninstall() -> bool:
    """Restores JAX's own persistent cache object and state; False if nothing was installed."""
    global _installed
    with _install_lock:
        found = _installed
        _installed = None
        if found is not None:
            jaxpc.restore(found[1])
    if found is None:
        return False
    if _shared_before is not None:
        share_between_hosts(False)
    found[0].close()
    return True


def installed() -> JaxCacheBackend | None:
    """The backend :func:`install` set (None: JAX uses its own cache)."""
    return _installed[0] if _installed is not None else None


def install_from_env(environ: dict[str, str] | None = None) -> JaxCacheBackend | None:
    """:func:`install` from ``AOT_JAX_CACHE`` (and ``AOT_JAX_CACHE_BLOBS``,
    ``AOT_JAX_CACHE_LOCAL``, ``AOT_JAX_CACHE_COMPILE_ONCE``, ``AOT_JAX_CACHE_CLAIM_SECONDS``,
    ``AOT_JAX_CACHE_WAIT_SECONDS``, ``AOT_SIGNING_KEY``); None when ``AOT_JAX_CACHE`` is unset."""
    env = os.environ if environ is None else environ
    location = env.get(ENV)
    if not location:
        return None
    return install(
        location, blob_location=env.get(ENV_BLOBS) or None, local=env.get(ENV_LOCAL) or None,
        signing_key=env.get("AOT_SIGNING_KEY") or None,
        compile_once={"1": True, "0": False}.get(env.get(ENV_COMPILE_ONCE, "").strip()),
        claim_seconds=float(env.get(ENV_CLAIM_SECONDS) or CLAIM_SECONDS),
        wait_seconds=float(env.get(ENV_WAIT_SECONDS) or WAIT_SECONDS),
    )


@atexit.register
def _release_at_exit() -> None:
    found = _installed
    if found is not None:
        found[0]._stop_heartbeat(wait=False)
        found[0]._release_claims()
        found[0].flush()
