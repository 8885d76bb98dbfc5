"""verify and gc: integrity checks and plan-then-execute garbage collection.

Both talk only to the index and to the cache's :class:`~aot.cache.storage.content.ContentStore`
(whatever object store is under it). gc's deletions follow the protocol in
docs/reliability.md: a blob is deleted only inside the index's deletion lock, after
re-checking there that no row references it and no live lease claims it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aot.artifact import CONSTANTS, EXECUTABLE, PORTABLE_HLO, Artifact, Manifest
from aot.device import accelerator_runtime, default_devices, device_holder
from aot.errors import AotError, CacheError, DeviceUnavailableError, IntegrityError, UsageError
from aot.jaxcompat.runtime import backend_started
from aot.signing import check_identity, verify as verify_signature
from aot.cache.admin.jit_entries import verify_jit_entries
from aot.cache.admin.manifest_blobs import manifest_blob_notes
from aot.cache.index.description import blobs_as_recorded
from aot.cache.index.entry import GcRow, IndexEntry, collector_paused, referenced_digests
from aot.cache.index.protocol import IndexReader
from aot.cache.index.jit_records import AOT, JIT, JitEntry
from aot.cache.index.served import ref_map, superseded_keys
from aot.cache.admin.gc_selection import kept_by_rows, release_environments, retire_reason, stale_signatures
from aot.cache.storage.content import PROBLEM_MISSING
from aot.cache.storage.objectstore import BlobStat
from aot.cache.pauses import reached
from aot.signatures import Signature
from aot.cache.units import counted, human_size, parse_age, parse_size  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from aot.fingerprint import Fingerprint
    from aot.cache.store import ArtifactStore

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
    #: Problems of the cache as a whole (e.g. an empty index beside stored blobs).
    cache_problems: tuple[str, ...] = ()
    #: Keys of KIND jit rows deleted (a damaged jit entry is removed, not quarantined:
    #: JAX compiles it again on its next miss).
    removed: tuple[str, ...] = ()
    #: Information, not problems: rows whose manifest blob is not stored (stored before
    #: schema 10), so that `aot repair` could not rebuild them.
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems and not self.orphan_blobs and not self.cache_problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked_entries": self.checked_entries,
            "checked_blobs": self.checked_blobs,
            "problems": [p.to_dict() for p in self.problems],
            "quarantined": list(self.quarantined),
            "removed": list(self.removed),
            "orphan_blobs": list(self.orphan_blobs),
            "cache_problems": list(self.cache_problems),
            "notes": list(self.notes),
        }


def empty_index_problem(
    cache: ArtifactStore, digests: Iterable[str] | None = None, reads: IndexReader | None = None,
) -> str | None:
    """A message when the index has no row but the blob store holds blobs (``digests``,
    listed if not given) that no writer has leased: the index was lost, truncated or
    replaced, and gc would otherwise delete every blob. None for an index that its own
    deletions emptied (gc's evictions, ``aot rm``; a gc that lost a race to another):
    the index records that in the deleting transaction, and the next row clears it.
    ``reads``: the index's reads (default: the SQL index; gc's plan: the cache's reader)."""
    index = cache.index if reads is None else reads
    empty, emptied = index.emptiness()  # one snapshot: writers and gc run meanwhile
    if not empty:
        return None
    if emptied is not None:
        log.debug("the index is empty since its own deletion at %s", emptied)
        return None
    found = set(digests) if digests is not None else {s.digest for s in cache.blobs.list()}
    stored = len(found - index.leased_digests()) if found else 0
    if not stored:
        return None
    return (
        f"the index at {index.url} is empty, but the blob store at "
        f"{cache.blobs.location} holds {counted(stored, 'blob')}: the index was lost, truncated or "
        "replaced. Restore it from a backup, or rebuild it (`aot bundle import`, or "
        "`aot warmup` again: stored blobs are reused). `aot gc` refuses to delete blobs "
        "in this state unless given --force"
    )


def verify_cache(cache: ArtifactStore, *, quarantine: bool = True) -> VerifyReport:
    """Re-hashes every blob, parses every manifest, reports and quarantines bad entries."""
    problems: list[Problem] = []
    quarantined: list[str] = []
    blob_state: dict[tuple[str, int], str | None] = {}

    def check(digest: str, size: int) -> str | None:
        # Against the size the manifest declares: a blob inflating past it is corrupt.
        if (digest, size) not in blob_state:
            blob_state[(digest, size)] = cache.blobs.check(digest, size)
        return blob_state[(digest, size)]

    entries = cache.index.entries()
    misconfigured = missing_blobs_problem(cache, entries, check)
    if misconfigured is not None:  # change nothing: a wrong location or a lost store
        log.warning("verify: %s", misconfigured)
        listed = tuple(
            Problem(entry.key, entry.name, what)
            for entry in entries if entry.ok for what in _entry_problems(entry, check)
        )
        return VerifyReport(len(entries), len({d for d, _ in blob_state}), listed, (), (), (misconfigured,))
    here: list[Any] = []  # this host's environment for the cross-checks, found once
    for entry in entries:
        found = _entry_problems(entry, check)
        if not found:
            if not here:
                here.append(cross_check_environment(cache))
            found = consistency_problems(cache, entry, here[0])
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
    # KIND jit (aot.jax_cache): the blob and the HMAC; a damaged one's row is removed.
    jit_count, jit_problems, jit_removed = verify_jit_entries(cache, check, remove=quarantine)
    problems += [Problem(p.key, p.name, p.what) for p in jit_problems]
    referenced = cache.index.referenced_digests() | cache.index.leased_digests()
    stored = cache.blobs.digests()
    orphans = tuple(d for d in stored if d not in referenced)
    empty = empty_index_problem(cache, stored) if not entries and not jit_count else None
    report = VerifyReport(
        len(entries) + jit_count, len({d for d, _ in blob_state}), tuple(problems), tuple(quarantined), orphans,
        (empty,) if empty else (), tuple(jit_removed), tuple(manifest_blob_notes([e for e in entries if e.ok], check)),
    )
    log.info(
        "verify: %d entries, %d blobs, %d problems, %d orphan blobs",
        report.checked_entries, report.checked_blobs, len(problems), len(orphans),
    )
    return report


#: verify calls it a misconfiguration, not corruption, when more than this share of
#: the checked entries (and at least MISSING_AT_LEAST of them) have missing blobs.
MISSING_SHARE = 0.5
MISSING_AT_LEAST = 2


def missing_blobs_problem(cache: ArtifactStore, entries: Sequence[IndexEntry], check: Any) -> str | None:
    """A message when most intact rows' blobs are *missing* (not corrupt) at once, and
    quarantining would condemn every entry for every client. It tells a store that
    lost its blobs (the location in use is the one the index records: restore or
    recompile) from a likely wrong location (a ``--blobs`` other than the recorded
    one, or none recorded). None otherwise."""
    rows = [e for e in entries if e.ok]
    missing = 0
    for entry in rows:
        try:
            refs = Manifest.from_json(entry.manifest).blobs.values()
        except AotError:
            continue
        if any(check(ref.digest, ref.size) == PROBLEM_MISSING for ref in refs):
            missing += 1
    if missing < MISSING_AT_LEAST or missing <= MISSING_SHARE * len(rows):
        return None
    where = cache.blobs.location
    described = cache.index.description()
    if blobs_as_recorded(cache, described):
        held = len(cache.blobs.digests())
        state = "is empty" if not held else f"holds {counted(held, 'blob')} but not theirs"
        return (
            f"{missing} of {counted(len(rows), 'entry')} have no blobs at {where}, the blob "
            f"location the cache itself names, and that store {state}: its blobs were deleted or lost (not a "
            "wrong --blobs). The entries are listed; nothing was quarantined. Restore the "
            "blobs from a backup, or compile the entries again (aot warmup; stored rows are "
            "rewritten), then run verify again"
        )
    recorded = "records no blob location" if described is None else (
        f"records {described.blob_location}" if described.blob_location is not None
        else "records its blobs in its own database")
    return (
        f"{missing} of {counted(len(rows), 'entry')} have no blobs at {where}: is --blobs "
        f"right? the index {recorded}. Nothing was quarantined; run verify again with the "
        "blob location the cache was written with"
    )


def cross_check_environment(cache: ArtifactStore) -> Fingerprint | None:
    """The environment whose executables verify deserializes and cross-checks here:
    this host's, found without opening the device (:meth:`~aot.cache.store.ArtifactStore.known_environment`), or None
    (its executables are not deserialized) when it is unknown or another process holds
    the device: verifying integrity never needs the device."""
    current = cache.known_environment()
    if current is None:
        log.info("verify: this host's environment is unknown: executables are not deserialized here")
        return None
    if not backend_started() and accelerator_runtime() is not None:
        holder = device_holder()
        if holder is not None:
            log.warning(
                "verify: the device is held by %s: this environment's executables are not deserialized",
                holder.describe(),
            )
            return None
        try:  # once: the deserialization needs it; failing, no entry is blamed for it
            default_devices()
        except DeviceUnavailableError as exc:
            log.warning("verify: this environment's executables are not deserialized: %s", exc)
            return None
    return current


def consistency_problems(cache: ArtifactStore, entry: IndexEntry, current: Fingerprint | None) -> list[str]:
    """What a loader would refuse in the manifest of an entry whose blobs are intact:
    fields that contradict its fingerprints, its portable HLO, or (entries of
    ``current``, this host's environment: :func:`cross_check_environment`) its
    deserialized executable (aot.rehydrate.stored_artifact_problems)."""
    from aot.rehydrate import stored_artifact_problems

    try:
        manifest = Manifest.from_json(entry.manifest)
    except AotError as exc:
        return [f"manifest: {exc}"]
    local = current is not None and manifest.environment.digest == current.digest
    blobs: dict[str, bytes] = {}
    for role in (PORTABLE_HLO, EXECUTABLE) if local else (PORTABLE_HLO,):
        ref = manifest.blobs.get(role)
        if ref is None:
            continue
        data = cache.blobs.get(ref.digest, ref.size)
        if data is not None:
            blobs[ref.digest] = data
    try:
        found = stored_artifact_problems(Artifact(manifest, blobs), current if local else manifest.environment)
    except DeviceUnavailableError as exc:  # this process's, not the entry's: never quarantined
        log.warning("verify: %s (%s): executable not deserialized: %s", entry.name, entry.key[:12], exc)
        return []
    except AotError as exc:  # a field too malformed to compare: that is the problem
        found = [str(exc)]
    return [f"manifest: {p}" for p in found]


def _signature_problem(cache: ArtifactStore, entry: IndexEntry) -> str | None:
    if cache.signing_key is None and not cache.require_signatures:
        return None
    try:
        manifest = Manifest.from_json(entry.manifest)
        verify_signature(manifest, cache.signing_key, require=cache.require_signatures)
        check_identity(manifest, key=entry.key, name=entry.name, signature=entry.signature,
                       program_fp=entry.program_fp, env_fp=entry.env_fp)
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
    for role, column in ((EXECUTABLE, entry.exe_digest), (PORTABLE_HLO, entry.hlo_digest), (CONSTANTS, entry.const_digest)):
        ref = manifest.blobs.get(role)
        if (ref.digest if ref is not None else None) != column:
            found.append(
                f"the index row names {role} blob {str(column)[:12]} but the manifest names "
                f"{ref.digest[:12] if ref is not None else 'none'}"
            )
    for role, ref in sorted(manifest.blobs.items()):
        problem = check(ref.digest, ref.size)
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
    kind: str = AOT  # or JIT: an entry of JAX's persistent cache (aot.jax_cache)
    program_fp: str = field(default="", repr=False)
    #: Names its arguments from the manifest when first asked (None: flat signature).
    names: ArgumentNames | None = field(default=None, repr=False, compare=False)

    @property
    def arguments(self) -> Signature:
        """Its arguments by name (from its program's manifest); empty for a jit entry."""
        if self.names is None:
            return Signature(())
        return self.names.of((self.name, self.signature, self.program_fp))

    @classmethod
    def of_jit(cls, entry: JitEntry, reason: str) -> GcVictim:
        return cls(entry.key, entry.name, "", entry.stored_size,
                   entry.last_used_at.isoformat(timespec="seconds"), reason, kind=JIT)

    def describe(self, width: int | None = None) -> str:
        """``name (params: [...], x: f32[8,784])``, as ``ls`` and ``rm`` show it;
        ``name (jit)`` for a jit entry."""
        if self.kind == JIT:
            return f"{self.name} (jit)"
        arguments = self.arguments if self.arguments.leaves else Signature.flat(self.signature)
        return f"{self.name} ({arguments.compact(width)})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "key": self.key, "name": self.name, "signature": self.signature,
            "arguments": self.arguments.to_list(),
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
    #: Why gc will not (or did not) delete blobs without force (an empty index).
    warnings: tuple[str, ...] = ()
    #: Entries gc would have collected but a ref or a live release pins (key -> why).
    pinned: tuple[GcVictim, ...] = ()
    #: Refs dropped (``gc --manifest``): (name, signature) no longer in the manifest.
    dropped_refs: tuple[tuple[str, str], ...] = ()
    #: ``gc --jax-release``: the release retired and its environments (digests), whose
    #: refs and release members are dropped with their entries.
    jax_release: str | None = None
    retired_environments: tuple[str, ...] = ()
    #: The victims' rows as planned (key -> state, last use): a row used, healed or
    #: replaced after the plan is not deleted.
    _rows: dict[str, tuple[str, _dt.datetime]] = field(default_factory=dict, repr=False, compare=False)
    #: The jit victims' last use as planned (key -> last_used_at): one hit or stored
    #: again since the plan is not deleted.
    _jit_rows: dict[str, _dt.datetime] = field(default_factory=dict, repr=False, compare=False)

    @property
    def size_after(self) -> int:
        return self.size_before - self.bytes_freed

    def name_arguments(self) -> None:
        """Reads the victims' argument names now (they are read when first asked),
        while their rows and manifests are still in the index."""
        for victim in itertools.chain(self.entries, self.pinned):
            if victim.names is not None:  # one reader for the whole plan
                victim.names.all()
                return

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "executed": self.executed,
            "entries": [v.to_dict() for v in self.entries],
            "blobs": list(self.blobs),
            "bytes_freed": self.bytes_freed,
            "size_before": self.size_before,
            "size_after": self.size_after,
            "warnings": list(self.warnings),
            "pinned": [v.to_dict() for v in self.pinned],
            "dropped_refs": [{"name": n, "signature": sig} for n, sig in self.dropped_refs],
            "jax_release": self.jax_release,
            "retired_environments": list(self.retired_environments),
        }


