"""Maintenance of KIND ``jit`` entries (JAX's persistent cache through
:mod:`aot.cache.jax_cache`): what ``aot verify`` and ``aot push``/``pull`` do with them.

A jit entry has no manifest, no portable HLO and no ref: verify checks what can be
checked (its blob against its digest and size, its HMAC when the cache has a key)
and removes a damaged entry's row instead of quarantining it (JAX then compiles the
program again and its ``put`` stores it again: the repair); a copy carries the row
and the blob as stored, verified on the way.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.cache.index.jit_records import JitEntry, signature_problem
from aot.errors import AotError

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore

log = logging.getLogger(__name__)

__all__ = [
    "JitCopy", "JitDetails", "JitProblem", "copy_jit_entries", "describe_jit_entries", "jit_selected",
    "jit_stored_intact", "verify_jit_entries",
]


@dataclass(frozen=True, slots=True)
class JitProblem:
    key: str
    name: str
    what: str


@dataclass(frozen=True, slots=True)
class JitCopy:
    """What a copy did with the jit entries: keys stored, already there, failed."""

    copied: tuple[str, ...] = ()
    present: tuple[str, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class JitDetails:
    """``aot show`` of a jit entry: its row, and the state of its HMAC (``ok``,
    ``unsigned``, ``not checked (no signing key)``, or what is wrong with it)."""

    entry: JitEntry
    hmac: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.entry.to_dict(), "hmac_state": self.hmac}


def _hmac_state(cache: ArtifactStore, entry: JitEntry) -> str:
    if cache.signing_key is None:
        return "not checked (no signing key)" if entry.signature else "unsigned"
    return signature_problem(cache.signing_key, entry) or "ok"


def describe_jit_entries(cache: ArtifactStore, key_or_name: str) -> list[JitDetails]:
    """The jit entries whose function name matches the glob ``key_or_name`` or whose
    key starts with it (JAX's key, e.g. ``jit_train_step-1f2e...``), with their HMAC's
    state; empty when none does."""
    return [JitDetails(e, _hmac_state(cache, e)) for e in cache.reader.jit_entries(key_or_name)]


def verify_jit_entries(
    cache: ArtifactStore, check: Callable[[str, int], str | None], *, remove: bool,
) -> tuple[int, list[JitProblem], list[str]]:
    """``(entries checked, problems, keys removed)``: each jit entry's blob is
    re-hashed (``check(digest, size)``); a damaged one's row is removed with
    ``remove`` (the next compile stores it again). A wrong or missing HMAC under a
    signing key is reported, never removed (as for aot entries)."""
    entries = cache.index.jit_entries()
    problems: list[JitProblem] = []
    damaged: list[str] = []
    for entry in entries:
        problem = check(entry.digest, entry.size)
        if problem is not None:
            problems.append(JitProblem(entry.key, entry.name, f"jit entry: blob {entry.digest} {problem}"))
            damaged.append(entry.key)
            continue
        unsigned = signature_problem(cache.signing_key, entry)
        if unsigned is not None:
            problems.append(JitProblem(entry.key, entry.name, f"jit entry: {unsigned}"))
    removed: list[str] = []
    if remove and damaged and not cache.read_only:
        cache.index.jit_delete(damaged)
        removed = damaged
        log.warning("verify: removed %d damaged jit entries (compiled and stored again on next use)", len(removed))
    return len(entries), problems, removed


def copy_jit_entries(source: ArtifactStore, destination: ArtifactStore, names: Iterable[str] | None = None) -> JitCopy:
    """Copies the jit entries of ``source`` whose function name matches one of the
    globs ``names`` (all if None): blob as stored (verified), then the row."""
    globs = list(names) if names else None
    copied: list[str] = []
    present: list[str] = []
    failed: list[tuple[str, str]] = []
    for entry in jit_selected(source.index.jit_entries(), globs):
        if jit_stored_intact(destination, entry, destination.index.jit_get(entry.key)):
            present.append(entry.key)
            continue
        lease = destination.index.lease([entry.digest])
        try:
            blobs = source.blobs.copy_to(destination.blobs, [entry.digest])
            stored = blobs.stored_sizes.get(entry.digest, entry.stored_size)
            destination.index.jit_add(dataclasses.replace(entry, stored_size=stored), lease=lease)
        except AotError as exc:
            destination.index.release(lease)
            log.warning("not copied: jit entry %s: %s", entry.key, exc)
            failed.append((entry.key, str(exc)))
            continue
        copied.append(entry.key)
    return JitCopy(tuple(copied), tuple(present), tuple(failed))


def jit_selected(entries: Iterable[JitEntry], globs: list[str] | None) -> list[JitEntry]:
    """The jit entries a copy carries: those whose function name matches one of
    ``globs`` (all if None), in the source's order."""
    return [e for e in entries if not globs or any(fnmatch.fnmatchcase(e.name, g) for g in globs)]


def jit_stored_intact(destination: ArtifactStore, entry: JitEntry, there: JitEntry | None) -> bool:
    """Whether the source's jit ``entry`` is stored intact at ``destination`` (``there``:
    its row of the same key there, or None): the same blob, verified against its
    digest and size."""
    return there is not None and there.digest == entry.digest and destination.blobs.check(entry.digest, entry.size) is None
