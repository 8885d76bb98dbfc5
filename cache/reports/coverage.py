"""``aot verify [--manifest M --strict]``: integrity plus manifest coverage, one value.

With ``--strict`` it also checks what the cache *declares* served: every current ref
and every member of each release label's current set must name an entry that is
stored and intact (:func:`find_dangling`); a dangling one is what a strict server
refuses.

Coverage asks, for every entry of a warm-up manifest, whether an intact artifact with
its name and input signature is stored for the environment it is compiled for (its
device target's, ``tpu:v5e:1x1``, computed without the device; else *this* host's),
and when not, why: nothing of that name is stored, other signatures are, it is
quarantined, or it is stored for another environment (``device_count 8 != 1``: the
stored value first). Stale entries are found the same way, per item's environment.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.cache.units import counted
from aot.cache.rows import environment_statuses
from aot.signatures import Signature
from aot.cache.warmup.coverage import find_uncovered, target_environments
from aot.cache.warmup.functions import x64_mode
from aot.cache.warmup.manifest import WarmupItem, expand, load_manifest

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore
    from aot.cache.index.entry import IndexEntry
    from aot.fingerprint import Fingerprint
    from aot.cache.admin.maintenance import VerifyReport

__all__ = [
    "CheckReport", "CoverageReport", "DanglingItem", "MissingItem", "StaleItem", "check_coverage",
    "find_dangling", "find_stale", "verify_with_coverage",
]


@dataclass(frozen=True, slots=True)
class MissingItem:
    """A manifest entry with no intact artifact for its environment, and why (its
    label names its device target: ``tiny@tpu:v5e:1x1``)."""

    item: WarmupItem
    reason: str
    env: str = ""  # the digest of the environment it was looked up for

    def describe(self) -> str:
        where = f" ({self.item.source})" if self.item.source else ""
        return f"{self.item.label}{where}: {self.item.describe_args()}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {**self.item.to_dict(), "environment": self.env,
                "reason": self.reason}


@dataclass(frozen=True, slots=True)
class StaleItem:
    """A manifest entry whose lowered program is not the one served for it."""

    item: WarmupItem
    shown: str  # its signature, by argument name
    served: str  # the key served (its ref, else the legacy newest entry)
    lowered: str  # the key the current code lowers to
    parts: tuple[str, ...]  # the program fingerprint's parts that differ
    env: str = ""  # the digest of the environment it was looked up for (its target's or this host's)

    def describe(self) -> str:
        parts = ", ".join(self.parts) or "key"
        verb = "differs" if len(self.parts) <= 1 else "differ"
        return (f"stale: {self.item.label} ({self.shown}): the code changed since it was compiled "
                f"(part{'s' if len(self.parts) > 1 else ''} {parts} {verb}); run aot warmup")

    def to_dict(self) -> dict[str, Any]:
        return {**self.item.to_dict(), "environment": self.env,
                "served": self.served, "lowered": self.lowered, "parts": list(self.parts)}


@dataclass(frozen=True, slots=True)
class CoverageReport:
    manifest: str
    strict: bool
    items: int
    missing: tuple[MissingItem, ...]
    stale: tuple[StaleItem, ...] = ()
    lower_seconds: float | None = None  # what lowering every entry cost (None: --no-lower)
    #: The device targets the items were checked for, in manifest order, and whether
    #: any item was checked for this host (one without a target).
    targets: tuple[str, ...] = ()
    host: bool = True

    @property
    def failed(self) -> bool:
        return self.strict and bool(self.missing or self.stale)

    @property
    def where(self) -> str:
        """``this environment``, ``tpu:v5e:1x1``, ``this environment and tpu:v5e:2x2``."""
        places = (["this environment"] if self.host or not self.targets else []) + list(self.targets)
        return ", ".join(places[:-1]) + " and " + places[-1] if len(places) > 1 else places[0]

    def summary(self) -> str:
        if self.stale and not self.missing:
            return (f"{self.manifest}: {len(self.stale)} of {counted(self.items, 'entry')} stale "
                    f"(lowered in {self.lower_seconds or 0.0:.2f}s):")
        if not self.missing:
            stored = "the 1 entry is" if self.items == 1 else f"all {self.items} entries are"
            return f"{self.manifest}: {stored} stored for {self.where}"
        note = "" if self.strict else " (not a failure without --strict)"
        return (
            f"{self.manifest}: {len(self.missing)} of {counted(self.items, 'entry')} missing for "
            f"{self.where}{note}:"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest,
            "strict": self.strict,
            "items": self.items,
            "missing": [m.to_dict() for m in self.missing],
            "stale": [m.to_dict() for m in self.stale],
            "lower_seconds": None if self.lower_seconds is None else round(self.lower_seconds, 4),
            "targets": list(self.targets),
            "host": self.host,
        }


def find_stale(
    cache: ArtifactStore, items: Iterable[WarmupItem],
    target_environment: Callable[[WarmupItem], Fingerprint] | None = None,
) -> tuple[tuple[StaleItem, ...], float]:
    """Lowers each item (no compile; for its device target as a warm-up lowers it) and
    compares its key with the one served for its (name, signature, environment: its
    target's, else this host's): its ref, else the legacy newest intact entry
    (:mod:`aot.cache.index.served`). Items with nothing served are left to coverage.
    Returns the stale items and the seconds the lowerings took."""
    from aot.artifact import Manifest
    from aot.cache.index.served import ref_map, served_key
    from aot.cache.warmup.functions import lower_item

    stale: list[StaleItem] = []
    seconds = 0.0
    target_environment = target_environment or target_environments(cache)
    for item in items:
        with x64_mode(item):
            start = time.perf_counter()
            computation = lower_item(item)
            key = computation.fingerprint
            seconds += time.perf_counter() - start
            env = target_environment(item).digest if item.device_target is not None else cache.environment.digest
        slot = (computation.name, computation.signature, env)
        entries = cache.index.by_name(computation.name)
        served = served_key(entries, ref_map(cache.index.refs_named(computation.name, env)), slot)
        if served is None or served == key:
            continue
        entry = cache.index.get(served)
        parts: tuple[str, ...] = ()
        shown = computation.signature
        if entry is not None:
            manifest = Manifest.from_json(entry.manifest)
            parts = tuple(d.part for d in manifest.program.diff(computation.program_fingerprint))
            shown = Signature.from_manifest_json(entry.manifest, entry.signature).compact(None)
        stale.append(StaleItem(item, shown, served, key, parts, env))
    return tuple(stale), seconds


def _reason(
    cache: ArtifactStore, item: WarmupItem, signature: str, entries: Sequence[IndexEntry], env: str,
    environment: Fingerprint | None = None,
) -> str:
    """Why ``item`` is missing; ``environment``: its device target's (None: this host's)."""
    same = [e for e in entries if e.signature == signature]
    here = [e for e in same if e.env_fp == env]
    if here:  # only quarantined ones: an intact one would have covered it
        reasons = "; ".join(sorted({e.state_reason or e.state for e in here}))
        return f"quarantined ({reasons}); `aot gc` removes it and `aot warmup` compiles it again"
    if same:
        with x64_mode(item):
            statuses = environment_statuses(same, environment or cache.environment)
        described = sorted({statuses[e.key].describe() for e in same if e.ok}) or sorted(
            {statuses[e.key].describe() for e in same}
        )
        return "stored for " + " and for ".join(described)
    if entries:
        others = len({e.signature for e in entries})
        return (
            f"not stored ({others} other signature{'s' if others != 1 else ''} of "
            f"{item.name!r} {'are' if others != 1 else 'is'})"
        )
    return f"not stored (nothing named {item.name!r} is)"


def check_coverage(
    cache: ArtifactStore, items: Iterable[WarmupItem], *, manifest: str = "", strict: bool = False,
    lower: bool = False,
) -> CoverageReport:
    """Which ``items`` have no intact entry (same name and signature) for the
    environment each is compiled for (its device target's, else this host's), and why
    (signatures are computed from the specs, without lowering); with ``lower``, which
    are stale. Raises :class:`aot.ManifestError` naming the item whose specs cannot be
    resolved, :class:`aot.DeviceTargetError` when a target cannot be compiled for here."""
    items = list(items)
    missing = tuple(
        MissingItem(u.item, _reason(cache, u.item, u.signature, u.entries, u.env, u.environment), u.env)
        for u in find_uncovered(cache, items)
    )
    targets = tuple(dict.fromkeys(i.device_target for i in items if i.device_target is not None))
    host = any(i.device_target is None for i in items)
    if not lower:
        return CoverageReport(manifest, strict, len(items), missing, targets=targets, host=host)
    if not host:
        from aot.targets import compile_only_here

        # Lowering asks JAX for a default backend: the CPU, never this host's
        # accelerator (a server may hold it), as a warm-up for targets does.
        compile_only_here()
    absent = {id(m.item) for m in missing}
    stale, seconds = find_stale(cache, [i for i in items if id(i) not in absent])
    return CoverageReport(manifest, strict, len(items), missing, stale, seconds, targets, host)


@dataclass(frozen=True, slots=True)
class DanglingItem:
    """A ref or a release member naming an entry that is not stored or not intact."""

    declared_by: str  # "ref" or "release LABEL"
    name: str
    signature: str
    key: str
    what: str  # "not stored", "quarantined: ...", "damaged: ..."

    def describe(self) -> str:
        return f"{self.declared_by} of {self.name} ({self.signature}) names {self.key[:12]}: {self.what}"

    def to_dict(self) -> dict[str, Any]:
        return {"declared_by": self.declared_by, "name": self.name, "signature": self.signature,
                "key": self.key, "problem": self.what}


def find_dangling(cache: ArtifactStore, integrity: VerifyReport) -> tuple[DanglingItem, ...]:
    """Every current ref and every member of each label's current set whose entry is
    not stored, is quarantined, or had a problem in ``integrity`` (this verify's)."""
    index = cache.index
    entries = {e.key: e for e in index.entries()}
    damaged: dict[str, str] = {}
    for damage in integrity.problems:
        damaged.setdefault(damage.key, damage.what)

    def what(key: str) -> str | None:
        entry = entries.get(key)
        if entry is None:
            return "not stored"
        if not entry.ok:
            return f"{entry.state}: {entry.state_reason or ''}".strip().rstrip(":")
        if key in damaged:
            return f"damaged: {damaged[key]}"
        return None

    found: list[DanglingItem] = []
    for ref in index.refs():
        problem = what(ref.key)
        if problem is not None:
            found.append(DanglingItem("ref", ref.name, ref.signature, ref.key, problem))
    for release in index.releases():
        current = index.release_set(release.label)
        for member in () if current is None else current.members:
            problem = what(member.key)
            if problem is not None:
                found.append(DanglingItem(f"release {release.label}", member.name, member.signature,
                                          member.key, problem))
    return tuple(found)


@dataclass(frozen=True, slots=True)
class CheckReport:
    """``aot verify``'s result: integrity, and coverage with ``--manifest``."""

    location: str
    integrity: VerifyReport
    coverage: CoverageReport | None
    signatures: dict[str, Signature]  # of the entries with problems, by key
    #: With --strict: refs and release members naming an entry not stored or not intact.
    dangling: tuple[DanglingItem, ...] = ()
    #: With --require-tuned: served GPU entries compiled with XLA's default configs.
    untuned: tuple[DanglingItem, ...] = ()

    @property
    def ok(self) -> bool:
        # Unreferenced blobs are garbage, not damage (a writer may be between its blob
        # and its index row): reported, but only problems with entries fail the check.
        damaged = self.integrity.problems or self.integrity.cache_problems or self.dangling or self.untuned
        return not damaged and not (self.coverage is not None and self.coverage.failed)

    def summary(self) -> str:
        damaged = self.integrity.problems or self.integrity.cache_problems or self.dangling
        status = "PROBLEMS" if damaged else "ok"
        return (
            f"verified {counted(self.integrity.checked_entries, 'entry')} and "
            f"{counted(self.integrity.checked_blobs, 'blob')} in {self.location}: {status}"
        )

    def problem_lines(self) -> list[str]:
        lines = [f"problem: {what}" for what in self.integrity.cache_problems]
        for problem in self.integrity.problems:
            signature = self.signatures.get(problem.key)
            shown = f" ({signature.compact(60)})" if signature is not None and signature.leaves else ""
            lines.append(f"problem: {problem.name}{shown} {problem.key[:12]}: {problem.what}")
        lines += [f"dangling: {item.describe()}" for item in self.dangling]
        lines += [f"untuned: {item.describe()}" for item in self.untuned]
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "integrity": self.integrity.to_dict(),
            "coverage": self.coverage.to_dict() if self.coverage is not None else None,
            "dangling": [item.to_dict() for item in self.dangling],
            **({"untuned": [item.to_dict() for item in self.untuned]} if self.untuned else {}),
        }


