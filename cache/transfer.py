"""Copying entries between caches (the library side of ``aot push`` / ``aot pull``).

Rows are read from the source's index; blobs move as stored, ContentStore to
ContentStore (:meth:`~aot.cache.content.ContentStore.copy_to`: no recompression, every
payload verified against its digest); the destination commits each row under the same
gc protocol as any writer (leases, docs/reliability.md). Copies are idempotent and
resumable: an entry stored intact at the destination is skipped, one whose blobs are
missing or corrupt there is repaired.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.cache.names import name_problem
from aot.errors import AotError

if TYPE_CHECKING:
    from aot.cache.cache import Cache

log = logging.getLogger(__name__)

__all__ = ["TransferReport", "copy_entries"]


@dataclass(frozen=True, slots=True)
class TransferReport:
    """What :func:`copy_entries` did, by key."""

    source: str
    destination: str
    copied: tuple[str, ...]
    skipped: tuple[str, ...]  # stored intact at the destination already
    repaired: tuple[str, ...] = ()  # stored there, blobs missing or corrupt: restored
    failed: tuple[tuple[str, str], ...] = ()  # (key, why): names refused, damaged at the source

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "destination": self.destination,
            "copied": len(self.copied),
            "skipped": len(self.skipped),
            "repaired": len(self.repaired),
            "failed": [{"key": k, "reason": why} for k, why in self.failed],
            "keys": {"copied": list(self.copied), "skipped": list(self.skipped), "repaired": list(self.repaired)},
        }


def copy_entries(source: Cache, destination: Cache, names: Iterable[str] | None = None) -> TransferReport:
    """Copies every intact entry of ``source`` whose name matches one of the globs
    ``names`` (all if None) into ``destination``. An entry that cannot be copied
    (a damaged source blob, a name the rule refuses) is reported in ``failed`` and
    the others are copied."""
    globs = list(names) if names else None
    destination._check_writable("copy entries into it")
    outcomes: dict[str, list[str]] = {"stored": [], "present": [], "repaired": []}
    failed: list[tuple[str, str]] = []
    for entry in source.index.entries():
        if not entry.ok or (globs and not any(fnmatch.fnmatchcase(entry.name, g) for g in globs)):
            continue
        problem = name_problem(entry.name)
        if problem is not None:
            failed.append((entry.key, problem))
            continue
        try:
            _, outcome = destination.copy_entry_from(source, entry)
        except AotError as exc:
            log.warning("not copied: %s (%s): %s", entry.name, entry.key[:12], exc)
            failed.append((entry.key, str(exc)))
            continue
        outcomes[outcome].append(entry.key)
    report = TransferReport(
        source.display_location, destination.display_location, tuple(outcomes["stored"]),
        tuple(outcomes["present"]), tuple(outcomes["repaired"]), tuple(failed),
    )
    log.info(
        "copied %d entries from %s to %s (%d already there, %d repaired, %d failed)",
        len(report.copied), report.source, report.destination, len(report.skipped),
        len(report.repaired), len(report.failed),
    )
    return report
