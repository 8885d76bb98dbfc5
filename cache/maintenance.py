"""verify and gc: integrity checks and plan-then-execute garbage collection."""

from __future__ import annotations

import datetime as _dt
import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.artifact import EXECUTABLE, PORTABLE_HLO, Artifact, Manifest
from aot.errors import AotError, CacheError, IntegrityError
from aot.signing import verify as verify_signature
from aot.cache.index import IndexEntry, utcnow

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
        if not found:
            found = _consistency_problems(cache, entry)
        for what in found:
            problems.append(Problem(entry.key, entry.name, what))
        # Only while the row is still the one checked (a writer may have rewritten it).
        if found and entry.ok and quarantine and not cache.read_only:
            if cache.index.quarantine(entry.key, "; ".join(found), expect=entry):
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


def _consistency_problems(cache: Cache, entry: IndexEntry) -> list[str]:
    """What a loader would refuse in the manifest of an entry whose blobs are intact:
    fields that contradict its fingerprints, its portable HLO, or (entries of this
    environment) its deserialized executable (aot.rehydrate.stored_artifact_problems)."""
    from aot.rehydrate import stored_artifact_problems

    try:
        manifest = Manifest.from_json(entry.manifest)
    except AotError as exc:
        return [f"manifest: {exc}"]
    local = manifest.environment.digest == cache.environment.digest
    blobs: dict[str, bytes] = {}
    for role in (PORTABLE_HLO, EXECUTABLE) if local else (PORTABLE_HLO,):
        ref = manifest.blobs.get(role)
        data = cache.blobs.get(ref.digest) if ref is not None else None
        if data is not None:
            blobs[ref.digest] = data
    try:
        found = stored_artifact_problems(Artifact(manifest, blobs), cache.environment)
    except AotError as exc:  # a field too malformed to compare: that is the problem
        found = [str(exc)]
    return [f"manifest: {p}" for p in found]


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

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)
_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(value: int | str | None) -> int | None:
    """``"10G"`` -> bytes (binary units); ints pass through."""
    if value is None or isinstance(value, int):
        return value
    match = _SIZE_RE.match(value)
    if match is None:
        raise CacheError(f"cannot read size {value!r}; expected e.g. 500M, 10G or a byte count")
    number, unit, _ = match.groups()
    return int(float(number) * _SIZE_UNITS[unit.upper()])


def parse_age(value: _dt.timedelta | str | None) -> _dt.timedelta | None:
    """``"30d"`` -> a timedelta (s, m, h, d, w)."""
    if value is None or isinstance(value, _dt.timedelta):
        return value
    match = _AGE_RE.match(value)
    if match is None:
        raise CacheError(f"cannot read age {value!r}; expected e.g. 12h, 30d or 2w")
    number, unit = match.groups()
    return _dt.timedelta(seconds=float(number) * _AGE_UNITS[unit.lower()])


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


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
) -> GcPlan:
    """Quarantined entries, entries unused for ``older_than``, then least recently used
    entries until the cache fits ``max_size``; and every blob nothing references."""
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

    for entry in entries:
        if not entry.ok:
            add(entry, f"quarantined: {entry.state_reason or ''}".strip())
        elif age is not None and now - entry.last_used_at > age:
            add(entry, f"unused for more than {older_than}")
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
        keep.add(entry.exe_digest)
        if entry.hlo_digest:
            keep.add(entry.hlo_digest)
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
    dry_run: bool = False,
) -> GcPlan:
    """Plans, then (unless ``dry_run``) deletes index rows first and blobs after, so a
    crash in between leaves only orphan blobs, which the next gc removes."""
    plan = plan_gc(cache, max_size=max_size, older_than=older_than)
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