#: An unreferenced blob younger than this (by its store's clock) is left alone. Not
#: needed for correctness (writers lease their blobs) but spares blobs someone is
#: copying in by hand, or an older writer's.
ORPHAN_GRACE_SECONDS = 600.0

#: Blobs deleted per deletion-lock transaction: writers wait for the lock meanwhile,
#: so a batch stays short (benchmarks/bench_gc.py measures how long one holds it).
GC_BATCH = 64

#: Between batches gc leaves the lock free for as long as it held it (at most this),
#: so that writers get their turn: SQLite's busy handler polls with growing sleeps
#: and would otherwise miss the short gaps between gc's transactions.
GC_YIELD_MAX_SECONDS = 0.1


#: How to unpin an entry gc keeps (shown with the pinned entries).
UNPIN_ADVICE = (
    "a newer `aot warmup` moves a ref (then the old entry is superseded); `aot gc --manifest M` "
    "drops the refs of signatures M no longer lists; a release set stays pinned while it is "
    "its label's current or rollback target: `aot release rm LABEL` retires a label"
)

#: What ``gc --kind`` selects from: entries compiled through jax-aot (``aot``), entries of
#: JAX's persistent cache stored through :mod:`aot.cache.jax_cache` (``jit``), or both.
GC_KINDS = ("all", AOT, JIT)


