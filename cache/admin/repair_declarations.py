"""``aot repair``'s release sets, captured GPUs and refs: salvaged where their rows could
be read, else rebuilt from their journal blobs (schema 11, :mod:`aot.cache.index.journal`),
and the refs of a lost ``refs`` table rebuilt from the release sets and entries.

A release set whose row is lost comes back from the newest journal blob of its id, with
its label, ``previous`` (so ``aot release history`` and rollbacks follow the same chain),
commit and the members that name a recovered entry. A captured GPU comes back from the
newest journal blob of its name. When the refs could not be read, each (name, signature,
environment) of a recovered entry gets a ref again: the key the newest release set
naming the slot names, else the slot's newest entry (what a warm-up would have set);
each such ref has one history record (source ``repair``). What nothing journals is
named, with what to run instead (:data:`NOT_JOURNALED`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from aot.cache.admin.lost import Lost, LostKind
from aot.cache.admin.manifest_blobs import small_blob
from aot.cache.index.journal import RELEASE, TARGET, JournaledRelease, JournaledTarget, read_journal
from aot.cache.index.refs import current_user, signature_digest
from aot.cache.index.salvage import SalvagedTable
from aot.cache.storage.content import ContentStore
from aot.cache.storage.objectstore import BlobStat

log = logging.getLogger(__name__)

__all__ = ["NOT_JOURNALED", "Declarations", "rebuild_declarations"]

#: The tables of an index lost whole that nothing in the blob store journals: what each
#: held, and what to run instead.
NOT_JOURNALED: Mapping[str, tuple[str, str]] = {
    "call_stats": ("serving statistics (calls, loads, misses, recompiles) are not journaled",
                   "they count again from the next calls (`aot stats`)"),
    "ref_history": ("the history of each ref is not journaled",
                    "each ref rebuilt has one record (source repair); `aot release history LABEL` shows the "
                    "release sets"),
    "jit_entries": ("entries of JAX's own cache (aot.jax_cache) are not journaled",
                    "JAX compiles them again on their next miss; `aot gc` removes their blobs"),
    "jit_stats": ("hits and misses of JAX's own cache are not journaled", "they count again from the next calls"),
    "default_release": ("the default release label is not journaled", "run `aot release default LABEL` again"),
}

#: The source of a ref (and its history record) rebuilt by repair.
REPAIR_SOURCE = "repair: rebuilt from the blob store"


@dataclass(slots=True)
class Declarations:
    """The rows repair writes for releases, captured GPUs, the journal and refs."""

    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: Journal blobs the new index references: digest -> (size, created as SQLite text).
    blobs: dict[str, tuple[int, str]] = field(default_factory=dict)
    releases: list[str] = field(default_factory=list)  # "label (set N)" of every set rebuilt
    targets: list[str] = field(default_factory=list)  # names of the captured GPUs rebuilt
    refs: int = 0  # refs rebuilt
    #: Every journal blob read: those no new row names are older journals of a set or
    #: capture (changed since), which gc removes; no entry's blobs lost.
    journals: set[str] = field(default_factory=set)
    lost: list[Lost] = field(default_factory=list)


def sqlite_time(value: datetime) -> str:
    """A time as the SQLite index stores it (naive UTC text, as a salvaged row has it)."""
    return value.astimezone(timezone.utc).replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S.%f")


def _rows(tables: Mapping[str, SalvagedTable], name: str) -> list[dict[str, Any]]:
    table = tables.get(name)
    return table.dicts() if table is not None else []


def rebuild_declarations(
    tables: Mapping[str, SalvagedTable], store: ContentStore, candidates: Sequence[BlobStat],
    artifacts: Sequence[Mapping[str, Any]], *, whole_index_lost: bool,
) -> Declarations:
    """The rows of releases, members, captured GPUs, journal and refs for the new index:
    ``tables`` as salvaged, ``candidates`` the stored blobs no recovered entry
    references, ``artifacts`` the rows of every recovered entry."""
    out = Declarations()
    keys = {a["key"] for a in artifacts}
    found_sets: dict[int, tuple[JournaledRelease, BlobStat]] = {}
    found_targets: dict[str, tuple[JournaledTarget, BlobStat]] = {}
    sizes: dict[str, int] = {}
    for stat in sorted(candidates, key=lambda s: s.modified):  # of one set or name, the newest last
        data = small_blob(store, stat)
        found = read_journal(data) if data is not None else None
        if found is not None and data is not None:
            sizes[stat.digest] = len(data)
            out.journals.add(stat.digest)
        if isinstance(found, JournaledRelease):
            found_sets[found.id] = (found, stat)
        elif isinstance(found, JournaledTarget):
            if found.name not in found_targets or found_targets[found.name][0].captured_at <= found.captured_at:
                found_targets[found.name] = (found, stat)

    releases = _rows(tables, "releases")
    members = _rows(tables, "release_members")
    ids = {int(r["id"]) for r in releases}
    journal = [j for j in _rows(tables, "journal") if j["digest"] in sizes]  # its blob stored and read
    dropped_sets: set[int] = set()
    for set_id, (set_, stat) in sorted(found_sets.items()):
        if set_id in ids:
            continue  # its row was read: the index's, not the journal's
        row = set_.row()
        row["created_at"] = sqlite_time(set_.created_at)
        releases.append(row)
        ids.add(set_id)
        named = [m for m in set_.members if m.key in keys]
        if len(named) < len(set_.members):
            dropped_sets.add(set_id)
        members += [{"release_id": set_id, "env_fp": m.env_fp, "name": m.name,
                     "signature_digest": signature_digest(m.signature), "signature": m.signature, "key": m.key}
                    for m in set_.members]
        journal.append({"kind": RELEASE, "name": str(set_id), "digest": stat.digest,
                        "written_at": sqlite_time(stat.modified)})
        out.releases.append(f"{set_.label} (set {set_id})")
        log.info("repair: rebuilt release set %s of %s from its journal blob %s", set_id, set_.label, stat.digest[:12])
    unique = {(int(m["release_id"]), m["env_fp"], m["name"], m["signature_digest"]): m for m in members}
    members = list(unique.values())  # a salvaged member of a set rebuilt: once
    kept_members = [m for m in members if m["key"] in keys and int(m["release_id"]) in ids]
    dropped_sets |= {int(m["release_id"]) for m in members if m not in kept_members}
    if len(members) > len(kept_members):
        out.lost.append(Lost(kind=LostKind.DROPPED_ROWS, table="release_members", count=len(members) - len(kept_members),
                             reason="the entry (or release set) they name was not recovered"))

    targets = _rows(tables, "captured_targets")
    names = {t["name"] for t in targets}
    for name, (target, stat) in sorted(found_targets.items()):
        if name in names:
            continue
        row = dict(target.values)
        row["captured_at"] = sqlite_time(target.captured_at)
        targets.append(row)
        names.add(name)
        journal.append({"kind": TARGET, "name": name, "digest": stat.digest, "written_at": sqlite_time(stat.modified)})
        out.targets.append(name)
        log.info("repair: rebuilt captured GPU %s from its journal blob %s", name, stat.digest[:12])

    # A journal row stays only for a set or capture kept unchanged (a changed one is
    # journaled again by the next change of a release).
    journal = [j for j in journal if (j["kind"] == RELEASE and j["name"].isdigit() and int(j["name"]) in ids
                                      and int(j["name"]) not in dropped_sets)
               or (j["kind"] == TARGET and j["name"] in names)]
    journal = list({(j["kind"], j["name"]): j for j in journal}.values())  # the rebuilt one last: it wins
    for j in journal:
        out.blobs[j["digest"]] = (sizes[j["digest"]], str(j["written_at"]))
    out.tables.update(releases=releases, release_members=kept_members, captured_targets=targets, journal=journal)
    _refs(out, tables, artifacts, releases, kept_members)
    if whole_index_lost:
        for table, (what, advice) in NOT_JOURNALED.items():
            out.lost.append(Lost(kind=LostKind.NOT_JOURNALED, table=table, reason=what, advice=advice))
    return out


def _refs(out: Declarations, tables: Mapping[str, SalvagedTable], artifacts: Sequence[Mapping[str, Any]],
          releases: Sequence[Mapping[str, Any]], members: Sequence[Mapping[str, Any]]) -> None:
    """The refs kept (those naming a recovered entry) and, when the refs table could not
    be read whole, a ref for each slot of a recovered entry that has none."""
    keys = {a["key"] for a in artifacts}
    refs = [r for r in _rows(tables, "refs") if r["key"] in keys]
    read = _rows(tables, "refs")
    if len(read) > len(refs):
        out.lost.append(Lost(kind=LostKind.DROPPED_ROWS, table="refs", count=len(read) - len(refs),
                             reason="the entry they name was not recovered"))
    history = _rows(tables, "ref_history")
    table = tables.get("refs")
    if table is None or table.error is not None:  # lost rows: every slot without a ref gets one
        sets = {int(r["id"]): r for r in releases}
        by_slot: dict[tuple[str, str, str], tuple[str, Mapping[str, Any] | None]] = {}
        for m in sorted(members, key=lambda m: int(m["release_id"])):  # the newest set last
            by_slot[(m["env_fp"], m["name"], m["signature_digest"])] = (m["key"], sets.get(int(m["release_id"])))
        newest: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        for a in sorted(artifacts, key=lambda a: str(a["created_at"])):
            if a.get("state", "ok") == "ok":
                newest[(a["env_fp"], a["name"], signature_digest(a["signature"]))] = a
        have = {(r["env_fp"], r["name"], r["signature_digest"]) for r in refs}
        seq = max([int(r["seq"]) for r in (*refs, *history)] or [0])
        now = sqlite_time(datetime.now(timezone.utc))
        host, user = socket.gethostname(), current_user()
        for slot in sorted(set(newest) - have):
            key, set_row = by_slot.get(slot, (newest[slot]["key"], None))
            seq += 1
            ref = {"env_fp": slot[0], "name": slot[1], "signature_digest": slot[2],
                   "signature": newest[slot]["signature"], "key": key, "seq": seq, "set_at": now, "host": host,
                   "user": user, "source": REPAIR_SOURCE, "release": set_row["label"] if set_row else None,
                   "commit": set_row["commit"] if set_row else None}
            refs.append(ref)
            history.append(dict(ref))
            out.refs += 1
    out.tables.update(refs=refs, ref_history=history)