def verify_with_coverage(
    cache: ArtifactStore, manifest: str | os.PathLike[str] | None = None, *, strict: bool = False,
    quarantine: bool = True, lower: bool = True, targets: Sequence[str] = (), require_tuned: bool = False,
) -> CheckReport:
    """Parses the manifest first (a bad one fails before anything is checked), then
    verifies the cache and checks the manifest's coverage, each item for its device
    target (``targets``: these instead of the manifest's, as ``aot warmup --target``);
    with ``strict``, also that every ref and release member is stored and intact
    (:func:`find_dangling`). A target that cannot be compiled for here (no libtpu)
    raises :class:`aot.DeviceTargetError`, and versions other than the manifest's
    ``[fleet]`` pins :class:`aot.IncompatibleEnvironmentError`, before anything is checked."""
    from aot.cache.admin.maintenance import verify_cache
    from aot.targets import parse_target

    items = None
    if manifest is not None:
        loaded = load_manifest(manifest)
        loaded.check_fleet()  # the gate of a runner with another libtpu than the fleet's fails
        if targets:  # device target names, or "host": this host's environment
            loaded = loaded.for_targets(targets)
        items = expand(loaded)
        wanted = dict.fromkeys(i.device_target for i in items if i.device_target is not None)
        for target in wanted:  # libtpu missing: said now, not after the integrity check
            parse_target(target).devices()
    integrity = verify_cache(cache, quarantine=quarantine)
    covered = (
        check_coverage(cache, items, manifest=str(manifest), strict=strict, lower=lower)
        if items is not None else None
    )
    signatures = {}
    for problem in integrity.problems:
        entry = cache.index.get(problem.key)
        if entry is not None:
            signatures[problem.key] = Signature.from_manifest_json(entry.manifest, entry.signature)
    dangling = find_dangling(cache, integrity) if strict else ()
    names = {i.name for i in items} if items is not None else None
    untuned = find_untuned(cache, names) if require_tuned else ()
    return CheckReport(cache.display_location, integrity, covered, signatures, dangling, untuned)


def find_untuned(cache: ArtifactStore, names: set[str] | None) -> tuple[DanglingItem, ...]:
    """Every current ref (of ``names``; None: all) naming a GPU entry compiled without
    the GPU's autotune results (``defaults``: :func:`aot.platforms.cuda.compile_tuned`)."""
    from aot.cache.rows import autotune_of

    found: list[DanglingItem] = []
    refs = [r for r in cache.index.refs() if names is None or r.name in names]
    entries = {e.key: e for e in cache.index.entries()} if refs else {}
    for ref in refs:
        entry = entries.get(ref.key)
        state = autotune_of(entry.manifest)[0] if entry is not None else None
        if state == "defaults":
            found.append(DanglingItem(
                "ref", ref.name, ref.signature, ref.key,
                "compiled with XLA's default autotune configs, not the GPU's (capture its results: "
                "aot target capture NAME --autotune FILE, then compile it again)",
            ))
    return tuple(found)