def _kinds(kind: str) -> frozenset[str]:
    if kind not in GC_KINDS:
        raise UsageError(
            f"gc kind must be one of {', '.join(GC_KINDS)}, not {kind!r}: 'aot' for entries compiled "
            "through jax-aot, 'jit' for entries of JAX's cache (aot.jax_cache), 'all' for both"
        )
    return frozenset((AOT, JIT)) if kind == "all" else frozenset((kind,))


def plan_gc(
    cache: ArtifactStore, *, max_size: int | str | None = None, older_than: Any = None,
    superseded: bool = False, force: bool = False, unpinned: frozenset[tuple[str, str]] = frozenset(),
    kind: str = "all", reads: IndexReader | None = None, jax_release: str | None = None,
) -> GcPlan:
    """Quarantined entries, entries unused for ``older_than``, superseded entries (with
    ``superseded``: a newer intact entry has the same name, signature and environment),
    then least recently used entries until the cache fits ``max_size``; and every blob
    nothing references (unreferenced ones only once older than
    :data:`ORPHAN_GRACE_SECONDS`).

    Times come from the clocks that stamped them: entries' last use from the
    database server's, blobs' ages from their store's. A blob whose age cannot be
    told is reported by its store as new: too young to delete. ``force`` overrides
    the refusal to delete blobs beside an empty index (a lost index file).

    KIND jit entries (:mod:`aot.cache.jax_cache`) are selected by ``older_than`` and
    evicted by ``max_size`` in the same least-recently-used order as aot entries (their
    last use: when stored, or last hit). ``kind`` (``aot``, ``jit``, ``all``) narrows
    which entries may be selected; every entry's blobs count in the size either way.

    ``jax_release`` retires a JAX release: every entry of it (:mod:`aot.cache.admin.retire`),
    pinned or not; the refs and release members that pin them are dropped first.

    ``reads``: the index's reads to plan with (default the cache's reader: a folder
    cache's through the standard library, without importing SQLAlchemy).
    """
    with collector_paused():  # a million rows: see aot.cache.index.entry
        return _plan_gc(cache, cache.reader if reads is None else reads, max_size=max_size,
                        older_than=older_than, superseded=superseded, force=force, unpinned=unpinned, kind=kind,
                        jax_release=jax_release)


