"""What a cache serves, as value objects: refs, their history, releases, and the cache's
description of itself. No SQLAlchemy here (the stdlib reader builds these too).

A **ref** names the key served for one (name, signature, environment). Every change of
a ref is appended to its history; the current ref is the one with the highest history
``seq``, a number the index hands out in commit order: no client clock and no copy's
finishing order ever decides what is served. A **release** is a label over a set of
refs (:class:`ReleaseMember`): each promotion, warm-up or rollback of a label appends a
new set, whose ``previous`` is the set it replaced, so a rollback is one step back that
chain.

What every serving process reads is here (a ref, a release member); the value objects
only the SQL index builds (a release set, its removal, the cache's description of
itself) are in :mod:`aot.cache.index.releases`, which serving never imports.
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
    "Ref",
    "RefOrigin",
    "ReleaseMember",
    "current_user",
    "default_commit",
    "pin_reasons",
    "pins_of",
    "reachable_sets",
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


def current_user() -> str:
    """Who runs this process, as a ref, a release set and a captured GPU record it."""
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        return str(os.getuid()) if hasattr(os, "getuid") else "unknown"


@dataclass(frozen=True, slots=True)
class RefOrigin:
    """Who set a ref and why: recorded with every change of a ref and of a release."""

    source: str  # "warmup fixtures/warmup.toml", "compile", "promote candidate", ...
    host: str = field(default_factory=socket.gethostname)
    user: str = field(default_factory=current_user)
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


def reachable_sets(sets: Iterable[tuple[str, int, int | None]], excluding: Collection[str] = ()) -> dict[int, str]:
    """``{set id: why}`` of every set a label serves or a ``rollback`` could reach:
    each label's current set (its highest id) and every set down its ``previous``
    chain (a rollback goes one step back that chain each time). ``sets`` (label, id,
    previous) are all the index's sets; a label in ``excluding`` counts as gone."""
    by_id = {set_id: (label, previous) for label, set_id, previous in sets}
    current: dict[str, int] = {}
    for set_id, (label, _) in by_id.items():
        if label not in excluding and set_id > current.get(label, -1):
            current[label] = set_id
    reach: dict[int, str] = {}
    for label, set_id in sorted(current.items()):
        reach.setdefault(set_id, label)
        step, seen = 0, {set_id}
        previous = by_id[set_id][1]
        while previous is not None and previous in by_id and previous not in seen:
            step += 1
            seen.add(previous)
            reach.setdefault(previous, f"{label} (rollback target)" if step == 1
                             else f"{label} (rollback target, {step} steps back)")
            previous = by_id[previous][1]
    return reach


def pin_reasons(
    refs: Iterable[tuple[str, str]], sets: Iterable[tuple[str, int, int | None]],
    members: Callable[[list[int]], Iterable[tuple[str, int]]], excluding: Collection[str] = (),
) -> dict[str, list[str]]:
    """``{key: [why, ...]}`` of the keys gc must keep, every reason (a served ref first,
    then each release set that names it): ``refs`` (key, name) of the current refs;
    ``sets`` (label, id, previous) of every release set; ``members(set ids)`` (key, set
    id) of those sets' members. A label in ``excluding`` counts as gone."""
    pins: dict[str, list[str]] = {}
    for key, name in refs:
        why = f"served ref of {name}"
        if why not in pins.setdefault(key, []):
            pins[key].append(why)
    live = reachable_sets(sets, excluding)
    ids = sorted(live)
    rows: list[tuple[str, int]] = []
    for i in range(0, len(ids), 500):  # SQLite's variable limit
        rows.extend((key, set_id) for key, set_id in members(ids[i:i + 500]))
    for key, set_id in sorted(rows, key=lambda r: r[1], reverse=True):  # the current set first
        why = f"release {live[set_id]}"
        if why not in pins.setdefault(key, []):
            pins[key].append(why)
    return pins


def pins_of(
    refs: Iterable[tuple[str, str]], sets: Iterable[tuple[str, int, int | None]],
    members: Callable[[list[int]], Iterable[tuple[str, int]]], excluding: Collection[str] = (),
) -> dict[str, str]:
    """``{key: why}`` of the keys gc must keep (both readers of the index answer
    ``pinned_keys`` with it): the first reason of :func:`pin_reasons`. Every set a
    rollback could reach is pinned, not only the current one and one step back, so
    that no rollback lands on collected entries."""
    return {key: whys[0] for key, whys in pin_reasons(refs, sets, members, excluding).items()}
