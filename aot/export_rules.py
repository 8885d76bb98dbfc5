"""Which JAX release would refuse a stored portable HLO (``jax.export`` bytes), decided
from the bytes' own header, without that release installed.

``jax.export`` promises that a release calls what was exported by releases of about
the last six months (https://docs.jax.dev/en/latest/export/export.html#compatibility-guarantees).
From JAX 0.11.1 on the promise is enforced: ``jax.export.deserialize`` refuses an export
whose device count is only in the 16-bit field of serialization versions before 5
(made before 2025-11-23) or whose shardings are only ``HloSharding`` protos (before
version 6, 2026-01-15), and serializers record the serialization version (12, 2026-07-29)
and the JAX version that made the export; JAX's source says the minimum serialization
version will be checked too (from 2027-01-27). An export is judged here, for a release
V, by:

- V's refusals of the old formats above (V >= 0.11.1);
- V's calling convention window (``jax.export.minimum/maximum_supported_calling_convention_version``);
- its date against V's window, :data:`WINDOW_MONTHS` before V's release date: the
  date of the JAX release that serialized it (recorded in the bytes from 0.11.1; else
  the entry's JAX release when the bytes agree with it), else the date of the newest
  serialization format the bytes use (a lower bound: an export of an unknown release).

The release dates and formats below were read from JAX's releases (the tags of
github:jax-ml/jax, the published wheels' build dates, ``jax/_src/export/serialization.py``
and ``_export.py`` of each). A release newer than this table cannot be judged: add it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from aot.jaxcompat.export_header import ExportHeader, read_export_header
from aot.jaxcompat.versions import TESTED_RELEASES, release_tuple

__all__ = [
    "RELEASE_DATES", "WINDOW_MONTHS", "ExportDate", "ExportVerdict", "date_export", "judge", "judge_header",
    "known_release", "newest_release", "refresh_advice", "window_start",
]

D = dt.date

#: Each JAX release's date (its tag, or its wheel's build date for the releases the
#: mirror of github:jax-ml/jax has no tag of: 0.11.1 and later).
RELEASE_DATES: dict[str, dt.date] = {
    "0.9.0": D(2026, 1, 20), "0.9.0.1": D(2026, 2, 3), "0.9.1": D(2026, 2, 28), "0.9.2": D(2026, 3, 18),
    "0.10.0": D(2026, 4, 15), "0.10.1": D(2026, 5, 18), "0.10.2": D(2026, 6, 17), "0.11.0": D(2026, 7, 16),
    "0.11.1": D(2026, 8, 17), "0.11.2": D(2026, 9, 17), "0.12.0": D(2026, 10, 16), "0.12.0.1": D(2026, 10, 20),
    "0.12.1": D(2026, 11, 18),
}

#: The serialization format each release writes (``_SERIALIZATION_VERSION``); before
#: 0.11.1 the stored field always says 3, whatever the format.
WRITES: dict[str, int] = {
    "0.9.0": 6, "0.9.0.1": 6, "0.9.1": 6, "0.9.2": 8, "0.10.0": 10, "0.10.1": 11, "0.10.2": 11,
    "0.11.0": 11, "0.11.1": 12, "0.11.2": 12, "0.12.0": 12, "0.12.0.1": 12, "0.12.1": 13,
}

#: The dates of the serialization formats (JAX's changelog of ``_SERIALIZATION_VERSION``).
FORMAT_DATES: dict[int, dt.date] = {
    5: D(2025, 11, 23), 6: D(2026, 1, 15), 8: D(2026, 3, 12), 9: D(2026, 3, 17), 10: D(2026, 4, 4),
    11: D(2026, 5, 15), 12: D(2026, 7, 29), 13: D(2026, 10, 30),
}

#: The first release that records the format and its own version, and refuses the old formats.
RECORDS_FROM = (0, 11, 1)
#: The calling conventions every release of the table calls.
CALLING_CONVENTIONS = (9, 10)
#: ``jax.export``'s backward-compatibility window.
WINDOW_MONTHS = 6


def refresh_advice(release: str) -> str:
    return (f"run `aot warmup MANIFEST --refresh-exports` where the model's code is (CI) to export it "
            f"again for jax {release}")


def newest_release() -> str:
    """The newest JAX release jax-aot supports (the one ``--refresh-exports`` exports for)."""
    return TESTED_RELEASES[-1]


def window_start(release: str) -> dt.date:
    """The oldest export date ``release`` promises to call; KeyError for an unknown release."""
    day = RELEASE_DATES[release]
    month = day.month - WINDOW_MONTHS
    year = day.year + (month - 1) // 12
    month = (month - 1) % 12 + 1
    for d in (day.day, 30, 29, 28):  # the 31st of a shorter month: its last day
        try:
            return D(year, month, d)
        except ValueError:
            continue
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class ExportDate:
    """When an export was made, as far as its bytes (and its entry) tell."""

    made: dt.date | None  # None: before serialization version 5 (2025-11-23)
    how: str  # "jax 0.10.2 (2026-06-17)", "serialization format 10 or newer (2026-04-04)", ...
    serialization: int | None  # the format, recorded or inferred (a lower bound when inferred)
    producer: str | None  # the JAX release that made it, when known

    def text(self) -> str:
        return self.how


def date_export(header: ExportHeader, entry_jax: str | None) -> ExportDate:
    """The date of the export with ``header``, stored with an entry of JAX ``entry_jax``."""
    if header.nr_devices == 0 and header.nr_devices_short > 0:  # a layout no 0.11.1+ serializer writes
        return ExportDate(None, "serialization format older than 5 (before 2025-11-23)", None, None)
    if header.serialization_field >= 12:  # a 0.11.1+ serializer: the format is recorded
        fmt = header.serialization_field
        producer = header.jax_version
        if producer in RELEASE_DATES:
            return ExportDate(RELEASE_DATES[producer], f"made by jax {producer} ({RELEASE_DATES[producer]})", fmt, producer)
        made = FORMAT_DATES.get(fmt) or max(FORMAT_DATES.values())
        return ExportDate(made, f"serialization format {fmt} ({made}), jax {producer or 'unknown'}", fmt, producer)
    fmt = 10 if header.indexed else 6 if header.named_shardings else 5
    if header.hlo_sharding_only:
        fmt = 5
    if (entry_jax in RELEASE_DATES and release_tuple(entry_jax) < RECORDS_FROM
            and WRITES[entry_jax] >= fmt and not header.hlo_sharding_only):
        return ExportDate(RELEASE_DATES[entry_jax], f"made by jax {entry_jax} ({RELEASE_DATES[entry_jax]})",
                          WRITES[entry_jax], entry_jax)
    made = FORMAT_DATES[fmt]
    return ExportDate(made, f"serialization format {fmt} or newer ({made}), made by a jax before 0.11.1", fmt, None)


@dataclass(frozen=True, slots=True)
class ExportVerdict:
    """What release ``release`` makes of one export. ``refused``: why ``release``'s
    ``jax.export`` refuses it (the formats JAX 0.11.1+ refuses, a calling convention
    outside its window); ``expired``: why it is outside the window ``release``
    promises (by date; JAX reads it until it checks the format, from 2027-01-27)."""

    release: str
    date: ExportDate
    calling_convention: int
    window_start: dt.date | None  # None: the release's date is not known here
    refused: tuple[str, ...]
    expired: tuple[str, ...]

    @property
    def reasons(self) -> tuple[str, ...]:
        return self.refused + self.expired

    @property
    def status(self) -> str | None:
        """``refused``, ``expired`` (outside the window only) or None (called)."""
        return "refused" if self.refused else "expired" if self.expired else None

    def describe(self) -> str:
        return "; ".join(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "status": self.status,
            "made": self.date.made.isoformat() if self.date.made else None,
            "dated_by": self.date.how,
            "serialization_version": self.date.serialization,
            "made_by_jax": self.date.producer,
            "calling_convention": self.calling_convention,
            "window_start": self.window_start.isoformat() if self.window_start else None,
            "refused": list(self.refused),
            "expired": list(self.expired),
        }


def judge_header(
    header: ExportHeader, entry_jax: str | None, release: str, *, calling_convention: bool = True,
) -> ExportVerdict:
    """What JAX ``release`` makes of the export with ``header``. ``calling_convention=False``:
    not judged by it (the running release checks it with its own window)."""
    date = date_export(header, entry_jax)
    refused: list[str] = []
    if release_tuple(release) >= RECORDS_FROM:
        if header.nr_devices == 0 and header.nr_devices_short > 0:
            refused.append(f"its device count is only in the 16-bit field of serialization formats before 5 "
                           f"(made before 2025-11-23), which jax {release} refuses")
        if header.hlo_sharding_only:
            refused.append(f"its shardings are HloSharding protos only (made before 2026-01-15, the "
                           f"HloShardingProto change), which jax {release} refuses")
    low, high = CALLING_CONVENTIONS
    if calling_convention and not low <= header.calling_convention <= high:
        refused.append(f"calling convention {header.calling_convention} is outside jax {release}'s ({low}..{high})")
    start = window_start(release) if release in RELEASE_DATES else None
    expired: list[str] = []
    if start is not None and (date.made is None or date.made < start):
        expired.append(f"{date.how} is older than jax {release}'s {WINDOW_MONTHS}-month window (from {start})")
    return ExportVerdict(release, date, header.calling_convention, start, tuple(refused), tuple(expired))


def judge(
    blob: bytes, entry_jax: str | None, release: str, *, calling_convention: bool = True,
) -> ExportVerdict | None:
    """:func:`judge_header` of ``blob``; None when its header cannot be read."""
    header = read_export_header(blob)
    if header is None:
        return None
    return judge_header(header, entry_jax, release, calling_convention=calling_convention)


def known_release(release: str) -> bool:
    return release in RELEASE_DATES