#: Above this many unkept blobs, gc reads every referenced digest in one scan rather
#: than looking the unkept ones up through the digest indexes.
REFERENCED_LOOKUP_MAX = 20_000


def _plan_gc(
    cache: ArtifactStore, reads: IndexReader, *, max_size: int | str | None, older_than: Any, superseded: bool, force: bool,
    unpinned: frozenset[tuple[str, str]], kind: str, jax_release: str | None = None,
) -> GcPlan:
    limit = parse_size(max_size)
    age = parse_age(older_than)
    kinds = _kinds(kind)
    # Manifests only where the plan needs them: superseded groups by the input tree;
    # otherwise gc's slim rows, and only the victims' manifests are read, to name their
    # arguments (at the end).
    entries: Sequence[_Row] = reads.entries() if superseded or jax_release else reads.gc_rows()
    jit_entries = reads.jit_entries()
    now = reads.now()
    victims: dict[str, GcVictim] = {}
    as_planned: dict[str, tuple[str, _dt.datetime]] = {}

    newer = superseded_keys(entries, ref_map(reads.refs())) if superseded else {}  # type: ignore[arg-type]
    pins = reads.pinned_keys()
    for ref in reads.refs():
        if (ref.name, ref.signature) in unpinned and pins.get(ref.key, "").startswith("served ref"):
            pins.pop(ref.key)  # its ref is dropped first (a dry run assumes so)
    dropped_names = {name for name, _ in unpinned}
    retired = release_environments(entries, jax_release) if jax_release and AOT in kinds else frozenset()  # type: ignore[arg-type]
    unpins = reads.pin_reasons() if retired else {}

    chosen: dict[str, tuple[_Row, str]] = {}  # key -> (entry, reason): victims
    kept: dict[str, tuple[_Row, str]] = {}  # key -> (entry, why): pinned

    def add(entry: _Row, reason: str) -> None:
        key = entry.key
        if key in pins and entry.state == "ok":  # a quarantined entry is proven corrupt: never kept
            kept.setdefault(key, (entry, f"pinned: {pins[key]} ({reason})"))
            return
        if key not in victims:
            victims[key] = _PENDING
            chosen[key] = (entry, reason)
            as_planned[key] = (entry.state, entry.last_used_at)

    jit_planned: dict[str, _dt.datetime] = {}

    def add_jit(entry: JitEntry, reason: str) -> None:
        if entry.key not in jit_planned:
            victims[entry.key] = GcVictim.of_jit(entry, reason)
            jit_planned[entry.key] = entry.last_used_at

    for jit in jit_entries if JIT in kinds else ():
        if age is not None and now - jit.last_used_at > age:
            add_jit(jit, f"unused for more than {older_than}")
    unused = f"unused for more than {older_than}"
    cutoff = _cutoff(now, age)
    for entry in entries if AOT in kinds else ():
        ok = entry.state == "ok"
        if ok and entry.name in dropped_names and (entry.name, entry.signature) in unpinned:
            add(entry, "signature no longer in the manifest")
        if retired and entry.env_fp in retired:  # type: ignore[union-attr]
            pins.pop(entry.key, None)  # its refs and release members are dropped first
            add(entry, retire_reason(jax_release or "", unpins.get(entry.key, ())))
        elif not ok:
            add(entry, f"quarantined: {entry.state_reason or ''}".strip())
        elif cutoff is not None and entry.last_used_at < cutoff:
            add(entry, unused)
        elif entry.key in newer:
            add(entry, f"superseded by {newer[entry.key][:12]}")
    stored: dict[str, BlobStat] = {s.digest: s for s in cache.blobs.list()}
    store_now = cache.blobs.now()
    size_before = sum(s.stored_size for s in stored.values())
    blob_sizes = {d: s.stored_size for d, s in stored.items()}
    survivors: list[_Row | JitEntry] = [e for e in itertools.chain(entries, jit_entries) if e.key not in victims]
    if limit is not None:
        # One least-recently-used order for both kinds (both stamped by the index's clock).
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
            reason = f"least recently used; cache over {human_size(limit)}"
            if isinstance(victim, JitEntry):
                if JIT not in kinds:
                    evicted += 1
                    continue
                add_jit(victim, reason)
            elif AOT not in kinds:
                evicted += 1
                continue
            else:
                add(victim, reason)
            if victim.key in pins:
                evicted += 1
                continue
            for d in _digests(victim):
                refs[d] -= 1
                if refs[d] == 0:
                    live -= blob_sizes.get(d, 0)
            evicted += 1
        survivors = [e for e in lru if e.key not in victims]
    keep: set[str] = {  # no executable digest for a symbolic entry
        d for e in survivors if not isinstance(e, JitEntry) for d in referenced_digests(e)
    }
    keep.update(e.digest for e in survivors if isinstance(e, JitEntry))
    unkept = [d for d in stored if d not in keep]
    referenced = (
        reads.referenced_among(unkept) if len(unkept) <= REFERENCED_LOOKUP_MAX
        else reads.referenced_digests()
    )
    # A blob referenced by a row the run keeps is kept, as the run's deletion lock will
    # find (the plan equals its run): a programs row of a program an entry of which
    # survives (its HLO may be an older release's export, which a retired entry had), and
    # a row of any table gc never deletes (a journaled release set or captured GPU).
    alive = {e.program_fp for e in survivors if not isinstance(e, JitEntry)}
    keep |= kept_by_rows(reads, [d for d in unkept if d in referenced], alive, victims)
    keep |= reads.leased_digests()
    grace = _dt.timedelta(seconds=ORPHAN_GRACE_SECONDS)

    def old(stat: BlobStat) -> bool:
        return store_now - stat.modified >= grace  # a future stamp is young

    dead_blobs = tuple(sorted(
        d for d, stat in stored.items()
        if d not in keep and (d in referenced or old(stat))
    ))
    warnings: tuple[str, ...] = ()
    if not entries and stored and not force:
        problem = empty_index_problem(cache, stored, reads)
        if problem is not None:
            warnings = (problem,)
            dead_blobs = ()
    freed = sum(stored[d].stored_size for d in dead_blobs)
    names = ArgumentNames(reads, [e for e, _ in (*chosen.values(), *kept.values())])
    victims.update((key, _victim(entry, reason, names)) for key, (entry, reason) in chosen.items())
    pinned = [_victim(entry, why, names) for entry, why in kept.values()]
    return GcPlan(
        tuple(victims.values()), dead_blobs, freed, size_before, dry_run=True, warnings=warnings,
        pinned=tuple(pinned), jax_release=jax_release, retired_environments=tuple(sorted(retired)),
        _rows=as_planned, _jit_rows=jit_planned,
    )


