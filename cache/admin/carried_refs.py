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

from aot.cache.index.refs import Ref, RefOrigin, ReleaseMember
from aot.errors import CacheError
from aot.cache.units import counted

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore

log = logging.getLogger(__name__)

__all__ = ["CarriedRefs", "RefsOutcome", "apply_refs", "carried_refs", "log_refs", "release_to_copy", "unchanged_refs"]


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


def release_to_copy(source: ArtifactStore, label: str) -> tuple[ReleaseMember, ...]:
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


def carried_refs(source: ArtifactStore, keys: Collection[str], release: str | None = None) -> CarriedRefs:
    """The source's current refs that name one of ``keys``, or (``release``) the
    members of that label's current set."""
    if release is not None:
        return CarriedRefs(release_to_copy(source, release), release)
    wanted = set(keys)
    return CarriedRefs(tuple(
        ReleaseMember(r.name, r.signature, r.env_fp, r.key) for r in source.reader.refs() if r.key in wanted
    ))


def apply_refs(
    destination: ArtifactStore, carried: CarriedRefs, present: Iterable[str], *, source: str, overwrite: bool = False,
) -> RefsOutcome:
    """Writes the carried refs whose key is stored at ``destination`` (``present``:
    the keys the copy left there intact), by the rules of this module. ``source``
    is recorded as the refs' origin ("pull from ...")."""
    if not carried.refs:
        return RefsOutcome()
    targets, missing = _split(carried, present)
    origin = RefOrigin(source, release=carried.release)
    current_refs = destination.index.refs()
    current = {r.slot: r.key for r in current_refs}
    if carried.release is not None:
        if missing:
            outcome = RefsOutcome(problem=_release_problem(carried, missing))
            log_refs(outcome, current_refs)
            return outcome
        _, changed = destination.index.declare_release(carried.release, _targets(targets), origin)
        log.info("recorded release %s (%d entries) at %s", carried.release, len(targets),
                 destination.display_location)
        return RefsOutcome(_members(changed), (), carried.release)
    changed = destination.index.set_refs(_targets(targets), origin, keep_existing=not overwrite)
    if not overwrite:  # what set_refs kept: another copy may have filled a slot since the read above
        current_refs = destination.index.refs()
        current = {r.slot: r.key for r in current_refs}
    outcome = RefsOutcome(_members(changed), _kept(targets, current, overwrite))
    log_refs(outcome, current_refs)
    return outcome


def unchanged_refs(
    carried: CarriedRefs, present: Iterable[str], current_refs: Iterable[Ref], *, overwrite: bool = False,
) -> RefsOutcome | None:
    """What :func:`apply_refs` returns when it would write nothing, decided from the
    destination's current refs (``current_refs``) without writing or logging
    (:func:`log_refs` logs it); None when it would write: a release is recorded (a new
    set of its label, whenever its members are all there), or a ref is set (a slot
    without one, or, with ``overwrite``, naming another key: as
    :meth:`~aot.cache.index.refs_sql.IndexRefs.set_refs` decides)."""
    if not carried.refs:
        return RefsOutcome()
    targets, missing = _split(carried, present)
    if carried.release is not None:
        return RefsOutcome(problem=_release_problem(carried, missing)) if missing else None
    current = {r.slot: r.key for r in current_refs}
    if any(current.get(m.slot) != m.key and (overwrite or m.slot not in current) for m in targets):
        return None
    return RefsOutcome((), _kept(targets, current, overwrite))


def log_refs(outcome: RefsOutcome, current_refs: Iterable[Ref]) -> None:
    """Logs what :func:`apply_refs` did not do: the release it did not record, the
    destination's refs it kept (``current_refs``: the destination's, before the copy)."""
    if outcome.problem is not None:
        log.warning("%s", outcome.problem)
    current = {r.slot: r.key for r in current_refs} if outcome.kept else {}
    for member in outcome.kept:
        log.info(
            "kept the destination's ref of %s (%s): %s, not the source's %s (--refs copies it)",
            member.name, member.signature, current[member.slot][:12], member.key[:12],
        )


def _split(carried: CarriedRefs, present: Iterable[str]) -> tuple[list[ReleaseMember], list[ReleaseMember]]:
    """The carried refs whose key is stored at the destination, and the others."""
    here = set(present)
    return [m for m in carried.refs if m.key in here], [m for m in carried.refs if m.key not in here]


def _release_problem(carried: CarriedRefs, missing: list[ReleaseMember]) -> str:
    return (
        f"release {carried.release!r} not recorded: {len(missing)} of its "
        f"{counted(len(carried.refs), 'entry')} are not stored here (first: {missing[0].name} {missing[0].signature}, "
        f"{missing[0].key[:12]}); copy again once they are"
    )


def _kept(
    targets: Iterable[ReleaseMember], current: Mapping[tuple[str, str, str], str], overwrite: bool,
) -> tuple[ReleaseMember, ...]:
    """The targets whose slot the destination declares another key for (kept unless ``overwrite``)."""
    return () if overwrite else tuple(m for m in targets if current.get(m.slot, m.key) != m.key)


def _targets(members: Iterable[ReleaseMember]) -> list[tuple[str, str, str, str]]:
    return [(m.name, m.signature, m.env_fp, m.key) for m in members]


def _members(refs: Iterable[Any]) -> tuple[ReleaseMember, ...]:
    return tuple(ReleaseMember(r.name, r.signature, r.env_fp, r.key) for r in refs)
