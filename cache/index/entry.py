"""One artifact row of the index, as a value object; no SQLAlchemy here.

Kept apart from the SQLAlchemy index (:mod:`aot.cache.index.sql`) so that a serving
process can read a folder cache's index with the standard library alone
(:mod:`aot.cache.index.reader`): importing SQLAlchemy costs more start-up time than
loading an executable.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from operator import itemgetter
from typing import Any, Mapping, NamedTuple


#: The SQLite index's file in a folder cache.
INDEX_FILE = "index.sqlite"

#: SQLite waits this long for a lock held by another writer before failing (the SQL
#: index's engine and the standard library's reader and writes alike).
SQLITE_BUSY_TIMEOUT_MS = 30_000

#: Version of the database schema this code writes; the changelog and the migrations
#: are in :mod:`aot.cache.index.schema` (here because the stdlib reader checks it).
SCHEMA_VERSION = 12

#: Every column whose value names a blob that gc must keep while the row lives, as
#: (table, column): the one list gc's plan, its deletion step and the stdlib reader
#: query (here, not in the schema module, because the stdlib reader imports no
#: SQLAlchemy; tests/cache/index/test_journal.py checks it against the schema's columns
#: marked ``info={"blob": True}``).
BLOB_COLUMNS: tuple[tuple[str, str], ...] = (
    ("programs", "hlo_digest"),
    ("artifacts", "exe_digest"),
    ("artifacts", "hlo_digest"),
    ("artifacts", "manifest_digest"),
    ("artifacts", "const_digest"),
    ("journal", "digest"),
    ("jit_entries", "digest"),
)

#: The column naming the row that holds a blob reference, of the tables gc deletes rows
#: of (a blob referenced from any other table is kept while its row lives).
BLOB_OWNERS = {"artifacts": "key", "programs": "program_fp", "jit_entries": "key"}

#: Valid values of ``artifacts.state``.
ARTIFACT_STATES = ("ok", "quarantined")

def utcnow() -> datetime:
    """The current time, timezone-aware UTC (the index stores nothing else)."""
    return datetime.now(timezone.utc)


def as_utc(value: datetime, what: str) -> datetime:
    """``value`` in UTC; a naive datetime is refused (``what`` names it in the error)."""
    if value.tzinfo is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got naive {value!r}")
    if value.tzinfo is timezone.utc:  # as the index returns it: 2 per row read
        return value
    return value.astimezone(timezone.utc)


#: The widest signature an entry's repr shows (folded between avals).
REPR_SIGNATURE_WIDTH = 60


@dataclass(frozen=True, slots=True, repr=False)
class IndexEntry:
    """One artifact row of the index (the manifest stays a JSON string)."""

    key: str
    name: str
    program_fp: str
    env_fp: str
    signature: str
    platform: str
    manifest: str
    exe_digest: str | None  # None: a symbolic entry (portable HLO, no executable)
    hlo_digest: str | None
    raw_size: int
    stored_size: int
    compile_seconds: float
    created_at: datetime = field(default_factory=utcnow)
    last_used_at: datetime = field(default_factory=utcnow)
    hits: int = 0
    state: str = "ok"
    state_reason: str | None = None
    #: sha256 of ``manifest`` (its UTF-8 bytes), a blob of the store too (schema 10).
    manifest_digest: str | None = None
    #: The blob of the constants JAX hoisted into the executable's arguments (schema 12).
    const_digest: str | None = None

    def __post_init__(self) -> None:
        if self.state not in ARTIFACT_STATES:
            raise ValueError(f"state must be one of {ARTIFACT_STATES}, got {self.state!r}")
        object.__setattr__(self, "created_at", as_utc(self.created_at, "created_at"))
        object.__setattr__(self, "last_used_at", as_utc(self.last_used_at, "last_used_at"))

    def __repr__(self) -> str:
        # The generated repr printed the whole manifest (~5 KB a row) in logs, tracebacks
        # and debuggers; these are what tell two entries apart.
        from aot.signatures import Signature, shorten_tokens
        from aot.targets import environment_name

        try:
            target = environment_name(json.loads(self.manifest)["environment"]["parts"])
        except Exception:  # noqa: BLE001 - a repr never raises
            target = self.platform
        signature = shorten_tokens([leaf.aval for leaf in Signature.flat(self.signature).leaves], REPR_SIGNATURE_WIDTH)
        return (
            f"IndexEntry(key={self.key[:12]!r}, name={self.name!r}, signature={signature!r}, "
            f"target={target!r}, env_fp={self.env_fp[:12]!r}, state={self.state!r})"
        )

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def manifest_dict(self) -> dict[str, Any]:
        """The manifest parsed from JSON."""
        parsed: dict[str, Any] = json.loads(self.manifest)
        return parsed

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict; datetimes become ISO 8601 UTC strings."""
        return fields_to_json(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IndexEntry:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (forward compatibility)."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            if f.name in ("created_at", "last_used_at") and isinstance(value, str):
                value = parse_utc(value)
            kwargs[f.name] = value
        return cls(**kwargs)

    def _row(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def referenced_digests(row: IndexEntry | GcRow) -> set[str]:
    """Every blob an artifact row keeps from gc: its executable, its portable HLO, its
    manifest blob (schema 10) and its hoisted constants (schema 12)."""
    return {d for d in (row.exe_digest, row.hlo_digest, row.manifest_digest, row.const_digest) if d}


def entry_digests(entry: IndexEntry) -> list[str]:
    """The digests of ``entry``'s artifact blobs (executable, portable HLO, hoisted
    constants); its manifest blob apart (:func:`referenced_digests`): a row whose
    manifest blob is not stored still loads (the row holds the manifest)."""
    return [d for d in (entry.exe_digest, entry.hlo_digest, entry.const_digest) if d]


class GcRow(NamedTuple):
    """The columns of an artifact row that gc plans with: no manifest, no environment.

    A named tuple, not a frozen dataclass like :class:`IndexEntry`: gc reads every row
    of the index, and at a million rows a dataclass's ``__init__`` and ``__post_init__``
    cost seconds of the plan (benchmarks/README.md, "Costs at fleet scale")."""

    key: str
    name: str
    signature: str
    program_fp: str
    exe_digest: str | None
    hlo_digest: str | None
    stored_size: int
    created_at: datetime
    last_used_at: datetime
    state: str
    state_reason: str | None
    manifest_digest: str | None
    const_digest: str | None

    @property
    def ok(self) -> bool:
        return self.state == "ok"


#: The columns of :class:`GcRow`, in its order: gc's SELECT over ``artifacts``.
GC_COLUMNS = GcRow._fields
_GC_SORT = itemgetter(*(GC_COLUMNS.index(n) for n in ("name", "created_at", "key")))


def gc_rows_of_sqlite(rows: list[tuple[Any, ...]]) -> list[GcRow]:
    """:class:`GcRow` of a SQLite index's rows of :data:`GC_COLUMNS` as its driver
    returns them (times as naive UTC text), in :meth:`Index.entries`' order: sorted
    here on the text SQLite compares (an ORDER BY walks the name index and fetches each
    row's page at random: twice the time). Both readers of a folder cache use it (the
    SQL index and the standard library's). Sorts ``rows`` in place."""
    rows.sort(key=_GC_SORT)
    # sqlite_utc's fast path, inlined: two million calls at a million rows.
    new, parse, row = tuple.__new__, datetime.fromisoformat, GcRow
    try:
        return [
            new(row, (key, name, sig, program, exe, hlo, size, parse(created + "+00:00"), parse(used + "+00:00"), state, why, md, cd))
            for key, name, sig, program, exe, hlo, size, created, used, state, why, md, cd in rows
        ]
    except (TypeError, ValueError):  # a time not as the index writes it
        return [
            GcRow(key, name, sig, program, exe, hlo, size, sqlite_utc(created), sqlite_utc(used), state, why, md, cd)
            for key, name, sig, program, exe, hlo, size, created, used, state, why, md, cd in rows
        ]


#: A SQLite write's time is at least this much after the highest time in the index.
CLOCK_STEP = timedelta(microseconds=1)


def sqlite_clock(now: datetime, mark: datetime | None) -> datetime:
    """The SQLite index's clock (:mod:`aot.cache.index.engine`'s doc): this host's
    ``now``, but never before ``mark`` (the highest time the index holds) plus
    :data:`CLOCK_STEP`."""
    if mark is not None and mark + CLOCK_STEP > now:
        return mark + CLOCK_STEP
    return now


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a bulk read: building a million rows
    would otherwise run a full collection over the growing heap again and again (at a
    million rows it multiplies gc's plan time; benchmarks/README.md). Nothing built
    here is cyclic; the collector runs again as before on exit."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def sqlite_utc(value: str) -> datetime:
    """A time column of the SQLite index (naive UTC text) as a UTC datetime, as
    :func:`utc_value` reads it, with a fast path for the text the index writes."""
    try:
        return datetime.fromisoformat(value + "+00:00")  # tzinfo is timezone.utc
    except ValueError:  # an offset already, or not ISO text: the general path
        return utc_value(value)


def utc_value(value: datetime | str) -> datetime:
    """A time as a database driver returns it, timezone-aware UTC: SQLite's naive UTC
    text (as SQLAlchemy's SQLite ``DateTime`` parses it), or PostgreSQL's datetime."""
    if isinstance(value, str):
        parsed = datetime.fromisoformat(value)
    else:
        parsed = value
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=timezone.utc)
    return parsed if parsed.tzinfo is timezone.utc else parsed.astimezone(timezone.utc)


def fields_to_json(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as a JSON-able dict; datetimes become ISO 8601 strings."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        out[f.name] = value.isoformat() if isinstance(value, datetime) else value
    return out


def parse_utc(value: str) -> datetime:
    """Inverse of ``isoformat`` for the index's times; naive means UTC."""
    if value.endswith(("Z", "z")):  # Python 3.10's fromisoformat rejects "Z"
        value = value[:-1] + "+00:00"
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)
