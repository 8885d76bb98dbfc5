"""The refs a copy carries (push, pull, bundles) and how they land at the destination.

A copy keeps what the destination serves unless asked otherwise:

- by default a source ref is written only for a slot (name, signature, environment)
  the destination has no ref for, so the destination serves what the source declared
  there and keeps its own declaration everywhere else;
- ``overwrite`` (``--refs``) replaces the destination's refs of the copied slots with
  the source's;
- a release (``--release LABEL``) copies the members of the label's current set: their
  refs are written (asked for) and the label is recorded at the destination as a new
  set whose source says where it came from.

Refs are written once, after every entry of the copy is committed, and only for keys
stored intact at the destination: a ref never names a key whose row or blobs are not
there yet, whatever the number of jobs or the order in which copies finished.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.cache.index.refs import RefOrigin, ReleaseMember
from aot.cache.reports.reads import reads_of
from aot.errors import CacheError
from aot.cache.units import counted

if TYPE_CHECKING:
    from aot.cache.cache import Cache

log = logging.getLogger(__name__)

__all__ = ["CarriedRefs", "RefsOutcome", "apply_refs", "carried_refs", "release_to_copy"]


@dataclass(frozen=True, slots=True)
class CarriedRefs:
    """The refs a copy brings: the source's current refs of the entries copied, or the
    members of one release (``release`` is then its label)."""

    refs: tuple[ReleaseMember, ...] = ()
    release: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"release": self.release, "refs": [m.to_dict() for m in self.refs]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> CarriedRefs:
        """From :meth:`to_dict` (a bundle's header); an old bundle has none: empty."""
        if not data:
            return cls()
        refs = tuple(
            ReleaseMember(str(m["name"]), str(m["signature"]), str(m["env_fp"]), str(m["key"]))
            for m in data.get("refs") or ()
        )
        release = data.get("release")
        return cls(refs, None if release is None else str(release))


@dataclass(frozen=True, slots=True)
class RefsOutcome:
    """What a copy did to the destination's refs."""

    set: tuple[ReleaseMember, ...] = ()  # refs written (new, or replaced when asked)
    kept: tuple[ReleaseMember, ...] = ()  # source refs not written: the destination has its own
    release: str | None = None  # the label recorded at the destination
    problem: str | None = None  # why the release was not recorded

    def to_dict(self) -> dict[str, Any]:
        return {
            "set": [m.to_dict() for m in self.set],
            "kept": [m.to_dict() for m in self.kept],
            "release": self.release,
            "problem": self.problem,
        }


def release_to_copy(source: Cache, label: str) -> tuple[ReleaseMember, ...]:
    """The members of ``label``'s current set in ``source``; a missing label is an
    error naming it."""
    release = source.index.release_set(label)
    if release is None:
        known = ", ".join(r.label for r in source.index.releases()) or "none"
        raise CacheError(
            f"no release labelled {label!r} in the cache at {source.display_location} (labels: {known}); "
            "`aot release ls` there lists them"
        )
    return release.members


def carried_refs(source: Cache, keys: Collection[str], release: str | None = None) -> CarriedRefs:
    """The source's current refs that name one of ``keys``, or (``release``) the
    members of that label's current set."""
    if release is not None:
        return CarriedRefs(release_to_copy(source, release), release)
    wanted = set(keys)
    return CarriedRefs(tuple(
        ReleaseMember(r.name, r.signature, r.env_fp, r.key) for r in reads_of(source).refs() if r.key in wanted
    ))


def apply_refs(
    destination: Cache, carried: CarriedRefs, present: Iterable[str], *, source: str, overwrite: bool = False,
) -> RefsOutcome:
    """Writes the carried refs whose key is stored at ``destination`` (``present``:
    the keys the copy left there intact), by the rules of this module. ``source``
    is recorded as the refs' origin ("pull from ...")."""
    if not carried.refs:
        return RefsOutcome()
    here = set(present)
    targets = [m for m in carried.refs if m.key in here]
    missing = [m for m in carried.refs if m.key not in here]
    origin = RefOrigin(source, release=carried.release)
    current = {r.slot: r.key for r in destination.index.refs()}
    if carried.release is not None:
        if missing:
            problem = (
                f"release {carried.release!r} not recorded: {len(missing)} of its "
                f"{counted(len(carried.refs), 'entry')} are not stored here (first: {missing[0].name} {missing[0].signature}, "
                f"{missing[0].key[:12]}); copy again once they are"
            )
            log.warning("%s", problem)
            return RefsOutcome(problem=problem)
        set_id = destination.index.open_release(carried.release, origin)
        changed = destination.index.set_refs(_targets(targets), origin, release_id=set_id)
        log.info("recorded release %s (%d entries) at %s", carried.release, len(targets),
                 destination.display_location)
        return RefsOutcome(_members(changed), (), carried.release)
    changed = destination.index.set_refs(_targets(targets), origin, keep_existing=not overwrite)
    kept = () if overwrite else tuple(m for m in targets if current.get(m.slot, m.key) != m.key)
    for member in kept:
        log.info(
            "kept the destination's ref of %s (%s): %s, not the source's %s (--refs copies it)",
            member.name, member.signature, current[member.slot][:12], member.key[:12],
        )
    return RefsOutcome(_members(changed), kept)


def _targets(members: Iterable[ReleaseMember]) -> list[tuple[str, str, str, str]]:
    return [(m.name, m.signature, m.env_fp, m.key) for m in members]


def _members(refs: Iterable[Any]) -> tuple[ReleaseMember, ...]:
    return tuple(ReleaseMember(r.name, r.signature, r.env_fp, r.key) for r in refs)
