"""The value objects of serving statistics: one (environment, name, signature)'s
counts (:class:`SignatureStats`) and a table of them (:class:`StatsReport`), what
``aot stats`` and ``cache.stats.report()`` show. Recorded by
:mod:`aot.cache.stats_recorder`, read back from the index by :mod:`aot.cache.reports.stats`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from aot.cache.index.jit_records import MIN_COMPILE_TIME_HINT, JitStats
from aot.cache.index.entry import fields_to_json, parse_utc
from aot.signatures import ArgLeaf, Signature

__all__ = ["COUNTERS", "SIGNATURE_WIDTH", "SignatureStats", "StatsReport", "ordered"]

#: The width the signature column is folded to (``aot stats``, ``print(report)``).
SIGNATURE_WIDTH = 60


@dataclass(frozen=True, slots=True)
class SignatureStats:
    """The statistics of one (environment, name, signature)."""

    env_fp: str
    name: str
    signature: str
    calls: int = 0
    loads: int = 0
    load_seconds: float = 0.0
    saved_seconds: float = 0.0
    misses: int = 0
    miss_reason: str | None = None
    recompiles: int = 0
    recompile_seconds: float = 0.0
    recompile_reason: str | None = None
    created_at: datetime | None = None  # first recorded (index clock); None in memory
    updated_at: datetime | None = None  # last recorded
    this_environment: bool = False

    def to_dict(self) -> dict[str, Any]:
        return fields_to_json(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SignatureStats:
        kwargs = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        for key in ("created_at", "updated_at"):
            if isinstance(kwargs.get(key), str):
                kwargs[key] = parse_utc(kwargs[key])
        return cls(**kwargs)


#: The fields of a row that add up: its counts and seconds (``calls``, ``loads``,
#: ``load_seconds``, ...), in the order of the index's columns.
COUNTERS: tuple[str, ...] = tuple(
    f.name for f in fields(SignatureStats) if f.type in ("int", "float")
)


@dataclass(frozen=True, slots=True)
class StatsReport:
    """What ``aot stats`` shows: rows (most called first) and their totals."""

    location: str  # where the statistics are kept
    rows: tuple[SignatureStats, ...]
    env: str = "all"
    stored: bool = True  # False: a read-only cache's statistics, kept in memory
    # (name, flat signature) -> the signature by argument name, where known
    named: Mapping[tuple[str, str], Signature] = field(default_factory=dict, compare=False)

    def arguments(self, row: SignatureStats) -> Signature:
        """``row``'s signature by argument name (``x: f32[8]``), as ``ls`` shows it: from
        its entry, or for a missed signature from an entry of the name with as many
        inputs; else the flat signature."""
        known = self.named.get((row.name, row.signature))
        if known is not None:
            return known
        flat = Signature.flat(row.signature)
        for (name, _), signature in self.named.items():
            if name == row.name and not signature.statics and len(signature.leaves) == len(flat.leaves):
                return Signature(tuple(
                    ArgLeaf(leaf.path, got.aval) for leaf, got in zip(signature.leaves, flat.leaves)
                ))
        return flat

    @property
    def jit_hint(self) -> str | None:
        """Why jit misses left nothing stored: JAX's minimum compile time (None when
        something is stored, or nothing was missed)."""
        if self.jit_stored or not any(j.misses for j in self.jit):
            return None
        return "no jit entry is stored: " + MIN_COMPILE_TIME_HINT.format(seconds=1).replace(
            " (1 s here)", " (1 s by default)"
        )

    def describe(self, row: SignatureStats, width: int | None = SIGNATURE_WIDTH) -> str:
        """The signature column: by argument name, folded to ``width`` (never cut
        inside an aval)."""
        return self.arguments(row).compact(width)
    jit: tuple[JitStats, ...] = ()  # JAX's persistent cache through aot.jax_cache, per function
    #: How many KIND jit entries are stored (for the names asked about).
    jit_stored: int = 0
    #: False when this host's environment is unknown (no row is "this").
    environment_known: bool = True
    #: env_fp -> what the environment is for (``tpu:v5e:2x2``, ``cpu x8``:
    #: :func:`aot.targets.environment_name`); an environment left out is unknown here.
    targets: Mapping[str, str] = field(default_factory=dict, compare=False)

    def target(self, row: SignatureStats) -> str | None:
        """What ``row``'s environment is for; None when no entry of it is stored."""
        return self.targets.get(row.env_fp)

    @property
    def totals(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: 0 for name in COUNTERS}
        for row in self.rows:
            for name in COUNTERS:
                out[name] += getattr(row, name)
        out["signatures"] = sum(1 for r in self.rows if r.calls or r.loads or r.recompiles)
        return out

    @property
    def misses(self) -> tuple[SignatureStats, ...]:
        return tuple(r for r in self.rows if r.misses)

    @property
    def recompiled(self) -> tuple[SignatureStats, ...]:
        return tuple(r for r in self.rows if r.recompiles)

    def __str__(self) -> str:
        """A small table, as ``aot stats`` prints it: one row per signature, then the
        totals (``print(cache.stats.report())``)."""
        from aot.cache.units import counted

        if not self.rows:
            return f"no statistics in {self.location}"
        headers = ("NAME", "SIGNATURE", "CALLS", "LOADS", "MISSES", "RECOMPILES")
        cells = [
            (r.name, self.describe(r), str(r.calls), str(r.loads), str(r.misses), str(r.recompiles))
            for r in self.rows
        ]
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
        lines = [
            "  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))).rstrip()
            for row in [headers, *cells]
        ]
        t = self.totals
        lines.append(
            f"{counted(t['calls'], 'call')} on {counted(t['signatures'], 'signature')}; "
            f"{counted(t['loads'], 'load')}; {counted(t['misses'], 'miss')}; "
            f"{counted(t['recompiles'], 'recompile')} ({self.location})"
        )
        return "\n".join(lines)

    def __repr__(self) -> str:
        """The table too: ``cache.stats.report()`` at an interactive prompt shows what
        ``print`` shows, not a dump of the fields."""
        return str(self)

    def to_dict(self) -> dict[str, Any]:
        totals = self.totals
        return {
            "location": self.location,
            "env": self.env,
            "stored": self.stored,
            "rows": [{**r.to_dict(), "target": self.target(r)} for r in self.rows],
            "totals": {k: round(v, 6) if isinstance(v, float) else v for k, v in totals.items()},
            "jit": [j.to_dict() for j in self.jit],
        }


def ordered(rows: Iterable[SignatureStats]) -> tuple[SignatureStats, ...]:
    """Most called first (then by name, signature and environment)."""
    return tuple(sorted(rows, key=lambda r: (-r.calls, r.name, r.signature, r.env_fp)))
