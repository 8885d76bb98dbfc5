"""What only the SQL index builds about releases and the cache itself, as value objects:
a release set, the plan of removing labels, and the cache's description of itself.

Apart from :mod:`aot.cache.index.refs` (refs and release members, which every serving
process reads) because serving never makes one of these, and each frozen dataclass
costs a serving process's start-up its creation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from aot.cache.index.refs import ReleaseMember

__all__ = [
    "CacheDescription", "Release", "ReleaseRemoval", "RemovedRelease", "credit_source", "label_hint",
    "promote_source", "rollback_source",
]


@dataclass(frozen=True, slots=True)
class Release:
    """One set a label pointed to: the current one is the label's highest ``id``."""

    id: int
    label: str
    previous: int | None  # the set this one replaced (a rollback goes back to it)
    created_at: datetime  # the index's clock
    host: str
    user: str
    source: str
    commit: str | None
    members: tuple[ReleaseMember, ...] = ()

    def keys(self) -> frozenset[str]:
        return frozenset(m.key for m in self.members)

    @property
    def rolled_back(self) -> tuple[int, int] | None:
        """(the set restored, the set left) when a rollback made this set; None
        otherwise (or a rollback recorded before the source named them)."""
        found = _ROLLBACK.fullmatch(self.source)
        return None if found is None else (int(found[1]), int(found[2]))

    @property
    def promoted_from(self) -> tuple[str, int | None] | None:
        """(the label promoted, its set) when a promotion made this set; the set is
        None for a promotion recorded before the source named it. None otherwise."""
        found = _PROMOTE.fullmatch(self.source)
        if found is None:
            return None
        return found[1], None if found[2] is None else int(found[2])

    def move(self) -> str:
        """The move that made this set, in words: ``promoted from candidate set 5``,
        ``rolled back to set 3 from set 4`` or ``declared by warmup serve.toml``."""
        promoted = self.promoted_from
        if promoted is not None:
            return f"promoted from {promoted[0]}" + (f" set {promoted[1]}" if promoted[1] is not None else "")
        back = self.rolled_back
        if back is not None:
            return f"rolled back to set {back[0]} from set {back[1]}"
        if self.source.startswith("rollback"):  # recorded before rollbacks named their sets
            return "rolled back"
        return f"declared by {self.source}"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            f: getattr(self, f) for f in ("id", "label", "previous", "host", "user", "source", "commit")
        }
        data["created_at"] = self.created_at.isoformat()
        promoted = self.promoted_from
        data["promoted_from"] = None if promoted is None else {"label": promoted[0], "set": promoted[1]}
        data["members"] = [m.to_dict() for m in self.members]
        return data


#: The source of a set a rollback made (:func:`rollback_source`).
_ROLLBACK = re.compile(r"rollback to set (\d+) from set (\d+)")


#: The source of a set a promotion made (:func:`promote_source`); labels have no spaces.
_PROMOTE = re.compile(r"promote (\S+)(?: set (\d+))?")

#: Between the sources of the manifests that added members to one run's set.
_CREDIT_SEPARATOR = ", "


def label_hint(label: str, labels: Iterable[str]) -> str:
    """`` (did you mean 'candidate'?)`` when labels of ``labels`` are close to
    ``label`` (a mistyped one), each once; else ""."""
    import difflib

    close = difflib.get_close_matches(label, sorted(set(labels)), n=3)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def promote_source(label: str, set_id: int) -> str:
    """The source recorded with the set a promotion makes: the label promoted and the
    set it pointed to then (the set's provenance, after the label has moved on)."""
    return f"promote {label} set {set_id}"


def credit_source(recorded: str, source: str) -> str:
    """The source of a run's set after ``source`` (a warm-up of another manifest of
    the run) added members to it: every manifest that did is credited, once."""
    if source in recorded.split(_CREDIT_SEPARATOR):
        return recorded
    return f"{recorded}{_CREDIT_SEPARATOR}{source}"


def rollback_source(restored: int, left: int) -> str:
    """The source recorded with the set a rollback makes: the set whose members it
    serves again, and the set it stops serving."""
    return f"rollback to set {restored} from set {left}"


@dataclass(frozen=True, slots=True)
class RemovedRelease:
    """A label ``aot release rm`` removes: its current set and the set a rollback would
    go back to (both with members: what they pinned), and how many sets its history
    held (all go)."""

    label: str
    current: Release
    rollback: Release | None
    sets: int

    def describe(self) -> str:
        def members(release: Release) -> str:
            n = len(release.members)
            return f"{n} member{'s' if n != 1 else ''}"

        back = (f"rollback set {self.rollback.id} ({members(self.rollback)})"
                if self.rollback is not None else "no rollback set")
        return (f"{self.label}: current set {self.current.id} ({members(self.current)}), "
                f"{back}, {self.sets} set{'s' if self.sets != 1 else ''} in its history")

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "current": self.current.to_dict(),
            "rollback": None if self.rollback is None else self.rollback.to_dict(),
            "sets": self.sets,
        }


@dataclass(frozen=True, slots=True)
class ReleaseRemoval:
    """What ``aot release rm`` removes (or removed): the labels, the stored entries
    only they pinned (``unpinned``: gc may collect them from then on) and the members
    of their sets that stay pinned by a ref or another label (with why)."""

    releases: tuple[RemovedRelease, ...]
    unpinned: tuple[ReleaseMember, ...]
    still_pinned: tuple[tuple[ReleaseMember, str], ...]
    executed: bool = False

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(r.label for r in self.releases)

    def summary(self) -> str:
        n = len(self.unpinned)
        labels = f"{len(self.releases)} release label{'s' if len(self.releases) != 1 else ''}"
        entries = f"{n} entr{'y' if n == 1 else 'ies'}"
        if self.executed:
            what = f"unpinned {entries} (gc may collect {'it' if n == 1 else 'them'})" if n else "no entry unpinned"
            return f"removed {labels} ({', '.join(self.labels)}); {what}"
        what = f"would unpin {entries} (gc may collect {'it' if n == 1 else 'them'})" if n else "no entry unpinned"
        return f"would remove {labels} ({', '.join(self.labels)}); {what}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "executed": self.executed,
            "releases": [r.to_dict() for r in self.releases],
            "unpinned": [m.to_dict() for m in self.unpinned],
            "still_pinned": [{**m.to_dict(), "pinned_by": why} for m, why in self.still_pinned],
        }


@dataclass(frozen=True, slots=True)
class CacheDescription:
    """What a shared cache records about itself when created: where its blobs live,
    how they are compressed and which artifact format it holds, so that a client that
    forgets ``--blobs`` cannot misread it."""

    blob_location: str | None  # None: blobs in the index's own database
    compression: str
    format_version: int
    created_at: datetime

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["created_at"] = self.created_at.isoformat()
        return data
