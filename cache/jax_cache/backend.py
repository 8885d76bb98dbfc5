"""The backend of JAX's persistent compilation cache over a jax-aot cache: JAX's
``get``/``put`` (:class:`JaxCacheBackend`), its local tier, its compile-once claims and
what it counts. :mod:`aot.cache.jax_cache` (the package) describes the whole and
:mod:`aot.cache.jax_cache.installation` plugs a backend into JAX."""

from __future__ import annotations

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
from aot.cache.index.jit_records import JitEntry, function_name, sign_entry, signature_problem
from aot.cache.pauses import reached
from aot.cache.storage.content import ContentStore, digest_of, inflate_frame
from aot.cache.storage.locations import open_object_store
from aot.cache.timeouts import Timeouts
from aot.jaxcompat import distributed as jaxdist
from aot.jaxcompat import persistent_cache as jaxpc

if TYPE_CHECKING:  # imported when a cache is opened: a warm local start never needs it
    from aot.cache.store import ArtifactStore

log = logging.getLogger(__name__)

__all__ = ["CLAIM_SECONDS", "WAIT_SECONDS", "JaxCacheBackend", "JaxCacheCounts"]

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

    def at_exit(self) -> None:
        """The process exits: its claims are given back (without waiting for the
        heartbeat thread) and its local hits recorded; the stores stay open."""
        self._stop_heartbeat(wait=False)
        self._release_claims()
        self.flush()

    def close(self) -> None:
        self._stop_heartbeat()
        self._release_claims()
        self.flush()
        if self.local is not None:
            self.local.close()
        if self.owns and self._cache is not None:
            self._cache.close()


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


def _not_the_writer() -> bool:
    """True in a process of a multi-process job other than process 0: JAX writes the
    persistent cache from process 0 only, so a claim here would never be fulfilled
    (its slice shares process 0's binary instead: :func:`share_between_hosts`)."""
    if jaxdist.client() is None:
        return False
    import jax

    return jax.process_index() != 0
