"""verify and gc: integrity checks and plan-then-execute garbage collection."""

from __future__ import annotations

import datetime as _dt
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.artifact import EXECUTABLE, PORTABLE_HLO, Manifest
from aot.errors import AotError, CacheError, IntegrityError
from aot.signing import verify as verify_signature
from aot.cache.index import IndexEntry, utcnow
from aot.cache.listing import superseded_keys
from aot.cache.units import human_size, parse_age, parse_size  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from aot.cache.cache import Cache

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- verify


@dataclass(frozen=True, slots=True)
class Problem:
    key: str
    name: str
    what: str

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "name": self.name, "problem": self.what}


@dataclass(frozen=True, slots=True)
class VerifyReport:
    checked_entries: int
    checked_blobs: int
    problems: tuple[Problem, ...]
    quarantined: tuple[str, ...]
    orphan_blobs: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems and not self.orphan_blobs

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked_entries": self.checked_entries,
            "checked_blobs": self.checked_blobs,
            "problems": [p.to_dict() for p in self.problems],
            "quarantined": list(self.quarantined),
            "orphan_blobs": list(self.orphan_blobs),
        }


def verify_cache(cache: Cache, *, quarantine: bool = True) -> VerifyReport:
    """Re-hashes every blob, parses every manifest, reports and quarantines bad entries."""
    problems: list[Problem] = []
    quarantined: list[str] = []
    blob_state: dict[str, str | None] = {}

    def check(digest: str) -> str | None:
        if digest not in blob_state:
            blob_state[digest] = cache.blobs.check(digest)
        return blob_state[digest]

    entries = cache.index.entries()
    for entry in entries:
        found = _entry_problems(entry, check)
        for what in found:
            problems.append(Problem(entry.key, entry.name, what))
        if found and entry.ok and quarantine and not cache.read_only:
            cache.index.quarantine(entry.key, "; ".join(found))
            quarantined.append(entry.key)
        # Reported, never quarantined: a wrong key must not condemn good entries (a
        # loader with the key refuses the bad ones anyway).
        unsigned = None if found else _signature_problem(cache, entry)
        if unsigned is not None:
            problems.append(Problem(entry.key, entry.name, unsigned))
    referenced = cache.index.referenced_digests()
    orphans = tuple(sorted(d for d in cache.blobs.digests() if d not in referenced))
    report = VerifyReport(len(entries), len(blob_state), tuple(problems), tuple(quarantined), orphans)
    log.info(
        "verify: %d entries, %d blobs, %d problems, %d orphan blobs",
        report.checked_entries, report.checked_blobs, len(problems), len(orphans),
    )
    return report


def _signature_problem(cache: Cache, entry: IndexEntry) -> str | None:
    if cache.signing_key is None and not cache.require_signatures:
        return None
    try:
        verify_signature(Manifest.from_json(entry.manifest), cache.signing_key, require=cache.require_signatures)
    except IntegrityError as exc:
        return f"signature: {exc}"
    return None


def _entry_problems(entry: IndexEntry, check: Any) -> list[str]:
    found: list[str] = []
    try:
        manifest = Manifest.from_json(entry.manifest)
    except AotError as exc:
        return [f"manifest: {exc}"]
    if manifest.key != entry.key:
        found.append(f"manifest is for key {manifest.key[:12]}, not this row")
    # gc keeps the blobs the index columns name: they must be the manifest's.
    for role, column in ((EXECUTABLE, entry.exe_digest), (PORTABLE_HLO, entry.hlo_digest)):
        ref = manifest.blobs.get(role)
        if (ref.digest if ref is not None else None) != column:
            found.append(
                f"the index row names {role} blob {str(column)[:12]} but the manifest names "
                f"{ref.digest[:12] if ref is not None else 'none'}"
            )
    for role, ref in sorted(manifest.blobs.items()):
        problem = check(ref.digest)
        if problem is not None:
            found.append(f"{role} blob {ref.digest[:12]}: {problem}")
    return found


# ---------------------------------------------------------------- gc

# Sizes and ages: aot.cache.units (re-exported here, where they used to live).


@dataclass(frozen=True, slots=True)
class GcVictim:
    key: str
    name: str
    signature: str
    stored_size: int
    last_used_at: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key, "name": self.name, "signature": self.signature,
            "stored_size": self.stored_size, "last_used_at": self.last_used_at,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class GcPlan:
    """What gc will delete (or deleted), and the bytes it frees."""

    entries: tuple[GcVictim, ...]
    blobs: tuple[str, ...]
    bytes_freed: int
    size_before: int
    dry_run: bool
    executed: bool = False

    @property
    def size_after(self) -> int:
        return self.size_before - self.bytes_freed

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "executed": self.executed,
            "entries": [v.to_dict() for v in self.entries],
            "blobs": list(self.blobs),
            "bytes_freed": self.bytes_freed,
            "size_before": self.size_before,
            "size_after": self.size_after,
        }


