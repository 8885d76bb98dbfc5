"""``aot verify --jax-release V``: the entries whose portable HLO JAX release ``V``
would refuse, or no longer promises to call (:mod:`aot.export_rules`), judged from each
blob's header without importing ``V`` and without opening a device.

The portable HLO is the fallback ladder's way to serve an entry on a host of another
release; JAX 0.11.1+ refuses old export formats and promises a window of about six
months, so an old cache's exports expire under a fleet. The fix is a warm-up where the
model's code is: ``aot warmup MANIFEST --refresh-exports``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.cache.units import counted
from aot.errors import AotError, UsageError
from aot.export_rules import ExportVerdict, judge, known_release, refresh_advice, window_start

if TYPE_CHECKING:
    from aot.cache.index.entry import IndexEntry
    from aot.cache.store import ArtifactStore

__all__ = ["ExpiredExport", "ExportExpiryReport", "expired_exports"]


@dataclass(frozen=True, slots=True)
class ExpiredExport:
    """An entry whose portable HLO the release would refuse (or not promise to call)."""

    key: str
    name: str
    signature: str
    jax_version: str  # the entry's JAX release
    verdict: ExportVerdict

    def describe(self) -> str:
        date = self.verdict.date
        return (f"{self.name} ({self.signature}) {self.key[:12]} jax {self.jax_version}: "
                f"{self.verdict.status}: {date.how}, serialization format "
                f"{date.serialization if date.serialization is not None else '< 5'}: {self.verdict.describe()}")

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "name": self.name, "signature": self.signature,
                "jax_version": self.jax_version, **self.verdict.to_dict()}


@dataclass(frozen=True, slots=True)
class ExportExpiryReport:
    release: str
    checked: int  # entries with a portable HLO read
    entries: tuple[ExpiredExport, ...]

    @property
    def ok(self) -> bool:
        return not self.entries

    def lines(self) -> list[str]:
        """What ``aot verify --jax-release`` prints."""
        start = window_start(self.release)
        head = (f"portable HLO for jax {self.release} (window from {start}): {counted(self.checked, 'entry')} "
                f"checked, {len(self.entries)} refused or outside the window")
        if not self.entries:
            return [head]
        return [head, *(f"  {e.describe()}" for e in self.entries), f"  {refresh_advice(self.release)}"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "release": self.release, "window_start": window_start(self.release).isoformat(),
            "checked": self.checked, "ok": self.ok, "entries": [e.to_dict() for e in self.entries],
            "advice": refresh_advice(self.release) if self.entries else None,
        }


def expired_exports(
    cache: ArtifactStore, release: str, *, entries: Sequence[IndexEntry] | None = None,
) -> ExportExpiryReport:
    """The intact entries (every environment) whose portable HLO JAX ``release`` would
    refuse or not promise to call; raises :class:`aot.UsageError` for a release whose
    date and formats jax-aot does not know."""
    from aot.artifact import PORTABLE_HLO
    from aot.export_rules import RELEASE_DATES

    if not known_release(release):
        raise UsageError(
            f"jax-aot does not know the export rules of JAX {release}; known releases: "
            f"{', '.join(RELEASE_DATES)} (a newer jax-aot knows newer ones)"
        )
    rows = [e for e in (cache.entries() if entries is None else entries) if e.ok and e.hlo_digest is not None]
    found: list[ExpiredExport] = []
    checked = 0
    for entry in rows:
        try:
            blob = cache.artifact(entry, roles=(PORTABLE_HLO,)).blob(PORTABLE_HLO)
        except AotError:
            continue  # a damaged blob is integrity's report, not this one's
        checked += 1
        entry_jax = _jax_version(entry)
        verdict = judge(blob, entry_jax, release)
        if verdict is not None and verdict.status is not None:
            found.append(ExpiredExport(entry.key, entry.name, entry.signature, entry_jax or "?", verdict))
    found.sort(key=lambda e: (e.verdict.status or "", e.name, e.signature, e.key))
    return ExportExpiryReport(release, checked, tuple(found))


def _jax_version(entry: IndexEntry) -> str | None:
    try:
        value = json.loads(entry.manifest).get("jax_version")
    except ValueError:
        return None
    return value if isinstance(value, str) else None
