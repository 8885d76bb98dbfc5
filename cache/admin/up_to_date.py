"""Whether a copy (``aot push``, ``aot pull``) has anything to do, decided read-only.

Between two folder caches, :func:`up_to_date` reads both indexes through the standard
library's reader (:class:`~aot.cache.index.reader.SqliteReader`: no SQLAlchemy, no
lease, no transaction) and makes the checks of the writer's path
(:func:`aot.cache.admin.transfer.copy_entries`), with its own functions where it
has them:

- the same entries of the source: intact, matching the name globs, names the rule
  accepts (:func:`select_entries`; a refused name is a failure either way);
- the first entry's manifest as the writer's first copy checks it before it looks at
  the destination (:func:`~aot.cache.store.manifest_to_copy`: its signature, the
  destination's key);
- every entry's row at the destination, intact (state ``ok``), and its blobs there
  and verified as the writer verifies them: the first entry's each read and checked
  (:func:`~aot.cache.store.stored_intact`), the others' per batch of
  :data:`~aot.cache.admin.copy_batches.BATCH` through
  :meth:`ContentStore.verified_among <aot.cache.storage.content.ContentStore.verified_among>`,
  each distinct blob once;
- the source's refs of those entries, by the rules of
  :mod:`~aot.cache.admin.carried_refs`: none would be written
  (:func:`~aot.cache.admin.carried_refs.unchanged_refs`);
- the jit entries matching the globs, stored there with the same blob, verified
  (:func:`~aot.cache.admin.jit_entries.jit_stored_intact`).

Only when every check says "nothing to copy, repair or write" does the copy report
from this pass, exactly what the writer's path would have reported (every entry
"already there", the refs it would have kept); anything else (an entry or a blob
missing or damaged there, a ref to set, ``--release``, which records a new set of its
label, a database on either side, an error) returns None and the copy goes through the
writer's path unchanged, which then decides everything again under its protocol.

Correctness under concurrency stays with that protocol: this pass writes nothing, and
the writer's path itself takes no lease for an entry it finds intact (a lease guards
blobs a writer is about to commit a row for). A gc racing this pass can delete an entry
only after it was found intact, as it could right after the writer's path found it so:
both report it "already there", and the next copy finds it gone and copies it again. A
writer racing it can only add rows: a row this pass does not see makes it fall back.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aot.cache.admin.carried_refs import CarriedRefs, RefsOutcome, carried_refs, log_refs, unchanged_refs
from aot.cache.admin.copy_batches import BATCH
from aot.cache.admin.jit_entries import jit_selected, jit_stored_intact
from aot.cache.store import manifest_to_copy, stored_intact
from aot.cache.index.entry import IndexEntry, entry_digests
from aot.cache.index.reader import SqliteReader
from aot.cache.names import name_problem
from aot.errors import AotError

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore

log = logging.getLogger(__name__)

__all__ = ["UpToDate", "select_entries", "up_to_date"]


@dataclass(frozen=True, slots=True)
class UpToDate:
    """A copy with nothing to do: what it reports."""

    present: tuple[str, ...]  # keys of the entries stored intact there, in the source's order
    jit_present: tuple[str, ...]  # keys of the jit entries stored intact there
    failed: tuple[tuple[str, str], ...]  # (key, why) of the names the rule refuses
    refs: RefsOutcome  # the refs kept (the destination's own)


def select_entries(
    entries: Iterable[IndexEntry], globs: Collection[str] | None, members: Collection[str] | None = None,
) -> tuple[list[IndexEntry], list[tuple[str, str]]]:
    """The entries of a source a copy takes (intact, matching one of ``globs`` if any,
    of the keys ``members`` if given), and ``(key, why)`` of those among them whose name
    the rule refuses (never copied), both in the source's order."""
    todo: list[IndexEntry] = []
    refused: list[tuple[str, str]] = []
    for entry in entries:
        if not entry.ok or (globs and not any(fnmatch.fnmatchcase(entry.name, g) for g in globs)):
            continue
        if members is not None and entry.key not in members:
            continue
        problem = name_problem(entry.name)
        if problem is not None:
            refused.append((entry.key, problem))
            continue
        todo.append(entry)
    return todo, refused


def up_to_date(
    source: ArtifactStore, destination: ArtifactStore, globs: list[str] | None, *, jobs: int = 1, overwrite_refs: bool = False,
) -> UpToDate | None:
    """What a copy of ``source``'s entries matching ``globs`` (all if None) into
    ``destination`` reports when it has nothing to copy, repair or write, decided
    without SQLAlchemy and without a lease (see the module docstring); None when it
    has something to do, when either side is not read through the standard library's
    reader (a database, a folder whose index it cannot read), or when a read fails:
    then the writer's path decides."""
    if not (isinstance(source.reader, SqliteReader) and isinstance(destination.reader, SqliteReader)):
        return None
    try:
        return _check(source, source.reader, destination, destination.reader, globs, jobs, overwrite_refs)
    except AotError as exc:  # the writer's path meets it again and reports it as it does
        log.debug("copy from %s: %s; going through the writer's path", source.display_location, exc)
        return None


def _check(
    source: ArtifactStore, reads: SqliteReader, destination: ArtifactStore, there: SqliteReader, globs: list[str] | None,
    jobs: int, overwrite_refs: bool,
) -> UpToDate | None:
    todo, refused = select_entries(reads.entries(), globs)
    # Cheap reads first (rows, refs, jit rows), blobs last: a copy with something to do
    # leaves here before reading a blob.
    if todo and manifest_to_copy(destination, source, todo[0]).key != todo[0].key:
        return None  # a row whose manifest names another key: the writer's path says so
    rows = there.get_many([e.key for e in todo])
    if any(e.key not in rows or not rows[e.key].ok for e in todo):
        return None
    keys = [e.key for e in todo]
    carried = carried_refs(source, keys) if todo else CarriedRefs()
    current_refs = there.refs() if carried.refs else []
    refs = unchanged_refs(carried, keys, current_refs, overwrite=overwrite_refs)
    if refs is None:
        return None
    jit = jit_selected(reads.jit_entries(), globs)
    jit_rows = {e.key: e for e in there.jit_entries()} if jit else {}
    if any(jit_rows.get(e.key) is None or jit_rows[e.key].digest != e.digest for e in jit):
        return None
    if todo and not stored_intact(destination, rows[todo[0].key]):
        return None
    verified: dict[str, int] = {}  # as the writer's batches: each distinct blob verified once
    for i in range(1, len(todo), BATCH):
        batch = [rows[e.key] for e in todo[i : i + BATCH]]
        intact = destination.blobs.verified_among(
            {d for row in batch for d in entry_digests(row)}, verified=verified, jobs=jobs,
        )
        if not all(d in intact for row in batch for d in entry_digests(row)):
            return None
    if not all(jit_stored_intact(destination, e, jit_rows[e.key]) for e in jit):
        return None
    log_refs(refs, current_refs)
    return UpToDate(tuple(keys), tuple(e.key for e in jit), tuple(refused), refs)
