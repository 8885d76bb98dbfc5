"""Copying many entries between caches in batches (push, pull): the round trips of a
batch are shared, the guarantees of one entry's copy are kept.

Per batch of :data:`BATCH` entries, in this order:

1. one index query for the destination's rows of the batch's keys;
2. a row already there is skipped when its blobs are intact there: one batched
   ``stat`` of their digests, and a blob this run has not verified yet is read and
   verified (each distinct blob once per run, not once per entry); a row there whose
   blobs are not intact (or that is quarantined) is copied alone, as by
   :meth:`~aot.cache.store.ArtifactStore.copy_entry_from` (repaired);
3. the other entries: one lease on every digest they name, taken before any blob is
   looked at; their blobs copied as stored (:meth:`ContentStore.copy_many
   <aot.cache.storage.content.ContentStore.copy_many>`: one batched ``stat``, each
   distinct blob verified or copied once, ``jobs`` at a time); then every row whose
   blobs are all durable is committed in **one** transaction that releases the lease
   (:meth:`~aot.cache.index.sql.Index.add_many`); an expired lease starts the batch's
   blobs over, as a single writer does.

A copy killed at any point leaves rows only for entries whose blobs were durable before
the row's transaction began (the batch's rows commit after all its blobs), and blobs
without rows at worst: the next copy finds them by ``stat``, verifies them once and
does not copy them again. Rows keep the source's ``created_at``; results come back in
the batch's order, whatever finished first.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from aot.cache.store import LEASE_ATTEMPTS, entry_of, manifest_to_copy, store_manifest
from aot.cache.index.entry import IndexEntry, entry_digests, referenced_digests
from aot.cache.index.leases import LeaseLostError
from aot.cache.pauses import reached
from aot.errors import AotError, CacheError

if TYPE_CHECKING:
    from aot.artifact import Manifest
    from aot.cache.store import ArtifactStore

log = logging.getLogger(__name__)

__all__ = ["BATCH", "Result", "copy_in_batches"]

#: Entries per batch: rows committed per index transaction. A copy killed midway
#: redoes at most this many rows (not their blobs).
BATCH = 200

#: (source entry, "stored" / "present" / "repaired" or None, why it failed or None)
Result = tuple[IndexEntry, str | None, str | None]


@dataclass(frozen=True, slots=True)
class _Pending:
    """An entry to commit at the destination: the manifest it stores, its blobs' sizes."""

    entry: IndexEntry  # the source's row
    manifest: Manifest
    raw: dict[str, int]  # digest -> uncompressed size


def copy_in_batches(
    source: ArtifactStore, destination: ArtifactStore, entries: Sequence[IndexEntry], *, jobs: int = 1,
) -> list[Result]:
    """Copies ``entries`` of ``source`` into ``destination``, :data:`BATCH` at a time
    (see the module docstring); one result per entry, in their order."""
    verified: dict[str, int] = {}  # destination digest -> stored size, verified by this run
    results: list[Result] = []
    for i in range(0, len(entries), BATCH):
        results += _copy_batch(source, destination, entries[i : i + BATCH], jobs, verified)
    return results


def _copy_batch(
    source: ArtifactStore, destination: ArtifactStore, batch: Sequence[IndexEntry], jobs: int, verified: dict[str, int],
) -> list[Result]:
    done: dict[str, tuple[str | None, str | None]] = {}
    try:
        rows = destination.index.get_many([e.key for e in batch])
    except AotError as exc:  # the index unreachable: each entry fails, as one by one
        return [(entry, None, _refused(entry, exc)) for entry in batch]
    there = {key: row for key, row in rows.items() if row.ok}
    try:
        intact = destination.blobs.verified_among(
            {d for row in there.values() for d in entry_digests(row)}, verified=verified, jobs=jobs,
        )
    except AotError as exc:  # the store unreachable: the rows there fail, as one by one
        done.update((key, (None, _refused(row, exc))) for key, row in there.items())
        intact = set()
    alone: list[IndexEntry] = []  # rows there, damaged or quarantined: copied one by one
    pending: list[_Pending] = []
    for entry in batch:
        row = rows.get(entry.key)
        if entry.key in done:
            continue
        if row is not None:
            if row.ok and all(d in intact for d in entry_digests(row)):
                done[entry.key] = ("present", None)
            else:
                alone.append(entry)
            continue
        try:
            manifest = manifest_to_copy(destination, source, entry)
        except AotError as exc:
            done[entry.key] = (None, _refused(entry, exc))
            continue
        pending.append(_Pending(entry, manifest, {ref.digest: ref.size for ref in manifest.blobs.values()}))
    if pending:
        done.update(_commit_batch(source, destination, pending, jobs, verified))
    for entry in alone:
        try:
            _, outcome = destination.copy_entry_from(source, entry)
        except AotError as exc:
            done[entry.key] = (None, _refused(entry, exc))
        else:
            done[entry.key] = (outcome, None)
    return [(entry, *done[entry.key]) for entry in batch]


