"""Each entry's manifest as a blob of the store (schema 10): what ``aot repair`` rebuilds
entries from, and what ``aot verify`` says of rows whose manifest blob is not stored.

A writer stores the manifest text of a row (the exact bytes, which its signature
covers) as a content-addressed blob before it commits the row
(:func:`aot.cache.store.store_manifest`), and the row names it
(``artifacts.manifest_digest``), so that gc keeps it while the row lives. When the row
is lost (a page SQLite can no longer read), the blob store still holds a manifest that
names the key, the program and the environment, and every blob of the entry with its
size: the row is derived from it (:func:`rebuild_rows`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import zstandard

from aot.artifact import Manifest
from aot.cache.admin.lost import Lost, LostKind
from aot.cache.index.entry import IndexEntry
from aot.cache.storage.content import ContentStore
from aot.cache.storage.objectstore import BlobStat
from aot.cache.store import entry_of
from aot.errors import AotError, IntegrityError
from aot.signing import verify

log = logging.getLogger(__name__)

__all__ = ["MANIFEST_MAX_BYTES", "Rebuilt", "manifest_blob_notes", "rebuild_rows", "small_blob"]

#: A blob larger than this (stored or inflated) is not read as a manifest candidate: a
#: manifest is a few KB of JSON (tens of KB with many arguments), an executable MBs.
MANIFEST_MAX_BYTES = 4 << 20

#: The schema that began storing manifests as blobs (said in verify's note).
MANIFEST_BLOBS_SINCE = 10


def manifest_blob_notes(entries: Iterable[IndexEntry], check: Any) -> list[str]:
    """What ``aot verify`` says of the manifest blobs of ``entries`` (``check(digest,
    size)``: None if intact): information, not problems. The row holds the manifest the
    entry loads from; the blob is a repair aid, which the next store of the entry writes."""
    notes = []
    for entry in entries:
        if entry.manifest_digest is None:
            continue
        label = f"{entry.name} ({entry.key[:12]})"
        text = entry.manifest.encode()
        if hashlib.sha256(text).hexdigest() != entry.manifest_digest:
            notes.append(f"{label}: the row's manifest digest {entry.manifest_digest[:12]} is not its manifest's: "
                         "repair cannot rebuild this entry")
            continue
        problem = check(entry.manifest_digest, len(text))
        if problem == "missing":
            notes.append(f"{label}: manifest not in the blob store (written before format {MANIFEST_BLOBS_SINCE}): "
                         "repair cannot rebuild this entry")
        elif problem is not None:
            notes.append(f"{label}: manifest blob {entry.manifest_digest[:12]}: {problem}: repair cannot rebuild "
                         "this entry (its next store writes the blob again)")
    return notes


@dataclass(frozen=True, slots=True, kw_only=True)
class Rebuilt:
    """The rows ``aot repair`` derives from the manifests of the blob store."""

    entries: tuple[IndexEntry, ...]
    #: digest -> (size, stored size, modified) of every blob the rebuilt rows reference.
    blobs: dict[str, tuple[int, int, datetime]]
    #: What was found but could not be rebuilt.
    refused: tuple[Lost, ...]


def rebuild_rows(
    blobs: ContentStore, candidates: Sequence[BlobStat], known_keys: Collection[str], *,
    signing_key: bytes | None = None, require_signatures: bool = False,
) -> Rebuilt:
    """Rows rebuilt from those of ``candidates`` (stored blobs no salvaged row
    references) that are manifests of keys not in ``known_keys``: every blob the
    manifest names stored and intact (digest-checked), its signature valid when the
    cache has a key. Of several manifests of one key, the newest blob's. Big blobs are
    skipped by their stored size, unread."""
    stats = {s.digest: s for s in candidates}
    found: dict[str, tuple[Manifest, str, BlobStat]] = {}
    for stat in sorted(candidates, key=lambda s: s.modified):
        parsed = _manifest_in(blobs, stat)
        if parsed is not None and parsed[0].key not in known_keys:
            found[parsed[0].key] = (*parsed, stat)  # the newest last
    entries: list[IndexEntry] = []
    sizes: dict[str, tuple[int, int, datetime]] = {}
    refused: list[Lost] = []
    for key in sorted(found):
        manifest, text, stat = found[key]
        label = f"{manifest.name} ({key[:12]})"
        why = _unusable(blobs, manifest, signing_key, require_signatures)
        if why is not None:
            refused.append(Lost(kind=LostKind.REFUSED, table="artifacts", subject=label,
                                reason=f"its manifest is in the blob store but {why}: not rebuilt"))
            continue
        refs = {ref.digest: ref.size for ref in manifest.blobs.values()}
        stored = blobs.stat(refs)
        when = _created(manifest, stat)
        entry = replace(
            entry_of(manifest), manifest=text, manifest_digest=stat.digest, raw_size=manifest.raw_size,
            stored_size=sum(stored[d].stored_size for d in refs) + stat.stored_size,
            created_at=when, last_used_at=when,
        )
        entries.append(entry)
        sizes.update({d: (refs[d], stored[d].stored_size, stored[d].modified) for d in refs})
        sizes[stat.digest] = (len(text.encode()), stat.stored_size, stats[stat.digest].modified)
        log.info("repair: rebuilt %s from its manifest blob %s", label, stat.digest[:12])
    return Rebuilt(entries=tuple(entries), blobs=sizes, refused=tuple(refused))


def small_blob(blobs: ContentStore, stat: BlobStat) -> bytes | None:
    """The bytes of the blob ``stat`` (inflated and digest-checked) when it is small
    enough to be a manifest or a journal blob (:data:`MANIFEST_MAX_BYTES`, told from its
    stored size and its frame header, unread past them); None otherwise or unreadable."""
    if stat.stored_size > MANIFEST_MAX_BYTES:
        return None
    try:
        payload = blobs.store.read(stat.digest)
        if payload is None:
            return None
        size = zstandard.frame_content_size(payload[:18])  # the header: no inflating
        if size < 0 or size > MANIFEST_MAX_BYTES:
            return None
        return blobs.get(stat.digest, size)  # inflated and digest-checked
    except (AotError, ValueError, zstandard.ZstdError):
        return None


def _manifest_in(blobs: ContentStore, stat: BlobStat) -> tuple[Manifest, str] | None:
    """The manifest (and its exact text) that the blob ``stat`` holds; None when it is
    not one (an executable, HLO, a JAX cache entry, a journal blob) or cannot be read."""
    data = small_blob(blobs, stat)
    if data is None or not data.lstrip().startswith(b"{"):
        return None
    try:
        text = data.decode("utf-8")
        return Manifest.from_json(text), text
    except (AotError, ValueError, UnicodeDecodeError, KeyError, TypeError):
        return None  # not a manifest: what every executable and HLO blob is


def _unusable(blobs: ContentStore, manifest: Manifest, key: bytes | None, require: bool) -> str | None:
    """Why the entry of ``manifest`` cannot be rebuilt (None: it can)."""
    try:
        verify(manifest, key, require=require)
    except IntegrityError as exc:
        return f"its signature does not verify with this cache's key ({exc})"
    for role, ref in sorted(manifest.blobs.items()):
        problem = blobs.check(ref.digest, ref.size)
        if problem is not None:
            return f"its {role} blob {ref.digest[:12]} is {problem}"
    return None


def _created(manifest: Manifest, stat: BlobStat) -> datetime:
    """When the entry was compiled: as its manifest records it, else its blob's time."""
    try:
        if manifest.created_at:
            parsed = datetime.fromisoformat(manifest.created_at.replace("Z", "+00:00"))
            return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)
    except ValueError:
        pass
    return stat.modified
