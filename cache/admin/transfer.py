"""Copying entries between caches (the library side of ``aot push`` / ``aot pull``).

Rows are read from the source's index; blobs move as stored, ContentStore to
ContentStore (:meth:`~aot.cache.storage.content.ContentStore.copy_to`: no recompression, every
payload verified against its digest); the destination commits the rows under the same
gc protocol as any writer (leases, docs/reliability.md), a batch of rows per index
transaction after every blob of the batch is durable, each distinct blob looked at
once per batch (:mod:`~aot.cache.admin.copy_batches`). Copies are idempotent and
resumable: an entry stored intact at the destination is skipped, one whose blobs are
missing or corrupt there is repaired. A run killed midway leaves committed rows
(skipped next time) and, at worst, blobs without their row (found intact and kept
next time: nothing is copied twice).

A copied row keeps its source's compile time (``created_at``), never the time its
copy finished. The source's refs travel by the rules of
:mod:`~aot.cache.admin.carried_refs` (a slot without a ref at the destination gets
the source's; ``refs=True`` overwrites; ``release=LABEL`` copies a release and records
its label), written once after every entry is committed.

Between two folder caches, a copy first asks whether it has anything to do at all
(:mod:`~aot.cache.admin.up_to_date`: the same checks, read-only through the standard
library's reader, no lease): when every entry is already there intact and no ref needs
writing, it reports so without opening the destination's SQL index (an up-to-date
``aot push`` / ``pull`` never imports SQLAlchemy); otherwise it copies as above.

``aot push DEST`` is :func:`push` (this cache -> DEST), ``aot pull SOURCE`` is
:func:`pull` (SOURCE -> this cache); the other side is any cache location (a
folder, a database URL) with its own blob location (``--to-blobs`` /
``--from-blobs``: a folder or an object-store URL).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.cache.admin.copy_batches import Result, copy_in_batches
from aot.cache.admin.jit_entries import copy_jit_entries
from aot.cache.admin.carried_refs import CarriedRefs, RefsOutcome, apply_refs, carried_refs, release_to_copy
from aot.cache.admin.up_to_date import select_entries, up_to_date
from aot.errors import AotError, CacheError

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore

log = logging.getLogger(__name__)

__all__ = ["TransferReport", "copy_entries", "open_other", "pull", "push"]


@dataclass(frozen=True, slots=True)
class TransferReport:
    """What :func:`copy_entries` did, by key."""

    source: str
    destination: str
    copied: tuple[str, ...]
    skipped: tuple[str, ...]  # stored intact at the destination already
    repaired: tuple[str, ...] = ()  # stored there, blobs missing or corrupt: restored
    failed: tuple[tuple[str, str], ...] = ()  # (key, why): names refused, damaged at the source
    bytes_copied: int = 0  # stored bytes of the entries copied or repaired
    seconds: float = 0.0
    refs: RefsOutcome = RefsOutcome()  # what the copy did to the destination's refs

    @property
    def ok(self) -> bool:
        return not self.failed and self.refs.problem is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "destination": self.destination,
            "copied": len(self.copied),
            "skipped": len(self.skipped),
            "repaired": len(self.repaired),
            "failed": [{"key": k, "reason": why} for k, why in self.failed],
            "bytes_copied": self.bytes_copied,
            "seconds": round(self.seconds, 4),
            "refs": self.refs.to_dict(),
            "keys": {"copied": list(self.copied), "skipped": list(self.skipped), "repaired": list(self.repaired)},
        }


def copy_entries(
    source: ArtifactStore, destination: ArtifactStore, names: Iterable[str] | None = None, *, jobs: int = 1,
    refs: bool = False, release: str | None = None, origin: str | None = None,
) -> TransferReport:
    """Copies every intact entry of ``source`` whose name matches one of the globs
    ``names`` (all if None) into ``destination``, in batches whose blobs are checked
    and copied ``jobs`` at a time (threads: object stores answer slowly, not busily).
    An entry that cannot be copied (a damaged source blob, a name the rule refuses)
    is reported in ``failed`` and the others are copied.

    Then the source's refs of the entries now stored at the destination are written
    there once: for slots without a ref there, or all of them with ``refs``. With
    ``release``, only that label's members are copied, their refs written and the label
    recorded at the destination (``origin`` names the copy in the refs' history)."""
    start = time.perf_counter()
    globs = list(names) if names else None
    if release is not None and globs:
        raise CacheError(
            f"give either NAME_GLOBs ({' '.join(globs)}) or --release {release}: a release is copied whole"
        )
    destination.check_writable("copy entries into it")
    if release is None:  # nothing to do? decided read-only, without SQLAlchemy (up_to_date.py)
        done = up_to_date(source, destination, globs, jobs=jobs, overwrite_refs=refs)
        if done is not None:
            there = {"stored": [], "present": [*done.present, *done.jit_present], "repaired": []}
            return _reported(source, destination, there, list(done.failed), 0, start, done.refs)
    members = None if release is None else {m.key for m in release_to_copy(source, release)}
    outcomes: dict[str, list[str]] = {"stored": [], "present": [], "repaired": []}
    todo, failed = select_entries(source.index.entries(), globs, members)

    results: list[Result] = []
    if todo:
        # The first entry alone: a destination that refuses every write (no such
        # bucket, no credentials, unreachable) fails the transfer once, not per entry.
        try:
            _, outcome = destination.copy_entry_from(source, todo[0])
        except CacheError as exc:
            raise CacheError(
                f"nothing copied to {destination.display_location}: {exc}"
            ) from exc
        except AotError as exc:  # this entry's own problem (a corrupt source blob)
            log.warning("not copied: %s (%s): %s", todo[0].name, todo[0].key[:12], exc)
            results.append((todo[0], None, str(exc)))
        else:
            results.append((todo[0], outcome, None))
    # The rest in batches: rows committed per batch after its blobs, each distinct
    # blob looked at once (cache/admin/copy_batches.py).
    results += copy_in_batches(source, destination, todo[1:], jobs=jobs)
    copied_bytes = 0
    for entry, copied, error in results:  # in the source's order, whatever finished first
        if copied is None:
            failed.append((entry.key, error or "?"))
            continue
        outcomes[copied].append(entry.key)
        if copied != "present":
            copied_bytes += entry.stored_size
    # Refs last, once every entry's row and blobs are committed at the destination.
    present = [key for keys in outcomes.values() for key in keys]
    carried = carried_refs(source, [e.key for e in todo], release) if todo or release else CarriedRefs()
    ref_outcome = apply_refs(
        destination, carried, present, overwrite=refs,
        source=origin or f"copy from {source.display_location}",
    )
    if release is None:  # KIND jit entries (aot.jax_cache) travel too; releases name none
        jit = copy_jit_entries(source, destination, globs)
        outcomes["stored"] += jit.copied
        outcomes["present"] += jit.present
        failed += jit.failed
    return _reported(source, destination, outcomes, failed, copied_bytes, start, ref_outcome)


def _reported(
    source: ArtifactStore, destination: ArtifactStore, outcomes: dict[str, list[str]], failed: list[tuple[str, str]],
    copied_bytes: int, start: float, ref_outcome: RefsOutcome,
) -> TransferReport:
    """The report of a copy (keys by outcome: stored, present, repaired), logged."""
    report = TransferReport(
        source.display_location, destination.display_location, tuple(outcomes["stored"]),
        tuple(outcomes["present"]), tuple(outcomes["repaired"]), tuple(failed),
        copied_bytes, time.perf_counter() - start, ref_outcome,
    )
    log.info(
        "copied %d entries from %s to %s (%d already there, %d repaired, %d failed; %d refs set, %d kept)",
        len(report.copied), report.source, report.destination, len(report.skipped),
        len(report.repaired), len(report.failed), len(ref_outcome.set), len(ref_outcome.kept),
    )
    return report


def open_other(
    location: str | os.PathLike[str], *, blob_location: str | None = None, read_only: bool,
    like: ArtifactStore | None = None,
) -> ArtifactStore:
    """The cache at the other end of a push (``read_only=False``: created if needed) or
    a pull (``read_only=True``: it must exist: a mistyped folder is not an empty
    cache). ``like``: take its signing key, signature policy and network bounds."""
    from aot.cache.store import ArtifactStore, require_cache

    location = os.fspath(location)
    if read_only:
        require_cache(location, "nothing to pull from", "check the SOURCE location")
    options = {**(like.options() if like is not None else {}), "blob_location": blob_location}
    return ArtifactStore(location, read_only=read_only, **options)


def push(
    cache: ArtifactStore, destination: str | os.PathLike[str], names: Iterable[str] | None = None, *,
    blob_location: str | None = None, jobs: int = 1, refs: bool = False, release: str | None = None,
) -> TransferReport:
    """Copies ``cache``'s entries (matching the globs ``names``, or the members of
    ``release``) to the cache at ``destination`` (blobs at ``blob_location``),
    creating it if needed; refs as :func:`copy_entries`."""
    other = open_other(destination, blob_location=blob_location, read_only=False, like=cache)
    try:
        return copy_entries(cache, other, names, jobs=jobs, refs=refs, release=release,
                            origin=f"push to {other.display_location}")
    finally:
        other.close()


def pull(
    cache: ArtifactStore, source: str | os.PathLike[str], names: Iterable[str] | None = None, *,
    blob_location: str | None = None, jobs: int = 1, refs: bool = False, release: str | None = None,
) -> TransferReport:
    """Copies the entries of the cache at ``source`` (blobs at ``blob_location``;
    opened read-only) matching the globs ``names`` (or the members of ``release``)
    into ``cache``; refs as :func:`copy_entries`."""
    other = open_other(source, blob_location=blob_location, read_only=True, like=cache)
    try:
        return copy_entries(other, cache, names, jobs=jobs, refs=refs, release=release,
                            origin=f"pull from {other.display_location}")
    finally:
        other.close()