def _commit_batch(
    source: ArtifactStore, destination: ArtifactStore, pending: list[_Pending], jobs: int, verified: dict[str, int],
) -> dict[str, tuple[str | None, str | None]]:
    """The writer's protocol for a batch: lease, blobs durable, rows committed with the
    lease released in one transaction; started over when gc took the expired lease."""
    rows_of = {p.entry.key: entry_of(p.manifest) for p in pending}
    # Leased too: each row's manifest blob, written by this process after the copies.
    digests = sorted({d for p in pending for d in p.raw} | {d for r in rows_of.values() for d in referenced_digests(r)})
    for attempt in range(1, LEASE_ATTEMPTS + 1):
        reached("copy.start")
        try:
            lease = destination.index.lease(digests)
        except CacheError as exc:
            return {p.entry.key: (None, f"storing {_label(p.manifest)}: {exc}") for p in pending}
        done: dict[str, tuple[str | None, str | None]] = {}
        try:
            reached("copy.leased")
            sizes, errors = source.blobs.copy_many(destination.blobs, digests, verified=verified, jobs=jobs)
            manifests = {  # written here, not copied: the row's text (a source may predate schema 10)
                p.entry.key: store_manifest(destination, rows_of[p.entry.key])
                for p in pending if not any(d in errors for d in p.raw)
            }
            reached("copy.blobs_ready")
            rows = []
            ready: list[_Pending] = []
            for p in pending:
                broken = next((errors[d] for d in p.raw if d in errors), None)
                if broken is not None:
                    done[p.entry.key] = (None, _refused(p.entry, broken, p.manifest))
                    continue
                blob_sizes = {d: (size, sizes[d]) for d, size in p.raw.items()}
                blob_sizes.update(manifests[p.entry.key])
                row = replace(
                    rows_of[p.entry.key], raw_size=sum(p.raw.values()),
                    stored_size=sum(stored for _, stored in blob_sizes.values()),
                )
                rows.append((row, blob_sizes, p.entry.created_at))
                ready.append(p)
            added = destination.index.add_many(rows, lease=lease)
        except LeaseLostError as exc:
            log.warning("%s (attempt %d of %d)", exc, attempt, LEASE_ATTEMPTS)
            for d in digests:  # gc may have taken them: look again
                verified.pop(d, None)
            continue
        except BaseException as exc:
            destination.index.release(lease)
            if isinstance(exc, AotError):  # the index or the store refused the batch
                return {**{p.entry.key: (None, _refused(p.entry, exc, p.manifest)) for p in pending}, **done}
            raise
        reached("copy.committed")
        for p, new in zip(ready, added):
            log.info(
                "%s %s (%s) key %s", "stored" if new else "already had", p.manifest.name,
                p.manifest.signature, p.manifest.key[:12],
            )
            done[p.entry.key] = ("stored" if new else "present", None)
        return done
    why = (
        f"its blob leases expired {LEASE_ATTEMPTS} times before the row could be committed (each "
        "lease lasts an hour on the database clock); is the blob store very slow, or this process "
        "being suspended?"
    )
    return {p.entry.key: (None, f"storing {_label(p.manifest)}: {why}") for p in pending}


def _label(manifest: Manifest) -> str:
    return f"{manifest.name!r} ({manifest.key[:12]})"


def _refused(entry: IndexEntry, exc: AotError, manifest: Manifest | None = None) -> str:
    """Why ``entry`` was not copied, as a single entry's copy says it (a store error
    names the entry being stored); logged as a warning."""
    why = f"storing {_label(manifest)}: {exc}" if manifest is not None and isinstance(exc, CacheError) else str(exc)
    log.warning("not copied: %s (%s): %s", entry.name, entry.key[:12], why)
    return why
