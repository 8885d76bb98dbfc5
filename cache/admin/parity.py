"""``aot verify --recompile``: is each stored executable the one this host compiles?

For every intact entry whose environment is this host's, the stored portable HLO is
compiled here (as the fallback ladder would, :func:`aot.recompile.recompile`) and the
result compared with the stored executable (:func:`aot.parity.compare_executables`:
equal bytes, else the same optimized HLO and bit-identical outputs on generated inputs).
For an entry compiled deviceless for a target (``--target tpu:v5e:1x1`` on a CPU host),
running this on the chip is the proof that the deviceless compile is what the chip
compiles. Entries of other environments are skipped, each with why.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from aot.cache.units import counted

if TYPE_CHECKING:
    from aot.cache.index.entry import IndexEntry
    from aot.artifact import Manifest
    from aot.cache.store import ArtifactStore
    from aot.fingerprint import Fingerprint

log = logging.getLogger(__name__)

__all__ = ["OK", "DIFFERS", "ERROR", "SKIPPED", "RecompileItem", "RecompileReport", "verify_recompile"]

OK, DIFFERS, SKIPPED, ERROR = "OK", "DIFFERS", "SKIPPED", "ERROR"


@dataclass(frozen=True, slots=True)
class RecompileItem:
    """One entry's verdict: OK, DIFFERS (what), SKIPPED (why) or ERROR (what failed)."""

    key: str
    name: str
    signature: str
    status: str
    method: str = ""  # how it was compared: "bytes", "hlo+outputs", "outputs", "hlo", ""
    detail: str = ""
    seconds: float = 0.0  # the recompilation and comparison

    def describe(self) -> str:
        what = f"{self.status:<7} {self.name} ({self.signature}) {self.key[:12]}"
        if self.status == OK:
            how = {"bytes": "executable bytes equal", "hlo+outputs": "optimized HLO and outputs equal",
                   "hlo": "optimized HLO equal"}.get(self.method, self.method)
            return f"{what}: {self.detail or how} ({self.seconds:.2f}s)"
        return f"{what}: {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key, "name": self.name, "signature": self.signature, "status": self.status,
            "method": self.method, "detail": self.detail, "seconds": round(self.seconds, 4),
        }


@dataclass(frozen=True, slots=True)
class RecompileReport:
    items: tuple[RecompileItem, ...]
    environment: str  # this host's environment digest

    @property
    def ok(self) -> bool:
        return not any(i.status in (DIFFERS, ERROR) for i in self.items)

    def count(self, status: str) -> int:
        return sum(1 for i in self.items if i.status == status)

    def summary(self) -> str:
        checked = len(self.items) - self.count(SKIPPED)
        return (
            f"recompiled {checked} of {counted(len(self.items), 'entry')} here: {self.count(OK)} OK, "
            f"{self.count(DIFFERS)} differ, {self.count(ERROR)} failed, {self.count(SKIPPED)} skipped"
        )

    def lines(self) -> list[str]:
        return [i.describe() for i in self.items]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "environment": self.environment,
            "counts": {s: self.count(s) for s in (OK, DIFFERS, ERROR, SKIPPED)},
            "entries": [i.to_dict() for i in self.items],
        }


def _where(parts: dict[str, str]) -> str:
    return f"{parts.get('platform', '?')} ({parts.get('device_kind', '?')} x{parts.get('device_count', '?')})"


def _skip_reason(entry_parts: dict[str, str], here: dict[str, str], differences: str) -> str:
    if entry_parts.get("platform") != here.get("platform") or entry_parts.get("device_kind") != here.get("device_kind"):
        return f"compiled for {_where(entry_parts)}, this host is {_where(here)}"
    return f"compiled for another environment: {differences}"


def verify_recompile(
    cache: ArtifactStore, patterns: Sequence[str] = (), *, run: bool = True,
) -> RecompileReport:
    """Recompiles each intact entry of this host's environment (names matching
    ``patterns``, all when empty) from its portable HLO and compares it with the stored
    executable. ``run``: also compare outputs on generated inputs. Never writes."""
    import jax

    from aot.artifact import Manifest
    from aot.errors import AotError

    entries = [e for e in cache.entries() if e.ok and (not patterns or any(fnmatchcase(e.name, p) for p in patterns))]
    items = []
    for entry in sorted(entries, key=lambda e: (e.name, e.signature, e.key)):
        try:
            manifest = Manifest.from_json(entry.manifest)
        except AotError as exc:  # integrity's finding; said here too, as a failure
            items.append(RecompileItem(entry.key, entry.name, entry.signature, ERROR, detail=str(exc)))
            continue
        # An entry compiled under x64 is checked against (and recompiled in) x64 mode.
        x64 = manifest.environment.as_dict().get("x64") == "true"
        with jax.enable_x64(True) if x64 else contextlib.nullcontext():
            items.append(_check(cache, entry, manifest, cache.environment, run=run))
    return RecompileReport(tuple(items), cache.environment.digest)


def _check(
    cache: ArtifactStore, entry: IndexEntry, manifest: Manifest, current: Fingerprint, *, run: bool,
) -> RecompileItem:
    from aot.artifact import EXECUTABLE
    from aot.errors import AotError
    from aot.parity import compare_executables
    from aot.recompile import recompile
    from aot.rehydrate import load_executable

    def item(status: str, detail: str = "", method: str = "", seconds: float = 0.0) -> RecompileItem:
        return RecompileItem(entry.key, entry.name, entry.signature, status, method, detail, seconds)

    if entry.exe_digest is None or entry.hlo_digest is None:
        what = "symbolic: no executable is stored (its concrete entries are checked)" if entry.exe_digest is None \
            else "no portable HLO is stored: nothing to recompile"
        return item(SKIPPED, what)
    differences = manifest.environment.diff(current)
    if differences:
        described = "; ".join(d.describe() for d in differences)
        return item(SKIPPED, _skip_reason(manifest.environment.as_dict(), current.as_dict(), described))
    start = time.perf_counter()
    try:
        artifact = cache.artifact(entry, manifest=manifest)
        # Flat outputs: compared leaf by leaf, no pytree node has to be rebuilt here.
        stored = load_executable(artifact, current=current, flat_outputs=True)
        rebuilt = recompile(artifact)
        mine = load_executable(rebuilt, current=current, flat_outputs=True)
        comparison = compare_executables(
            stored, mine, stored_bytes=artifact.blob(EXECUTABLE), recompiled_bytes=rebuilt.blob(EXECUTABLE), run=run,
        )
    except (AotError, RuntimeError, ValueError, TypeError) as exc:  # XLA's errors are RuntimeErrors
        log.warning("verify --recompile: %s (%s): %s", entry.name, entry.key[:12], exc)
        return item(ERROR, f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if comparison.same:
        return item(OK, comparison.detail, comparison.method, seconds)
    return item(
        DIFFERS,
        f"{comparison.detail}; the stored executable is not what this host compiles from the stored HLO: "
        "recompile it from its code (aot warmup / aot compile) on the host or target it serves",
        comparison.method, seconds,
    )
