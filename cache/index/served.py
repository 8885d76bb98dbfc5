"""Which entry is served per (name, signature, environment): one rule, used by the
loader, ``aot ls``/``show``/``why`` and ``gc --superseded``.

A slot with a ref serves the ref'd key, whatever the clocks say; every other intact
entry of the slot is superseded by it. A slot without a ref (a cache written before
refs existed, or entries copied without them) keeps the rule of earlier versions: the
newest intact entry by ``created_at`` among those of the same pytree structure, until
the next warm-up or compile sets a ref.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from aot.cache.index.entry import IndexEntry
from aot.cache.index.refs import Ref

__all__ = ["Slot", "ref_map", "served_key", "superseded_keys"]

#: (name, signature, environment fingerprint): what one ref decides.
Slot = tuple[str, str, str]


def ref_map(refs: Iterable[Ref]) -> dict[Slot, str]:
    """``{slot: ref'd key}`` of the current refs given."""
    return {ref.slot: ref.key for ref in refs}


def _slot(entry: IndexEntry) -> Slot:
    return (entry.name, entry.signature, entry.env_fp)


def _structure(entry: IndexEntry) -> str:
    try:
        return json.dumps(json.loads(entry.manifest).get("in_tree"), sort_keys=True)
    except Exception:  # noqa: BLE001 - an unreadable manifest groups alone
        return ""


def served_key(entries: Iterable[IndexEntry], refs: Mapping[Slot, str], slot: Slot) -> str | None:
    """The key served for ``slot`` among ``entries``: its ref, else the newest intact
    entry (the legacy rule); None when nothing intact is stored for it."""
    if slot in refs:
        return refs[slot]
    intact = [e for e in entries if e.ok and _slot(e) == slot]
    return max(intact, key=lambda e: (e.created_at, e.key)).key if intact else None


def superseded_keys(entries: Iterable[IndexEntry], refs: Mapping[Slot, str] | None = None) -> dict[str, str]:
    """``{superseded key: the key served instead}`` among the intact entries.

    Where a ref names the slot's key, every other intact entry of the slot is
    superseded by it. Elsewhere the newest entry of the same name, signature, pytree
    structure and environment supersedes the older ones (the legacy rule)."""
    refs = refs or {}
    by_slot: dict[Slot, list[IndexEntry]] = {}
    for entry in entries:
        if entry.ok:
            by_slot.setdefault(_slot(entry), []).append(entry)
    out: dict[str, str] = {}
    for slot, members in by_slot.items():
        served = refs.get(slot)
        if served is not None:
            out.update({e.key: served for e in members if e.key != served})
            continue
        if len(members) < 2:
            continue
        groups: dict[str, list[IndexEntry]] = {}
        for entry in members:  # only parsed when a slot holds several entries
            groups.setdefault(_structure(entry), []).append(entry)
        for group in groups.values():
            group.sort(key=lambda e: (e.created_at, e.key))
            out.update({older.key: group[-1].key for older in group[:-1]})
    return out
