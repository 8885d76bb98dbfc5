"""What differs between two release labels (``aot release diff A B``): the members
added, removed or changed from A's current set to B's, and for a changed member why
-- the fingerprint parts that differ, compared as ``aot why`` compares them
(:meth:`aot.fingerprint.Fingerprint.diff`, A's value first).

Members are matched by what a replica looks up: (name, signature, environment). A
member of A and one of B that share name and signature but not environment (the
other's only one of that signature) are one member changed in its environment (a new
jaxlib, libtpu or topology), not one removed and one added. Reads the index only:
no JAX, no device.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.cache.units import counted
from aot.fingerprint import Fingerprint, PartDifference

if TYPE_CHECKING:
    from aot.cache.index.refs import ReleaseMember
    from aot.cache.index.releases import Release
    from aot.cache.store import ArtifactStore

__all__ = ["MemberChange", "ReleaseDiff", "release_diff"]

#: The marks of each kind of change in the text output (as a unified diff marks lines).
_MARKS = {"added": "+", "removed": "-", "changed": "~"}


@dataclass(frozen=True, slots=True)
class MemberChange:
    """One member that differs: ``added`` (in B only), ``removed`` (in A only) or
    ``changed`` (another key for the same name and signature)."""

    change: str
    name: str
    signature: str
    key_a: str | None
    key_b: str | None
    target_a: str | None  # what the member is for (tpu:v5e:2x2, cpu x8); None: unknown
    target_b: str | None
    differences: tuple[PartDifference, ...] = ()  # of a changed member, A's value first
    note: str | None = None  # why a changed member's parts cannot be compared

    def describe(self) -> list[str]:
        keys = " -> ".join(k[:12] for k in (self.key_a, self.key_b) if k is not None)
        targets = " -> ".join(dict.fromkeys(t or "unknown" for t, k in ((self.target_a, self.key_a),
                                                                         (self.target_b, self.key_b)) if k))
        lines = [f"  {_MARKS[self.change]} {keys}  {targets}  {self.name} ({self.signature})"]
        lines += [f"      {d.describe()}" for d in self.differences]
        if self.note is not None:
            lines.append(f"      {self.note}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "change": self.change, "name": self.name, "signature": self.signature,
            "key_a": self.key_a, "key_b": self.key_b, "target_a": self.target_a, "target_b": self.target_b,
            "differences": [d.to_dict() for d in self.differences], "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class ReleaseDiff:
    """The members that differ from release A's current set to B's, and how many are
    the same."""

    a: Release  # without members: they are in ``changes``
    b: Release
    changes: tuple[MemberChange, ...]
    same: int

    def count(self, change: str) -> int:
        return sum(1 for c in self.changes if c.change == change)

    def summary(self) -> str:
        counts = ", ".join(f"{self.count(kind)} {kind}" for kind in _MARKS)
        return (f"{self.a.label} (set {self.a.id}) -> {self.b.label} (set {self.b.id}): {counts}, "
                f"{counted(self.same, 'member')} the same")

    def describe(self) -> str:
        lines = [self.summary()]
        for change in self.changes:
            lines += change.describe()
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a.to_dict(), "b": self.b.to_dict(),
            "changes": [c.to_dict() for c in self.changes],
            **{kind: self.count(kind) for kind in _MARKS}, "same": self.same,
        }


def release_diff(cache: ArtifactStore, a: str, b: str) -> ReleaseDiff:
    """The members that differ from label ``a``'s current set to ``b``'s (CacheError
    for an unknown label), in name and signature order."""
    from dataclasses import replace

    first, second = cache.release(a), cache.release(b)
    in_a = {m.slot: m for m in first.members}
    in_b = {m.slot: m for m in second.members}
    removed = [m for slot, m in in_a.items() if slot not in in_b]
    added = [m for slot, m in in_b.items() if slot not in in_a]
    pairs = [(in_a[slot], in_b[slot]) for slot in in_a.keys() & in_b.keys() if in_a[slot].key != in_b[slot].key]
    same = sum(1 for slot in in_a.keys() & in_b.keys() if in_a[slot].key == in_b[slot].key)
    # One signature in another environment on each side: the same member, changed.
    lone_a, lone_b = _by_signature(removed), _by_signature(added)
    for signature, (m_a, *more_a) in lone_a.items():
        found = lone_b.get(signature)
        if not more_a and found is not None and len(found) == 1:
            pairs.append((m_a, found[0]))
            removed.remove(m_a)
            added.remove(found[0])
    members = [*(m for m in removed), *(m for m in added), *(m for pair in pairs for m in pair)]
    manifests = cache.reader.manifests({m.key for m in members})
    parsed = {key: _fingerprints(text) for key, text in manifests.items()}
    targets = _targets({m.key: parsed.get(m.key) for m in members})
    changes = [MemberChange("removed", m.name, m.signature, m.key, None, targets.get(m.key), None) for m in removed]
    changes += [MemberChange("added", m.name, m.signature, None, m.key, None, targets.get(m.key)) for m in added]
    for m_a, m_b in pairs:
        fa, fb = parsed.get(m_a.key), parsed.get(m_b.key)
        differences: tuple[PartDifference, ...] = ()
        note = None
        if fa is None or fb is None:
            lost = ", ".join(k[:12] for k, f in ((m_a.key, fa), (m_b.key, fb)) if f is None)
            note = f"parts not compared: entry {lost} is not stored (or its manifest is unreadable)"
        else:
            differences = fa[0].diff(fb[0]) + fa[1].diff(fb[1])
        changes.append(MemberChange("changed", m_a.name, m_a.signature, m_a.key, m_b.key,
                                    targets.get(m_a.key), targets.get(m_b.key), differences, note))
    changes.sort(key=lambda c: (c.name, c.signature, list(_MARKS).index(c.change), c.target_a or c.target_b or ""))
    return ReleaseDiff(replace(first, members=()), replace(second, members=()), tuple(changes), same)


def _by_signature(members: list[ReleaseMember]) -> dict[tuple[str, str], list[ReleaseMember]]:
    out: dict[tuple[str, str], list[ReleaseMember]] = defaultdict(list)
    for m in members:
        out[(m.name, m.signature)].append(m)
    return out


def _fingerprints(manifest: str) -> tuple[Fingerprint, Fingerprint] | None:
    """(program, environment) of a stored manifest, read as data (no JAX); None when
    it cannot be read."""
    try:
        data = json.loads(manifest)
        return Fingerprint.from_dict(data["program"]), Fingerprint.from_dict(data["environment"])
    except (ValueError, KeyError, TypeError):
        return None


def _targets(fingerprints: dict[str, tuple[Fingerprint, Fingerprint] | None]) -> dict[str, str]:
    from aot.targets import environment_name

    return {key: environment_name(f[1].as_dict()) for key, f in fingerprints.items() if f is not None}
