"""Stored portable HLO that ages out of ``jax.export``'s compatibility window.

An entry's portable HLO (``jax.export`` serialization) is what the fallback ladder and
``aot verify --recompile`` compile when its executable cannot serve. JAX guarantees that
a newer JAX can load and compile an export for 6 months (backward compatibility:
https://docs.jax.dev/en/latest/export/export.html#compatibility-guarantees); older ones
may stop loading when JAX drops a calling-convention version
(``jax.export.minimum_supported_calling_convention_version``) or a serialization
version. An entry is:

- ``expired``: compiled more than :data:`GUARANTEE_DAYS` ago, or its calling convention
  is older than this JAX compiles (checked when ``deep``: the blob is read and parsed,
  no device opened), or this JAX cannot parse it at all;
- ``expiring``: within :data:`WARN_DAYS` of the window's end.

Its executable keeps serving as long as the environment does not change; what ages is
the way back when it changes (a jaxlib upgrade, another host). The fix is a warm-up from
the code, which exports the program again with the JAX in use.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from aot.cache.units import counted

if TYPE_CHECKING:
    from aot.cache.index.entry import IndexEntry
    from aot.cache.store import ArtifactStore

log = logging.getLogger(__name__)

__all__ = ["ADVICE", "EXPIRED", "EXPIRING", "GUARANTEE_DAYS", "WARN_DAYS", "AgedEntry", "AgingReport", "aged_entries"]

#: jax.export's backward-compatibility window: 6 months.
GUARANTEE_DAYS = 180
#: How long before the window's end an entry is reported as expiring.
WARN_DAYS = 30
EXPIRED, EXPIRING = "expired", "expiring"
ADVICE = (
    "re-warm them from their code (aot warmup / aot compile) with the JAX you serve, which "
    "exports them again; `aot verify --recompile` shows whether this JAX still compiles them"
)


@dataclass(frozen=True, slots=True)
class AgedEntry:
    key: str
    name: str
    signature: str
    status: str  # EXPIRED or EXPIRING
    created_at: datetime
    age_days: int
    jax_version: str  # the JAX that exported it
    reason: str

    def describe(self) -> str:
        return f"{self.name} ({self.signature}) {self.key[:12]}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key, "name": self.name, "signature": self.signature, "status": self.status,
            "created_at": self.created_at.isoformat(), "age_days": self.age_days,
            "jax_version": self.jax_version, "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class AgingReport:
    entries: tuple[AgedEntry, ...]
    checked: int
    guarantee_days: int = GUARANTEE_DAYS
    warn_days: int = WARN_DAYS

    def of(self, status: str) -> tuple[AgedEntry, ...]:
        return tuple(e for e in self.entries if e.status == status)

    @property
    def expired(self) -> tuple[AgedEntry, ...]:
        return self.of(EXPIRED)

    @property
    def expiring(self) -> tuple[AgedEntry, ...]:
        return self.of(EXPIRING)

    def lines(self) -> list[str]:
        """What ``aot verify`` and ``aot doctor`` print: nothing when no entry ages."""
        out: list[str] = []
        for status, entries, what in (
            (EXPIRED, self.expired, f"older than jax.export's {self.guarantee_days}-day compatibility guarantee"),
            (EXPIRING, self.expiring, f"within {self.warn_days} days of jax.export's {self.guarantee_days}-day "
                                      "compatibility guarantee"),
        ):
            if entries:
                out.append(f"portable HLO of {counted(len(entries), 'entry')} {what}:")
                out += [f"  {e.describe()}" for e in entries]
        if out:
            out.append(f"  {ADVICE}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "checked": self.checked, "guarantee_days": self.guarantee_days, "warn_days": self.warn_days,
            "expired": [e.to_dict() for e in self.expired], "expiring": [e.to_dict() for e in self.expiring],
            "advice": ADVICE if self.entries else None,
        }


def aged_entries(
    cache: ArtifactStore, *, now: datetime | None = None, deep: bool = False,
    entries: Sequence[IndexEntry] | None = None,
) -> AgingReport:
    """The intact entries whose portable HLO is past or near jax.export's window, by
    their compile time (the index's ``created_at``, kept across copies) and, when
    ``deep``, by the calling-convention version in the blob."""
    from aot.cache.index.entry import utcnow

    now = now or utcnow()
    rows = [e for e in (cache.entries() if entries is None else entries) if e.ok and e.hlo_digest is not None]
    aged: list[AgedEntry] = []
    for entry in rows:
        age = now - entry.created_at
        jax_version = _jax_version(entry)
        reason = None
        status = EXPIRED
        problem = _version_problem(cache, entry) if deep else None
        if problem is not None:
            reason = problem
        elif age > timedelta(days=GUARANTEE_DAYS):
            reason = (f"exported {age.days} days ago by jax {jax_version}; jax.export guarantees "
                      f"{GUARANTEE_DAYS} days")
        elif age > timedelta(days=GUARANTEE_DAYS - WARN_DAYS):
            status = EXPIRING
            left = GUARANTEE_DAYS - age.days
            reason = f"exported {age.days} days ago by jax {jax_version}; {left} days of the guarantee left"
        if reason is not None:
            aged.append(AgedEntry(
                entry.key, entry.name, entry.signature, status, entry.created_at, age.days, jax_version, reason,
            ))
    aged.sort(key=lambda e: (e.status, -e.age_days, e.name, e.key))
    return AgingReport(tuple(aged), len(rows))


def _jax_version(entry: IndexEntry) -> str:
    import json

    try:
        return str(json.loads(entry.manifest).get("jax_version", "?"))
    except ValueError:
        return "?"


def _version_problem(cache: ArtifactStore, entry: IndexEntry) -> str | None:
    """Why this JAX cannot compile the entry's portable HLO (None: it can), read from
    the blob without opening a device."""
    import jax

    from aot.artifact import PORTABLE_HLO
    from aot.errors import AotError
    from aot.jaxcompat.releases import calling_convention, this_release

    try:
        blob = cache.artifact(entry, roles=(PORTABLE_HLO,)).blob(PORTABLE_HLO)
    except AotError:
        return None  # a damaged blob is integrity's report, not this one's
    try:
        exported = jax.export.deserialize(bytearray(blob))
    except Exception as exc:  # noqa: BLE001 - flatbuffer and version errors vary
        return f"this jax ({this_release()}) cannot read it: {exc}"
    version = calling_convention(exported)
    return None if version is None else calling_convention_problem(version)


def calling_convention_problem(version: int) -> str | None:
    """Why an export of calling-convention ``version`` is not compiled by this JAX."""
    from aot.jaxcompat.releases import calling_convention_window, this_release

    window = calling_convention_window()
    if window is None:
        return None
    low = window[0]
    if version < low:
        return (f"calling convention version {version} is older than this jax ({this_release()}) "
                f"compiles (oldest {low})")
    return None
