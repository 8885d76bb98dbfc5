"""What a cache serves, as value objects: refs, their history, releases, and the cache's
description of itself. No SQLAlchemy here (the stdlib reader builds these too).

A **ref** names the key served for one (name, signature, environment). Every change of
a ref is appended to its history; the current ref is the one with the highest history
``seq``, a number the index hands out in commit order: no client clock and no copy's
finishing order ever decides what is served. A **release** is a label over a set of
refs: each promotion, warm-up or rollback of a label appends a new set, whose
``previous`` is the set it replaced, so a rollback is one step back that chain.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import socket
from dataclasses import asdict, dataclass, field
from datetime import datetime
from collections.abc import Callable, Collection, Iterable
from typing import Any

__all__ = [
    "COMMIT_VARIABLES",
    "CacheDescription",
    "Ref",
    "RefOrigin",
    "Release",
    "ReleaseMember",
    "ReleaseRemoval",
    "RemovedRelease",
    "default_commit",
    "pins_of",
    "signature_digest",
]

#: Environment variables a CI system sets to the commit being built, in the order read.
COMMIT_VARIABLES = ("GIT_COMMIT", "GITHUB_SHA", "CI_COMMIT_SHA", "BUILDKITE_COMMIT", "CIRCLE_SHA1")


def signature_digest(signature: str) -> str:
    """sha256 of a signature's text: the key column (a signature can be longer than an
    index entry may be)."""
    return hashlib.sha256(signature.encode()).hexdigest()


def default_commit() -> str | None:
    """The commit a CI system says it builds (:data:`COMMIT_VARIABLES`), or None."""
    for variable in COMMIT_VARIABLES:
        value = os.environ.get(variable, "").strip()
        if value:
            return value
    return None


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        return str(os.getuid()) if hasattr(os, "getuid") else "unknown"


@dataclass(frozen=True, slots=True)
class RefOrigin:
    """Who set a ref and why: recorded with every change of a ref and of a release."""

    source: str  # "warmup fixtures/warmup.toml", "compile", "promote candidate", ...
    host: str = field(default_factory=socket.gethostname)
    user: str = field(default_factory=_user)
    commit: str | None = field(default_factory=default_commit)
    release: str | None = None  # the label the change was recorded under, if any


@dataclass(frozen=True, slots=True)
class Ref:
    """The key served for (name, signature, environment), as one history record."""

    name: str
    signature: str
    env_fp: str
    key: str
    seq: int  # the index's order of ref changes: the highest is the current one
    set_at: datetime  # the index's clock when set (display only: seq orders)
    host: str
    user: str
    source: str
    release: str | None = None
    commit: str | None = None

    @property
    def slot(self) -> tuple[str, str, str]:
        """(name, signature, environment): what one ref decides."""
        return (self.name, self.signature, self.env_fp)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["set_at"] = self.set_at.isoformat()
        return data


@dataclass(frozen=True, slots=True)
class ReleaseMember:
    """One ref of a release set."""

    name: str
    signature: str
    env_fp: str
    key: str

    @property
    def slot(self) -> tuple[str, str, str]:
        return (self.name, self.signature, self.env_fp)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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

    def to_dict(self) -> dict[str, Any]:
        data = {f: getattr(self, f) for f in ("id", "label", "previous", "host", "user", "source", "commit")}
        data["created_at"] = self.created_at.isoformat()
        data["members"] = [m.to_dict() for m in self.members]
        return data


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


def pins_of(
    refs: Iterable[tuple[str, str]], current: Iterable[tuple[str, int, int | None]],
    members: Callable[[list[int]], Iterable[tuple[str, int]]], excluding: Collection[str] = (),
) -> dict[str, str]:
    """``{key: why}`` of the keys gc must keep, from the index's rows (both readers of
    the index answer ``pinned_keys`` with it): ``refs`` (key, name) of the current refs;
    ``current`` (label, id, previous) of each label's current set; ``members(set ids)``
    (key, set id) of those sets' members. A label in ``excluding`` counts as gone."""
    pins: dict[str, str] = {}
    for key, name in refs:
        pins.setdefault(key, f"served ref of {name}")
    sets = {label: (set_id, previous) for label, set_id, previous in current if label not in excluding}
    live = {set_id: label for label, (set_id, _) in sets.items()}
    live.update({p: f"{label} (rollback target)" for label, (_, p) in sets.items() if p is not None})
    if live:
        for key, set_id in members(list(live)):
            pins.setdefault(key, f"release {live[set_id]}")
    return pins