def plan_gc(
    cache: Cache, *, max_size: int | str | None = None, older_than: Any = None,
    superseded: bool = False, force: bool = False,
) -> GcPlan:
    """Quarantined entries, entries unused for ``older_than``, superseded entries (with
    ``superseded``: a newer intact entry has the same name, signature and environment),
    then least recently used entries until the cache fits ``max_size``; and every blob
    nothing references. ``force`` is for the refusal of an empty index beside stored
    blobs (a lost index file; issue 12), which it overrides."""
    limit = parse_size(max_size)
    age = parse_age(older_than)
    entries = cache.index.entries()
    now = utcnow()
    victims: dict[str, GcVictim] = {}

    def add(entry: IndexEntry, reason: str) -> None:
        victims.setdefault(
            entry.key,
            GcVictim(entry.key, entry.name, entry.signature, entry.stored_size,
                     entry.last_used_at.isoformat(timespec="seconds"), reason),
        )

    newer = superseded_keys(entries) if superseded else {}
    for entry in entries:
        if not entry.ok:
            add(entry, f"quarantined: {entry.state_reason or ''}".strip())
        elif age is not None and now - entry.last_used_at > age:
            add(entry, f"unused for more than {older_than}")
        elif entry.key in newer:
            add(entry, f"superseded by {newer[entry.key][:12]}")
    blob_sizes = {row.digest: row.stored_size for row in cache.index.blob_rows()}
    stored_digests = set(cache.blobs.digests())
    size_before = sum(cache.blobs.stored_size(d) or 0 for d in stored_digests)
    survivors = [e for e in entries if e.key not in victims]
    if limit is not None:
        lru = sorted(survivors, key=lambda e: (e.last_used_at, e.created_at))
        # Reference counts keep eviction linear in the entries (re-summing every
        # survivor after each eviction was quadratic: too slow for a large cache).
        refs: dict[str, int] = {}
        for e in lru:
            for d in _digests(e):
                refs[d] = refs.get(d, 0) + 1
        live = sum(blob_sizes.get(d, 0) for d in refs)
        evicted = 0
        while evicted < len(lru) and live > limit:
            victim = lru[evicted]
            add(victim, f"least recently used; cache over {human_size(limit)}")
            for d in _digests(victim):
                refs[d] -= 1
                if refs[d] == 0:
                    live -= blob_sizes.get(d, 0)
            evicted += 1
        survivors = lru[evicted:]
    keep: set[str] = set()
    for entry in survivors:
        keep |= _digests(entry)  # no executable digest for a symbolic entry
    # Programs rows keep their HLO only while an artifact of the program survives.
    # A blob no row references may belong to a writer that has not committed its row
    # yet: such orphans are collected only once older than ORPHAN_GRACE.
    referenced = cache.index.referenced_digests()
    young = _young_blobs(cache, stored_digests - referenced)
    dead_blobs = tuple(sorted(
        d for d in stored_digests
        if d not in keep and (d in referenced or d not in young)
    ))
    freed = sum(cache.blobs.stored_size(d) or 0 for d in dead_blobs)
    return GcPlan(tuple(victims.values()), dead_blobs, freed, size_before, dry_run=True)


ORPHAN_GRACE_SECONDS = 600.0


def _young_blobs(cache: Cache, digests: set[str]) -> set[str]:
    """The blobs among ``digests`` written less than ORPHAN_GRACE_SECONDS ago: file
    mtime for a folder store, ``blobs_data.created_at`` for a database store."""
    if not digests:
        return set()
    path_for = getattr(cache.blobs, "path_for", None)
    if path_for is not None:
        young = set()
        now = time.time()
        for digest in digests:
            try:
                if now - path_for(digest).stat().st_mtime < ORPHAN_GRACE_SECONDS:
                    young.add(digest)
            except OSError:
                pass
        return young
    engine = getattr(cache.blobs, "engine", None)
    if engine is not None:
        import sqlalchemy as sa

        from aot.cache.index import BlobDataRow

        t = BlobDataRow.__table__
        cutoff = utcnow() - _dt.timedelta(seconds=ORPHAN_GRACE_SECONDS)
        with engine.connect() as conn:
            recent = set(conn.execute(sa.select(t.c.digest).where(t.c.created_at > cutoff)).scalars())
        return recent & digests
    return set()  # in-memory store: one process, no writer in flight


def _digests(entry: IndexEntry) -> set[str]:
    return {entry.exe_digest, entry.hlo_digest} - {None}  # type: ignore[return-value]


def collect_garbage(
    cache: Cache, *, max_size: int | str | None = None, older_than: Any = None,
    dry_run: bool = False, superseded: bool = False, force: bool = False,
) -> GcPlan:
    """Plans, then (unless ``dry_run``) deletes index rows first and blobs after, so a
    crash in between leaves only orphan blobs, which the next gc removes."""
    plan = plan_gc(
        cache, max_size=max_size, older_than=older_than, superseded=superseded, force=force
    )
    if dry_run:
        return plan
    cache._check_writable("collect garbage")
    cache.index.delete([v.key for v in plan.entries])
    # Re-read what is referenced now: a writer may have added an entry meanwhile.
    referenced = cache.index.referenced_digests()
    freed = 0
    removed: list[str] = []
    for digest in plan.blobs:
        if digest in referenced:
            continue
        freed += cache.blobs.delete(digest)
        removed.append(digest)
    cache.index.delete_blob_rows(removed)
    remove_temp_files = getattr(cache.blobs, "remove_stale_temp_files", None)
    if remove_temp_files is not None:
        # Temp files of writers killed mid-write (never blobs); younger ones may
        # belong to a write in progress.
        freed += remove_temp_files(older_than_seconds=ORPHAN_GRACE_SECONDS)
    log.info("gc: removed %d entries and %d blobs, freed %s", len(plan.entries), len(removed), human_size(freed))
    return GcPlan(plan.entries, tuple(removed), freed, plan.size_before, dry_run=False, executed=True)
