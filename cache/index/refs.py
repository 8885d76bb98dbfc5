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
