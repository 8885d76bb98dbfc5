"""An entry's artifact in a cache: read back verified, or stored under the gc protocol.

Reading checks the manifest against its index row, verifies its signature (when the
cache has a key) and reads the blobs through the content store, which verifies each
digest; any mismatch is a :class:`CorruptArtifactError` naming the entry.

Storing is the writer's side of the gc protocol. A writer leases the digests of an entry in the index, makes its blobs durable, then
commits the row and releases the lease in one transaction, and starts over when gc
took an expired lease meanwhile (docs/reliability.md has the protocol). Storing an
artifact and copying an entry from another cache (push, pull, the local tier) share
it; what differs is how the blobs are written: compressed from bytes, or copied as
stored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from aot.artifact import EXECUTABLE, PORTABLE_HLO, Artifact, Manifest
from aot.errors import CacheError, CorruptArtifactError, IncompatibleEnvironmentError
from aot.signing import sign, verify
from aot.cache.index.entry import IndexEntry

if TYPE_CHECKING:
    from aot.cache.cache import Cache

log = logging.getLogger(__name__)

#: How many times a writer starts over when gc took its expired lease.
LEASE_ATTEMPTS = 3


def read_artifact(
    cache: Cache, entry: IndexEntry, roles: Iterable[str] | None = None, parsed: Manifest | None = None,
) -> Artifact:
    """The manifest of ``entry`` and its verified blobs (only those of ``roles`` when
    given) (:meth:`Cache.artifact <aot.cache.cache.Cache.artifact>`). ``parsed``:
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


def store_artifact(
    cache: Cache, artifact: Artifact, *, created_at: datetime | None = None,
) -> tuple[IndexEntry, str]:
    """Stores ``artifact`` in ``cache``: the entry, and ``"stored"``, ``"present"`` or
    ``"repaired"`` (:meth:`Cache.store_artifact <aot.cache.cache.Cache.store_artifact>`).
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
    return commit(cache, manifest, write_blobs, created_at=created_at)


def copy_entry(cache: Cache, source: Cache, entry: IndexEntry) -> tuple[IndexEntry, str]:
    """Stores ``source``'s entry in ``cache``: its blobs copied as stored (no
    recompression, each verified), under the same protocol as :func:`store_artifact`.
    The row keeps the source's compile time (``created_at``): a copy is not newer."""
    manifest = manifest_to_copy(cache, source, entry)
    raw = {ref.digest: ref.size for ref in manifest.blobs.values()}

    def copy_blobs() -> dict[str, tuple[int, int]]:
        report = source.blobs.copy_to(cache.blobs, raw)
        return {d: (raw[d], report.stored_sizes[d]) for d in raw}

    return commit(cache, manifest, copy_blobs, created_at=entry.created_at)


def manifest_to_copy(cache: Cache, source: Cache, entry: IndexEntry) -> Manifest:
    """The manifest of ``source``'s ``entry`` as ``cache`` stores it: parsed, its
    signature checked as the source requires, checked and signed as for a store."""
    try:
        manifest = Manifest.from_json(entry.manifest)
    except CorruptArtifactError as exc:
        raise CorruptArtifactError(f"{entry.name} ({entry.key[:12]}): {exc}") from None
    verify(manifest, source.signing_key, require=source.require_signatures)
    return manifest_to_store(cache, manifest)


def manifest_to_store(cache: Cache, manifest: Manifest) -> Manifest:
    """``manifest`` checked (name rule) and signed with ``cache``'s key."""
    from aot.cache.names import check_name  # writers only: serving never imports it

    cache._check_writable("store an artifact")
    check_name(manifest.name)  # before any blob is written
    if cache.signing_key is not None:
        if manifest.hmac is None:
            return sign(manifest, cache.signing_key)
        verify(manifest, cache.signing_key)  # signed elsewhere: only if this cache could load it
    return manifest


def commit(
    cache: Cache, manifest: Manifest, write_blobs: Callable[[], dict[str, tuple[int, int]]],
    *, created_at: datetime | None = None,
) -> tuple[IndexEntry, str]:
    """The writer's side of the gc protocol: lease the digests, make the blobs durable
    (``write_blobs`` -> digest: (size, stored size)), then commit the row and release
    the lease in one transaction; start over if gc took an expired lease meanwhile."""
    from aot.cache.index.leases import LeaseLostError
    from aot.cache.pauses import reached  # writers only: serving never imports it

    existing = cache.lookup(manifest.key)
    broken = False
    if existing is not None and existing.ok:
        if stored_intact(cache, existing):
            # Stored and intact. XLA's executables are not byte-identical from one
            # compile to the next, so writing this one would only leave an orphan
            # blob behind (and `aot verify` reports orphans).
            return existing, "present"
        broken = True
    entry = entry_of(manifest)
    digests = {ref.digest for ref in manifest.blobs.values()}
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
            reached("put.blobs_ready")
            final = replace(
                entry,
                raw_size=sum(size for size, _ in sizes.values()),
                stored_size=sum(stored for _, stored in sizes.values()),
            )
            added = cache.index.add(final, blob_sizes=sizes, lease=lease, stamp=True, replace=broken,
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


def entry_of(manifest: Manifest) -> IndexEntry:
    """The index row of ``manifest``, sizes not known yet."""
    return IndexEntry(
        key=manifest.key,
        name=manifest.name,
        program_fp=manifest.program.digest,
        env_fp=manifest.environment.digest,
        signature=manifest.signature,
        platform=manifest.environment.as_dict().get("platform", "?"),
        manifest=manifest.to_json(),
        exe_digest=digest_of(manifest, EXECUTABLE),  # None: a symbolic entry
        hlo_digest=digest_of(manifest, PORTABLE_HLO),
        raw_size=0,
        stored_size=0,
        compile_seconds=manifest.compile_seconds,
    )


def stored_intact(cache: Cache, entry: IndexEntry) -> bool:
    """Whether every blob of ``entry``'s row is stored in ``cache`` and intact: each
    read and verified against its digest (a single entry's copy or store, and the
    check that a copy has nothing to do: :mod:`aot.cache.admin.up_to_date`)."""
    return all(cache.blobs.check(d) is None for d in entry_digests(entry))


def entry_digests(entry: IndexEntry) -> list[str]:
    return [d for d in (entry.exe_digest, entry.hlo_digest) if d]


def digest_of(manifest: Manifest, role: str) -> str | None:
    ref = manifest.blobs.get(role)
    return ref.digest if ref is not None else None
