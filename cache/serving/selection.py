"""Which stored rows of a name ``aot.load`` may serve, per input signature.

A cache may hold several programs for one signature (versions of the code, copies).
What is served is declared, never inferred from a clock (docs/serving.md, "What is
served"):

* **A ref for this environment** names the served key. Only rows of that key's
  program (the same ``program_fp``: that row, and rows of the same program for other
  environments, whose portable HLO the fallback ladder may recompile) are kept.
* **A ref for another environment only** (this one was never warmed): the ladder
  recompiles the portable HLO of the ref'd program; rows of that program are kept.
* **No ref** (a cache written before refs, or entries copied without them): the
  legacy rule of :mod:`aot.cache.index.served`, the newest intact row (of this
  environment, else of any), and rows of its program.
* **A release** (``aot.load(name, release=LABEL)``): the label's members of ``name``
  replace the refs, and signatures outside the label are not served at all.

Every other row is dropped, with a logged reason: an older program is never served,
not even as a fallback for a damaged served one (that would silently serve old code).
With a signing key, rows are checked first (:func:`aot.signing.identity_problems`, and
their signature): a renamed, re-signatured, unsigned or altered row is skipped
before the choice, so it can neither be chosen nor hide a signed one; a ref naming
such a row is ignored (:func:`trusted_refs`) and its slot decided among the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aot.artifact import Manifest
from aot.cache.index.entry import IndexEntry
from aot.cache.index.served import served_key
from aot.errors import AotError
from aot.signing import identity_problems, verify

log = logging.getLogger(__name__)

__all__ = ["Declared", "Selection", "checked_rows", "select_rows", "trusted_refs"]


class Declared(Protocol):
    """A ref or a release member: the key declared for (name, signature, environment)."""

    @property
    def name(self) -> str: ...
    @property
    def signature(self) -> str: ...
    @property
    def env_fp(self) -> str: ...
    @property
    def key(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Selection:
    """The rows to file, and what was left out.

    ``rows``: in filing order (the loader files each at the front, so the served row of
    each signature comes last). ``served``: signature -> the key served here, when
    known (None: recompiled from another environment's row). ``declared``: the
    signatures a ref or release decides. ``dropped``: (row, why) not served.
    ``missing``: (signature, key, why) declared but not servable from what is stored."""

    rows: tuple[IndexEntry, ...]
    served: dict[str, str | None] = field(default_factory=dict)
    declared: frozenset[str] = frozenset()
    dropped: tuple[tuple[IndexEntry, str], ...] = ()
    missing: tuple[tuple[str, str, str], ...] = ()


def checked_rows(
    entries: Iterable[IndexEntry], signing_key: bytes | None, require: bool = False,
) -> tuple[list[IndexEntry], list[tuple[IndexEntry, str]]]:
    """With a signing key (or ``require``): the rows whose identity columns match their
    manifest and whose manifest is signed with the key; and (row, why) for the others.
    Without one, every row. An unreadable manifest is left to the loader."""
    kept: list[IndexEntry] = []
    refused: list[tuple[IndexEntry, str]] = []
    if signing_key is None and not require:
        # Without a key nothing is signed: the manifest proves nothing the row does not
        # (the loader's own cross-checks of the manifest still apply).
        return list(entries), refused
    for entry in entries:
        try:
            manifest = Manifest.from_json(entry.manifest)
        except AotError:
            kept.append(entry)
            continue
        problems = identity_problems(
            manifest, key=entry.key, name=entry.name, signature=entry.signature,
            program_fp=entry.program_fp, env_fp=entry.env_fp,
        )
        if not problems:
            try:
                verify(manifest, signing_key, require=require)
            except AotError as exc:
                problems.append(str(exc))
        if problems:
            refused.append((entry, "; ".join(problems)))
        else:
            kept.append(entry)
    return kept, refused


def trusted_refs(refs: Iterable[Declared], refused: set[str]) -> list[Declared]:
    """The refs that name no refused row. A ref to an unsigned or altered row proves
    nothing in a signed cache (anyone who can write a row can write a ref): its slot is
    decided as if it had no ref, among the rows that passed the checks."""
    kept: list[Declared] = []
    for ref in refs:
        if ref.key in refused:
            log.warning(
                "aot.load(%r): ignoring the ref of %s to %s: that row failed the signing checks",
                ref.name, ref.signature, ref.key[:12],
            )
        else:
            kept.append(ref)
    return kept


def select_rows(
    entries: Sequence[IndexEntry], declared: Iterable[Declared], env_fp: str, *, release: str | None = None,
) -> Selection:
    """The rows of one name to serve (module docstring). ``entries`` oldest first;
    ``declared``: the name's refs, or the members of ``release``."""
    by_signature: dict[str, list[IndexEntry]] = {}
    for entry in entries:
        by_signature.setdefault(entry.signature, []).append(entry)
    decided: dict[str, dict[str, str]] = {}
    for item in declared:
        decided.setdefault(item.signature, {})[item.env_fp] = item.key
    rows: list[IndexEntry] = []
    served: dict[str, str | None] = {}
    dropped: list[tuple[IndexEntry, str]] = []
    missing: list[tuple[str, str, str]] = []
    for signature in sorted(set(decided) - set(by_signature)):
        keys = decided[signature]
        key = keys.get(env_fp) or next(iter(keys.values()))
        missing.append((signature, key, f"its declared key {key[:12]} is not stored"))
    for signature, members in by_signature.items():
        declared_keys = decided.get(signature)
        if declared_keys is None and release is not None:
            dropped.extend((e, f"not a member of release {release!r}") for e in members)
            continue
        if declared_keys is not None:
            targets = [declared_keys[env_fp]] if env_fp in declared_keys else list(declared_keys.values())
            stored = {e.key: e for e in members}
            found = [stored[k] for k in targets if k in stored]
            if not found:
                missing.append((signature, targets[0], f"its declared key {targets[0][:12]} is not stored"))
                dropped.extend((e, f"{signature} is declared to serve {targets[0][:12]}") for e in members)
                continue
            first: IndexEntry | None = found[0]
            programs = {e.program_fp for e in found}
            served[signature] = targets[0] if env_fp in declared_keys else None
        else:
            first = _legacy(members, signature, env_fp)
            programs = {first.program_fp} if first is not None else {e.program_fp for e in members}
            served[signature] = first.key if first is not None and first.env_fp == env_fp else None
        kept = [e for e in members if e.program_fp in programs]
        for entry in members:
            if entry.program_fp not in programs:
                dropped.append((entry, f"{signature} serves {first.key[:12] if first else '?'} "
                                       f"({'declared' if declared_keys is not None else 'newest, no ref'})"))
        # Filed at the front one by one: the served row last, so it is tried first.
        kept.sort(key=lambda e: (first is not None and e.key == first.key, e.ok, e.created_at, e.key))
        rows.extend(kept)
    for entry, why in dropped:
        log.info("aot.load(%r): not serving %s (%s): %s", entry.name, entry.key[:12], entry.signature, why)
    return Selection(tuple(rows), served, frozenset(decided), tuple(dropped), tuple(missing))


def _legacy(members: Sequence[IndexEntry], signature: str, env_fp: str) -> IndexEntry | None:
    """The legacy rule's row: the newest intact one of this environment, else of any."""
    name = members[0].name
    key = served_key(members, {}, (name, signature, env_fp))
    if key is None:
        intact = [e for e in members if e.ok]
        return max(intact, key=lambda e: (e.created_at, e.key)) if intact else None
    return next(e for e in members if e.key == key)
