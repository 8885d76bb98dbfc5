"""``aot warmup --refresh-exports``: export again the portable HLO of the entries a
warm-up compiled or hit, where the newest supported JAX release would refuse it or
no longer promises to call it (:mod:`aot.export_rules`).

The portable HLO is what the fallback ladder compiles on a host of another release;
an old cache's exports expire under a fleet as JAX releases move on (JAX 0.11.1+
refuses old formats, and promises a window of about six months). A warm-up runs where
the model's code is: it lowers the item again, exports it with the JAX in use and
replaces the entry's portable HLO blob (content-addressed: a new digest, the same key,
the executable kept as stored, never compiled again when it is current).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from aot.errors import AotError
from aot.cache.warmup.functions import lower_item, x64_mode

if TYPE_CHECKING:
    from aot.cache.index.entry import IndexEntry
    from aot.cache.store import ArtifactStore
    from aot.cache.warmup.manifest import WarmupItem
    from aot.cache.warmup.steps import ItemResult

log = logging.getLogger(__name__)

__all__ = ["RefreshedExport", "refresh_entries", "replace_portable_hlo"]


@dataclass(frozen=True, slots=True)
class RefreshedExport:
    """One entry whose portable HLO a warm-up looked at again: ``refreshed`` (a new
    export stored), or not, with why (``error``)."""

    key: str
    label: str
    release: str  # the release it was refreshed for
    was: str  # the old export's date and why the release refuses it
    refreshed: bool
    error: str | None = None

    def line(self) -> str:
        if self.refreshed:
            return f"refreshed the export of {self.label} {self.key[:12]} for jax {self.release} (was: {self.was})"
        return f"could not refresh the export of {self.label} {self.key[:12]} for jax {self.release}: {self.error}"

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "release": self.release, "was": self.was,
                "refreshed": self.refreshed, "error": self.error}


def refresh_entries(
    cache: ArtifactStore, items: Sequence[WarmupItem], results: Sequence[ItemResult], release: str,
) -> tuple[RefreshedExport, ...]:
    """Exports again the portable HLO of every entry of ``results`` (``items[r.index]``
    each) that JAX ``release`` would refuse or not promise to call."""
    from aot.artifact import PORTABLE_HLO
    from aot.export_rules import judge

    done: list[RefreshedExport] = []
    for result in results:
        if not result.ok or result.key is None:
            continue
        entry = cache.lookup(result.key)
        if entry is None or not entry.ok or entry.hlo_digest is None:
            continue
        try:
            artifact = cache.artifact(entry, roles=(PORTABLE_HLO,))
        except AotError:
            continue  # damaged: integrity's report (aot verify), not this one's
        verdict = judge(artifact.blob(PORTABLE_HLO), artifact.manifest.jax_version, release)
        if verdict is None or verdict.status is None:
            continue
        item = items[result.index]
        try:
            hlo = _export_again(cache, item, entry)
            again = judge(hlo, artifact.manifest.jax_version, release)
            if again is not None and again.status is not None:
                raise AotError(f"this JAX's export is not callable by jax {release} either ({again.describe()}): "
                               "refresh it on a newer release")
            replace_portable_hlo(cache, entry, hlo)
        except Exception as exc:  # noqa: BLE001 - every entry is tried; each failure is reported
            done.append(RefreshedExport(entry.key, result.label, release, verdict.describe(), False, str(exc)))
            log.warning("%s", done[-1].line())
            continue
        done.append(RefreshedExport(entry.key, result.label, release, verdict.describe(), True))
        log.info("%s", done[-1].line())
    return tuple(done)


def _export_again(cache: ArtifactStore, item: WarmupItem, entry: IndexEntry) -> bytes:
    """The item's program exported by this JAX, from its code (one lowering); the
    stored executable gives the shardings the compiler chose (no compile)."""
    with x64_mode(item):
        computation = lower_item(item)
        if computation.fingerprint != entry.key:
            raise AotError(f"the code now lowers to key {computation.fingerprint[:12]}, not {entry.key[:12]}: "
                           "the warm-up compiled that one with a fresh export")
        executable = None
        if entry.exe_digest is not None and item.device_target is None:
            executable = cache.load(entry)
        hlo = computation.portable_hlo(executable)
    if hlo is None:
        raise AotError("jax.export cannot serialize this program (the entry keeps its executable only)")
    return bytes(hlo)


def replace_portable_hlo(cache: ArtifactStore, entry: IndexEntry, hlo: bytes) -> IndexEntry:
    """Replaces the portable HLO blob of ``entry`` with ``hlo``: a new content-addressed
    blob, the same key, the other blobs and the compile time kept, the manifest signed
    again with the cache's key. The old blob is deleted unless another row references it."""
    import hashlib

    from aot.artifact import PORTABLE_HLO, Artifact, BlobRef

    stored = cache.artifact(entry)  # every blob, verified
    digest = hashlib.sha256(hlo).hexdigest()
    old = stored.manifest.blobs[PORTABLE_HLO].digest
    blobs = {**stored.manifest.blobs, PORTABLE_HLO: BlobRef(digest, len(hlo))}
    manifest = replace(stored.manifest, blobs=blobs, hmac=None)
    payload = {d: b for d, b in stored.blobs.items() if d != old or d == digest}
    artifact = Artifact(manifest, {**payload, digest: hlo})
    stored_entry = cache.store_artifact(artifact, created_at=entry.created_at, replace_row=True)[0]
    if old != digest:  # deleted now unless another row uses it (a recompiled entry, its program row)
        cache.index.drop_unreferenced({old}, cache.blobs.delete)
    return stored_entry