def _cutoff(now: _dt.datetime, age: _dt.timedelta | None) -> _dt.datetime | None:
    """The last use before which an entry is unused for more than ``age``: ``now - last
    > age`` exactly when ``last < now - age`` (whole microseconds), one subtraction
    instead of one per row. None: no age, or one reaching before year 1 (nothing is)."""
    if age is None:
        return None
    try:
        return now - age
    except OverflowError:
        return None


#: A victim's place in the plan's order until its arguments are named.
_PENDING: Any = None
_Program = tuple[str, str, str]  # (name, flat signature, program fingerprint)
#: A row as gc plans with it: gc's slim row, or the whole entry (``--superseded``).
_Row = IndexEntry | GcRow


def _program(entry: _Row) -> _Program:
    return (entry.name, entry.signature, entry.program_fp)


def _arguments_of(reads: IndexReader, entries: Sequence[_Row]) -> dict[_Program, Signature]:
    """The arguments by name of each program among ``entries``, from one manifest per
    program (its environments' entries name the same arguments): a plan of half a
    million victims parses tens of thousands of manifests, not half a million."""
    first: dict[_Program, _Row] = {}
    for entry in entries:
        first.setdefault(_program(entry), entry)
    missing = [e.key for e in first.values() if not getattr(e, "manifest", "")]
    texts = reads.manifests(missing) if missing else {}
    return {
        program: Signature.from_manifest_json(getattr(entry, "manifest", "") or texts.get(entry.key, ""), entry.signature)
        for program, entry in first.items()
    }


