"""``aot repair``: a folder cache whose SQLite index is damaged gets a new index.

Planned first, like gc (:class:`RepairPlan`; ``--dry-run`` prints it): every row the
damaged index can still give, read table by table and row by row
(:mod:`aot.cache.index.salvage`), is checked, and an entry is kept only when its manifest
parses, names its own key, and every blob it references is in the blob store. Refs,
releases, history, statistics and the cache's description are kept where they still
name a kept entry. Then the entries whose rows were lost are rebuilt from the blob
store: each entry's manifest is a blob too (schema 10, :mod:`aot.cache.admin.manifest_blobs`),
so a stored blob that no kept row references and that is a manifest of a key not kept,
whose blobs are all stored and intact and whose signature verifies (when the cache has
a key), becomes a row again ("rebuilt from the blob store"). Refs and release members
naming a rebuilt entry are kept like those of a salvaged one. What could not be
recovered is named: rows that an index of the damaged file names but that could not be
read and that no manifest blob rebuilt (for entries, their key and name), manifests
found but refused (and why), and the blobs no kept or rebuilt entry references (an
executable or HLO blob of an entry stored before schema 10, whose manifest lived in its
row only: ``aot warmup`` stores it again, ``aot gc`` removes the blob). Release sets and
captured GPUs whose rows are lost come back from their journal blobs (schema 11), and
the refs of a lost ``refs`` table from the release sets and entries
(:mod:`aot.cache.admin.repair_declarations`); what nothing journals (statistics, ref
history, JAX's own cache, the default release) is named with what to run instead. The
tables carried over are the schema's (:func:`aot.cache.index.schema.salvaged_tables`).
Each thing lost is a typed :class:`~aot.cache.admin.lost.Lost`.

Executed: the new index is written beside the damaged one, the damaged file (with its
-wal, if any) is moved aside as ``index.sqlite.damaged-<UTC time>``, never deleted, and
the new one takes its name. Run it while no process uses the cache.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aot.cache.admin.lost import Lost, LostKind
from aot.cache.admin.repair_declarations import Declarations, rebuild_declarations, sqlite_time
from aot.cache.index.entry import INDEX_FILE, SCHEMA_VERSION, referenced_digests
from aot.cache.index.salvage import SalvagedTable, damage_of, salvage, write_index
from aot.cache.index.schema import salvaged_tables
from aot.errors import CacheError

log = logging.getLogger(__name__)

__all__ = ["RepairPlan", "describe", "plan_repair", "repair_index"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairPlan:
    """What ``aot repair`` will do (or did): see the module docstring."""

    index_file: str
    damage: str | None  # None: the index is not damaged (nothing to do)
    aside: str  # where the damaged file goes
    busy: bool  # a -shm beside the index: a process may have it open
    kept: tuple[tuple[str, int], ...] = ()  # (table, rows the new index gets)
    entries: tuple[str, ...] = ()  # "name (key12)" of every entry kept
    lost: tuple[Lost, ...] = ()  # what could not be recovered
    orphan_blobs: int = 0  # stored blobs no kept entry references
    done: bool = False
    tables: tuple[tuple[str, tuple[str, ...], tuple[tuple[Any, ...], ...]], ...] = field(default=(), repr=False)
    rebuilt: tuple[str, ...] = ()  # "name (key12)" of every entry rebuilt from the blob store
    releases_rebuilt: tuple[str, ...] = ()  # "label (set N)" of every release set rebuilt from its journal blob
    targets_rebuilt: tuple[str, ...] = ()  # names of the captured GPUs rebuilt from their journal blobs
    refs_rebuilt: int = 0  # refs set again (the refs table was lost)

    @property
    def needed(self) -> bool:
        return self.damage is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index_file, "damage": self.damage, "aside": self.aside,
            "kept": dict(self.kept), "entries": list(self.entries), "lost": [item.to_dict() for item in self.lost],
            "orphan_blobs": self.orphan_blobs, "busy": self.busy, "done": self.done,
            "rebuilt": list(self.rebuilt), "releases_rebuilt": list(self.releases_rebuilt),
            "targets_rebuilt": list(self.targets_rebuilt), "refs_rebuilt": self.refs_rebuilt,
        }


def plan_repair(
    folder: str | os.PathLike[str], *, blob_store: Any = None, signing_key: bytes | None = None,
    require_signatures: bool = False,
) -> RepairPlan:
    """The plan for the folder cache at ``folder`` (nothing written). ``blob_store``: an
    :class:`~aot.cache.storage.objectstore.ObjectStore` (default: the location the index
    records, else ``folder/blobs``). ``signing_key``: the cache's; a manifest in the blob
    store is rebuilt into a row only if its signature verifies with it."""
    folder = Path(folder).expanduser()
    index_file = folder / INDEX_FILE
    if not index_file.is_file():
        raise CacheError(f"no cache index at {index_file} to repair; check the path or AOT_CACHE")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    aside = index_file.with_name(f"{INDEX_FILE}.damaged-{stamp}")
    busy = index_file.with_name(INDEX_FILE + "-shm").exists()
    damage = damage_of(index_file)
    if damage is None:
        return RepairPlan(index_file=str(index_file), damage=None, aside=str(aside), busy=busy)
    version, salvaged, error = salvage(index_file, salvaged_tables())
    if version is not None and not SCHEMA_VERSION - 3 <= version <= SCHEMA_VERSION:
        # 9 -> 10 added artifacts.manifest_digest only (computed here from each row's
        # manifest), 10 -> 11 the journal table only (none: nothing journaled yet),
        # 11 -> 12 artifacts.const_digest only (NULL in every older row: no constants).
        raise CacheError(
            f"the damaged index {index_file} has schema version {version}; this jax-aot "
            f"repairs versions {SCHEMA_VERSION - 3} to {SCHEMA_VERSION}: repair it with the jax-aot that wrote it"
        )
    by_name = {t.name: t for t in salvaged}
    lost: list[Lost] = []
    if error is not None:
        lost.append(Lost(kind=LostKind.WHOLE_INDEX, reason=error))
    store = blob_store if blob_store is not None else _blob_store(folder, by_name.get("cache_meta"))
    kept = _Kept(store, lost, signing_key, require_signatures)
    tables = kept.choose(by_name, whole_index_lost=error is not None)
    for t in salvaged:
        if t.error is not None and not t.lost:
            lost.append(Lost(kind=LostKind.TABLE_READ_IN_PART, table=t.name, reason=t.error))
    orphans = len(kept.listed - kept.digests - (kept.declared.journals if kept.declared else set()))
    if orphans:
        lost.append(Lost(
            kind=LostKind.ORPHAN_BLOBS, count=orphans,
            reason="their rows were not readable and no manifest blob rebuilt them",
            advice="`aot warmup` stores them again, `aot gc` removes the blobs",
        ))
    declared = kept.declared
    return RepairPlan(
        index_file=str(index_file), damage=damage, aside=str(aside), busy=busy,
        kept=tuple((n, len(rows)) for n, _, rows in tables), entries=tuple(kept.entries), lost=tuple(lost),
        orphan_blobs=orphans, tables=tuple(tables), rebuilt=tuple(kept.rebuilt),
        releases_rebuilt=tuple(declared.releases) if declared else (),
        targets_rebuilt=tuple(declared.targets) if declared else (), refs_rebuilt=declared.refs if declared else 0,
    )


def repair_index(plan: RepairPlan, *, force: bool = False) -> RepairPlan:
    """Executes ``plan``: the new index written, the damaged one moved aside."""
    if not plan.needed:
        return plan
    if plan.busy and not force:
        raise CacheError(
            f"{plan.index_file}-shm exists: a process may have the index open. Stop every "
            "process that uses the cache, then run `aot repair` again (--force if the -shm "
            "is a crashed writer's)"
        )
    from sqlalchemy.engine import URL

    from aot.cache.index.sql import Index

    index_file = Path(plan.index_file)
    new = index_file.with_name(INDEX_FILE + ".repairing")
    for leftover in (new, new.with_name(new.name + "-wal"), new.with_name(new.name + "-shm")):
        leftover.unlink(missing_ok=True)
    Index(URL.create("sqlite", database=str(new))).close()  # the current schema
    written = write_index(new, plan.tables)
    log.info("repair: wrote %s into %s", written, new)
    aside = Path(plan.aside)
    for suffix in ("-wal", "-shm", ""):
        side = index_file.with_name(index_file.name + suffix)
        if side.exists():
            os.replace(side, aside.with_name(aside.name + suffix))
    os.replace(new, index_file)
    return replace(plan, kept=tuple(written.items()), done=True, tables=())


def _blob_store(folder: Path, meta: SalvagedTable | None) -> Any:
    from aot.cache.storage.locations import open_object_store

    recorded = next((r.get("blob_location") for r in meta.dicts()), None) if meta is not None else None
    return open_object_store(recorded or str(folder / "blobs"), read_only=True)


class _Kept:
    """Chooses the rows the new index gets (see the module docstring)."""

    def __init__(self, store: Any, lost: list[Lost], signing_key: bytes | None, require_signatures: bool) -> None:
        self.store = store
        self.lost = lost
        self.signing = (signing_key, require_signatures)
        self.entries: list[str] = []
        self.rebuilt: list[str] = []
        self.digests: set[str] = set()
        self.listed: set[str] = set()  # every stored digest
        self._stats: list[Any] = []  # every stored blob's BlobStat
        self._sizes: dict[str, int] = {}  # blob digest -> raw size, from the kept manifests
        self._created: dict[str, Any] = {}  # blob digest -> when (SQLite text), of journal blobs
        self.declared: Declarations | None = None

    def choose(
        self, tables: Mapping[str, SalvagedTable], *, whole_index_lost: bool = False,
    ) -> list[tuple[str, tuple[str, ...], tuple[tuple[Any, ...], ...]]]:
        from aot.cache.storage.content import ContentStore

        out: dict[str, list[dict[str, Any]]] = {}
        artifacts = self._artifacts(tables.get("artifacts"))
        jit = [j for j in _rows(tables, "jit_entries") if self._stored([j["digest"]])]
        self.digests |= {j["digest"] for j in jit}
        artifacts += self._rebuild(artifacts)
        keys = {a["key"] for a in artifacts}
        out["artifacts"] = artifacts
        programs = {p["program_fp"]: p for p in _rows(tables, "programs")}
        out["programs"] = [programs.get(a["program_fp"]) or {
            "program_fp": a["program_fp"], "name": a["name"], "signature": a["signature"],
            "hlo_digest": a["hlo_digest"], "created_at": a["created_at"],
        } for a in {a["program_fp"]: a for a in artifacts}.values()]
        self._count_dropped("jit_entries", _rows(tables, "jit_entries"), jit, "its blob is not stored")
        out["jit_entries"] = jit
        # Releases, captured GPUs, the journal and refs: salvaged, else from journal blobs.
        candidates = [s for s in self._stats if s.digest not in self.digests]
        declared = rebuild_declarations(tables, ContentStore(self.store), candidates, artifacts,
                                        whole_index_lost=whole_index_lost)
        self.declared = declared
        self.lost += declared.lost
        out.update(declared.tables)
        self.digests |= set(declared.blobs)
        self._sizes.update({d: size for d, (size, _) in declared.blobs.items()})
        self._created.update({d: when for d, (_, when) in declared.blobs.items()})
        out["blobs"] = self._blob_rows(tables, artifacts, jit)
        for name in salvaged_tables():  # every other table as read (stats, cache_meta, ...)
            if name not in out:
                out[name] = _rows(tables, name)
        for t in tables.values():
            for row in t.lost:
                if t.name == "artifacts" and row.get("key") in keys:
                    continue  # rebuilt from its manifest blob
                shown = ", ".join(f"{k}={str(v)[:24]}" for k, v in sorted(row.items()) if k in ("name", "key", "label", "signature"))
                self.lost.append(Lost(kind=LostKind.UNREADABLE_ROW, table=t.name, subject=shown or None))
        result = []
        for name in salvaged_tables():
            rows = out.get(name, [])
            columns = tuple(tables[name].columns) if name in tables else tuple(rows[0]) if rows else ()
            columns += tuple(c for c in (rows[0] if rows else ()) if c not in columns)  # manifest_digest of a schema 8 file
            result.append((name, columns, tuple(tuple(r.get(c) for c in columns) for r in rows)))
        return result

    def _artifacts(self, table: SalvagedTable | None) -> list[dict[str, Any]]:
        from aot.artifact import Manifest

        kept = []
        for row in table.dicts() if table is not None else []:
            label = f"{row.get('name')} ({str(row.get('key'))[:12]})"
            try:
                manifest = Manifest.from_json(row["manifest"])
                if manifest.key != row["key"]:
                    raise ValueError(f"its manifest is of key {manifest.key[:12]}")
                for when in ("created_at", "last_used_at"):
                    datetime.fromisoformat(str(row[when]))
            except Exception as exc:  # noqa: BLE001 - a damaged row, whatever is wrong in it
                self.lost.append(Lost(kind=LostKind.DAMAGED_ENTRY, table="artifacts", subject=label,
                                      reason=f"its row is damaged ({exc})"))
                continue
            digests = [d for d in (row["exe_digest"], row["hlo_digest"], row.get("const_digest")) if d]
            if not row.get("manifest_digest"):  # a row of schema 8
                row["manifest_digest"] = hashlib.sha256(row["manifest"].encode()).hexdigest()
            present = self.store.exists([*digests, row["manifest_digest"]])
            missing = [d for d in digests if d not in present]
            if missing:
                self.lost.append(Lost(kind=LostKind.MISSING_BLOBS, table="artifacts", subject=label,
                                      reason=f"blob(s) {', '.join(d[:12] for d in missing)} not stored"))
                continue
            self.digests |= set(digests)
            self._sizes.update({ref.digest: ref.size for ref in manifest.blobs.values()})
            if row["manifest_digest"] in present:  # not before schema 10
                self.digests.add(row["manifest_digest"])
                self._sizes[row["manifest_digest"]] = len(row["manifest"].encode())
            kept.append(row)
            self.entries.append(label)
        return kept

    def _rebuild(self, artifacts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Rows rebuilt from the manifests among the stored blobs no kept row references."""
        from aot.cache.admin.manifest_blobs import rebuild_rows
        from aot.cache.storage.content import ContentStore

        listed = list(self.store.list())
        self._stats = listed
        self.listed = {s.digest for s in listed}
        candidates = [s for s in listed if s.digest not in self.digests]
        found = rebuild_rows(ContentStore(self.store), candidates, {a["key"] for a in artifacts},
                             signing_key=self.signing[0], require_signatures=self.signing[1])
        self.lost += found.refused
        rows = []
        for entry in found.entries:
            row = {f.name: getattr(entry, f.name) for f in fields(entry)}
            row["created_at"], row["last_used_at"] = sqlite_time(entry.created_at), sqlite_time(entry.last_used_at)
            rows.append(row)
            self.digests |= referenced_digests(entry)
            self.rebuilt.append(f"{entry.name} ({entry.key[:12]})")
        self._sizes.update({d: size for d, (size, _, _) in found.blobs.items()})
        return rows

    def _stored(self, digests: list[str]) -> bool:
        return set(digests) <= self.store.exists(digests)

    def _blob_rows(self, tables: Mapping[str, SalvagedTable], artifacts: list[dict[str, Any]], jit: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rows = {b["digest"]: b for b in _rows(tables, "blobs") if b["digest"] in self.digests}
        missing = sorted(self.digests - set(rows))
        stats = self.store.stat(missing) if missing else {}
        created = {d: a["created_at"] for a in artifacts for d in (a["exe_digest"], a["hlo_digest"], a.get("manifest_digest"), a.get("const_digest")) if d}
        created.update({j["digest"]: j["created_at"] for j in jit})
        created.update(self._created)
        sizes = {**{j["digest"]: j["size"] for j in jit}, **self._sizes}
        for digest in missing:
            stat = stats.get(digest)
            rows[digest] = {
                "digest": digest, "size": sizes.get(digest, 0),
                "stored_size": stat.stored_size if stat is not None else 0, "created_at": created[digest],
            }
        return list(rows.values())

    def _count_dropped(self, table: str, read: list[dict[str, Any]], kept: list[dict[str, Any]], why: str) -> None:
        if len(read) > len(kept):
            self.lost.append(Lost(kind=LostKind.DROPPED_ROWS, table=table, count=len(read) - len(kept), reason=why))


def _rows(tables: Mapping[str, SalvagedTable], name: str) -> list[dict[str, Any]]:
    table = tables.get(name)
    return table.dicts() if table is not None else []


def describe(plan: RepairPlan) -> str:
    """The plan (or what was done) as ``aot repair`` prints it."""
    if not plan.needed:
        return f"{plan.index_file}: PRAGMA quick_check finds nothing wrong; nothing to repair"
    head = "repaired" if plan.done else "would repair"
    lines = [f"{plan.index_file}: {plan.damage}"]
    lines.append(f"{head}: {len(plan.entries)} entr{'y' if len(plan.entries) == 1 else 'ies'} recovered"
                 + (f" ({', '.join(plan.entries[:5])}{', ...' if len(plan.entries) > 5 else ''})" if plan.entries else ""))
    if plan.rebuilt:
        lines.append(f"  rebuilt from the blob store: {len(plan.rebuilt)} entr{'y' if len(plan.rebuilt) == 1 else 'ies'} "
                     f"({', '.join(plan.rebuilt[:5])}{', ...' if len(plan.rebuilt) > 5 else ''})")
    if plan.releases_rebuilt:
        lines.append(f"  release sets rebuilt from their journal blobs: {len(plan.releases_rebuilt)} "
                     f"({', '.join(plan.releases_rebuilt[:5])}{', ...' if len(plan.releases_rebuilt) > 5 else ''})")
    if plan.targets_rebuilt:
        lines.append(f"  captured GPUs rebuilt from their journal blobs: {len(plan.targets_rebuilt)} "
                     f"({', '.join(plan.targets_rebuilt[:5])}{', ...' if len(plan.targets_rebuilt) > 5 else ''})")
    if plan.refs_rebuilt:
        lines.append(f"  refs set again (the refs table was lost): {plan.refs_rebuilt}, from the release sets "
                     "and the newest entry of each signature")
    rows = ", ".join(f"{n} {c}" for n, c in plan.kept if c and n not in ("artifacts",))
    if rows:
        lines.append(f"  also kept: {rows}")
    if plan.lost:
        lines.append("  not recovered:")
        lines += [f"    {item.line()}" for item in plan.lost]
    else:
        lines.append("  nothing was lost")
    verb = "moved aside to" if plan.done else "to be moved aside to"
    lines.append(f"  the damaged file {verb} {plan.aside} (never deleted)")
    return "\n".join(lines)