class ArgumentNames:
    """The arguments by name of a plan's victims, read when first asked, for all of them
    at once (:func:`_arguments_of`): a plan of half a million victims names a hundred
    thousand programs from their manifests, seconds that a caller who only counts the
    plan or reads its keys does not wait for. Read (through the plan's reads) while the
    cache is open; an executed gc names them before it deletes rows
    (:meth:`GcPlan.name_arguments`)."""

    __slots__ = ("_reads", "_entries", "_found", "_lock")

    def __init__(self, reads: IndexReader, entries: Sequence[_Row]) -> None:
        self._reads: IndexReader | None = reads
        self._entries = entries
        self._found: dict[_Program, Signature] | None = None
        self._lock = threading.Lock()

    def of(self, program: _Program) -> Signature:
        return self.all()[program]

    def all(self) -> dict[_Program, Signature]:
        with self._lock:
            if self._found is None:
                assert self._reads is not None
                self._found = _arguments_of(self._reads, self._entries)
                self._reads, self._entries = None, ()
            return self._found


def _victim(entry: _Row, reason: str, names: ArgumentNames) -> GcVictim:
    return GcVictim(
        entry.key, entry.name, entry.signature, entry.stored_size,
        entry.last_used_at.isoformat(timespec="seconds"), reason, AOT, entry.program_fp, names,
    )


def _digests(entry: _Row | JitEntry) -> set[str]:
    if isinstance(entry, JitEntry):
        return {entry.digest}
    return referenced_digests(entry)


def delete_unreferenced_blobs(cache: ArtifactStore, digests: Sequence[str]) -> tuple[list[str], int]:
    """Deletes those of ``digests`` that no row references and no writer leases, in
    batches, each re-checked and deleted inside the index's deletion lock (the gc
    protocol of docs/reliability.md); the digests removed and the stored bytes freed.
    Between batches it pauses as long as the last batch held the lock, so writers
    waiting on it get their turn."""
    freed = 0
    held = 0.0
    removed: list[str] = []
    for i in range(0, len(digests), GC_BATCH):
        if i:
            time.sleep(min(held, GC_YIELD_MAX_SECONDS))
        start = time.monotonic()
        with cache.index.deletion_lock() as batch:
            doomed = batch.deletable(digests[i : i + GC_BATCH])
            reached("gc.locked")
            freed += cache.blobs.delete(doomed)
            reached("gc.deleted")
            batch.forget(doomed)
        held = time.monotonic() - start
        removed.extend(doomed)
    return removed, freed


def collect_garbage(
    cache: ArtifactStore, *, max_size: int | str | None = None, older_than: Any = None,
    dry_run: bool = False, superseded: bool = False, force: bool = False,
    manifest: str | os.PathLike[str] | None = None, kind: str = "all", jax_release: str | None = None,
) -> GcPlan:
    """Plans, then (unless ``dry_run``) deletes index rows first and blobs after.

    Blobs go in batches, each inside the index's deletion lock, and only those that
    are still unreferenced and unleased there (a writer may have stored an evicted
    entry again since the plan). A crash at any point leaves at most orphan blobs,
    which the next gc removes. With an empty index beside stored blobs, gc refuses
    (``CacheError``) unless ``force``.

    The plan reads through the cache's reader (a folder cache: the standard library);
    the SQL index is opened only to delete rows, blobs or refs: a dry run, a gc with
    nothing to delete, and one that only drops expired leases (through the standard
    library's reader, under the same lock and statement) never import SQLAlchemy there.
    """
    reads = cache.reader
    stale = stale_signatures(cache, manifest, reads) if manifest is not None else frozenset()
    options = dict(max_size=max_size, older_than=older_than, superseded=superseded, force=force, kind=kind,
                   jax_release=jax_release)
    plan = plan_gc(cache, unpinned=stale, reads=reads, **options)  # type: ignore[arg-type]
    if dry_run:
        return dataclasses.replace(plan, dropped_refs=tuple(sorted(stale)))
    cache.check_writable("collect garbage")
    leases_only = not stale and not plan.retired_environments and not plan.warnings and not plan.entries and not plan.blobs
    if leases_only and not reads.has_expired_leases():
        log.info("gc: removed 0 entries and 0 blobs, freed %s", human_size(0))  # nothing to delete
        return GcPlan((), (), 0, plan.size_before, dry_run=False, executed=True, pinned=plan.pinned)
    if stale:
        slots = [r.slot for r in cache.index.refs() if (r.name, r.signature) in stale]
        cache.index.drop_refs(slots)
        log.info("gc: dropped %d refs of signatures no longer in %s", len(slots), manifest)
        plan = plan_gc(cache, unpinned=stale, reads=reads, **options)  # type: ignore[arg-type]
    if plan.retired_environments:  # a retired release serves no host: nothing may pin its entries
        refs, members = cache.index.retire_environments(plan.retired_environments)
        log.info("gc: JAX %s retired: dropped %d refs and %d release members", jax_release, refs, members)
    if plan.warnings:
        raise CacheError(f"gc refused: {plan.warnings[0]}")
    plan.name_arguments()  # before their rows go
    reached("gc.planned")
    deleted: set[str] = set()
    if not leases_only:
        deleted.update(cache.index.delete_unchanged(plan._rows))
        deleted.update(cache.index.jit_delete_unchanged(plan._jit_rows))
    evicted = tuple(v for v in plan.entries if v.key in deleted)
    if len(evicted) < len(plan.entries):
        log.info("gc: kept %d entries used, healed or stored again since the plan", len(plan.entries) - len(evicted))
    reached("gc.rows_deleted")
    removed, freed = delete_unreferenced_blobs(cache, plan.blobs)
    dropped = (reads if leases_only else cache.index).drop_expired_leases()
    if dropped:
        log.info("gc: dropped %d expired leases of writers that died", dropped)
    reached("gc.done")
    log.info("gc: removed %d entries and %d blobs, freed %s", len(evicted), len(removed), human_size(freed))
    return GcPlan(evicted, tuple(removed), freed, plan.size_before, dry_run=False, executed=True,
                  pinned=plan.pinned, dropped_refs=tuple(sorted(stale)), jax_release=jax_release,
                  retired_environments=plan.retired_environments)
