"""``aot rm``: remove chosen entries, planned first (huggingface_hub's delete strategy).

:func:`plan_removal` selects entries by key (a full key or a unique prefix of at
least four hex digits) or by name glob, optionally only some input signatures and
only this environment's, and returns a frozen :class:`RemovalPlan` with the blobs only
those entries use and the bytes that frees. :func:`execute_removal` carries it out:
index rows first, then the blobs no remaining row references (re-read after the rows
are gone, so a blob another entry shares, or that a writer has just referenced, is
kept). A crash in between leaves only unreferenced blobs, which ``aot gc`` removes.

An entry a release label pins (a member of a set the label serves or a ``rollback``
could reach) is marked in the plan with the labels (:attr:`RemovalVictim.pinned_by`),
and :func:`execute_removal` refuses the plan unless ``force``: removing it would take
down whatever serves, or rolls back to, that label.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from aot.errors import ArtifactNotFoundError, CacheError, SpecError
from aot.cache.index.entry import IndexEntry, referenced_digests
from aot.cache.index.jit_records import JitEntry
from aot.cache.rows import EntryRow, check_env_choice, entry_rows
from aot.cache.admin.gc_selection import kept_by_rows
from aot.cache.admin.maintenance import delete_unreferenced_blobs
from aot.signatures import Signature
from aot.cache.units import human_size

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore

log = logging.getLogger(__name__)

__all__ = [
    "RemovalPlan",
    "RemovalVictim",
    "SignatureFilter",
    "execute_removal",
    "plan_removal",
]

_HEX = re.compile(r"^[0-9a-fA-F]{4,64}$")
_TOP_LEVEL_COMMA = re.compile(r",\s*(?![^\[]*\])")


# ---------------------------------------------------------------- signature filters


def _normalize_aval(text: str, whole: str) -> str:
    """One aval of the signature ``whole``; an error quotes the whole signature, then
    the part that does not parse."""
    from aot.specs import format_aval, spec

    try:
        struct = spec(text.strip())
    except SpecError as exc:
        raise SpecError(f"malformed signature {whole!r}: {exc}") from None
    return format_aval(struct.shape, struct.dtype, struct.weak_type)


@dataclass(frozen=True, slots=True)
class SignatureFilter:
    """Selects entries by input signature.

    Either a whole flat signature, exactly as stored (``"f32[8], f32[8]"``; dtype
    aliases such as ``float32[8]`` are accepted), or one or more leaves named by path
    (``"x: f32[1,784]"``, ``"params[0]['b']: f32[512], x: f32[1,784]"``), each of which
    the entry must have.
    """

    text: str
    flat: str | None
    leaves: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, text: str) -> SignatureFilter:
        items = [item.strip() for item in _TOP_LEVEL_COMMA.split(text) if item.strip()]
        if not items:
            raise SpecError("--signature is empty; give e.g. 'f32[8], f32[8]' or 'x: f32[8,784]'")
        named = [item.rpartition(":") for item in items]
        if not any(sep for _, sep, _ in named):
            return cls(text, ", ".join(_normalize_aval(item, text) for item in items), ())
        leaves = []
        for item, (path, sep, aval) in zip(items, named):
            if not sep or not path.strip():
                raise SpecError(
                    f"--signature {text!r}: {item!r} has no path; name every leaf "
                    "('x: f32[8], y: f32[8]') or none ('f32[8], f32[8]')"
                )
            leaves.append((path.strip(), _normalize_aval(aval, text)))
        return cls(text, None, tuple(leaves))

    def matches(self, entry: IndexEntry, signature: Signature) -> bool:
        if self.flat is not None:
            return entry.signature == self.flat
        have = {(leaf.path, leaf.aval) for leaf in signature.leaves}
        return all(leaf in have for leaf in self.leaves)


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class RemovalVictim:
    key: str
    name: str
    signature: str
    arguments: Signature
    environment: str  # "this" or the first differing part (EnvironmentStatus.short)
    status: str  # ok, superseded or quarantined
    stored_size: int
    kind: str = "aot"  # or "jit": an entry of JAX's cache (aot.jax_cache)
    #: The release labels that pin it ("prod", "prod (rollback target)"): rm refuses
    #: it without force.
    pinned_by: tuple[str, ...] = ()

    def describe(self, width: int | None = None) -> str:
        if self.kind == "jit":
            return f"{self.key[:40]}  {self.name} (jit)"
        return f"{self.key[:12]}  {self.name} ({self.arguments.compact(width)})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "key": self.key,
            "name": self.name,
            "signature": self.signature,
            "arguments": self.arguments.to_list(),
            "environment": self.environment,
            "status": self.status,
            "stored_size": self.stored_size,
            "pinned_by": list(self.pinned_by),
        }

    @classmethod
    def of(cls, row: EntryRow, pinned_by: tuple[str, ...] = ()) -> RemovalVictim:
        e = row.entry
        return cls(
            e.key, e.name, e.signature, row.signature, row.environment.short(), row.status,
            e.stored_size, pinned_by=pinned_by,
        )

    @classmethod
    def of_jit(cls, entry: JitEntry) -> RemovalVictim:
        return cls(entry.key, entry.name, "", Signature(()), entry.platform, "ok", entry.stored_size, kind="jit")


@dataclass(frozen=True, slots=True)
class RemovalPlan:
    """What ``aot rm`` removes (or removed): entries, the blobs only they use, bytes."""

    target: str
    signatures: tuple[str, ...]
    env: str
    entries: tuple[RemovalVictim, ...]
    blobs: tuple[str, ...]
    bytes_freed: int
    executed: bool = False

    @property
    def pinned(self) -> tuple[RemovalVictim, ...]:
        """The entries a release label pins (removing them needs ``force``)."""
        return tuple(v for v in self.entries if v.pinned_by)

    def pinned_labels(self) -> tuple[str, ...]:
        """The labels (without the rollback notes) that pin an entry of the plan."""
        labels = (why.split(" (", 1)[0] for v in self.pinned for why in v.pinned_by)
        return tuple(sorted(set(labels)))

    def refusal(self) -> str:
        """Why :func:`execute_removal` refuses the plan without force."""
        pinned = self.pinned
        shown = "; ".join(f"{v.key[:12]} {v.name}: {', '.join(v.pinned_by)}" for v in pinned[:5])
        more = f"; and {len(pinned) - 5} more" if len(pinned) > 5 else ""
        n = len(pinned)
        return (
            f"refusing to remove {n} entr{'y' if n == 1 else 'ies'} that release "
            f"label{'s' if len(self.pinned_labels()) != 1 else ''} {', '.join(self.pinned_labels())} "
            f"pin{'s' if len(self.pinned_labels()) == 1 else ''} ({shown}{more}): whatever serves or rolls "
            "back to them would find nothing. Promote or roll the labels elsewhere, or `aot release rm` "
            "them, first; --force removes the entries anyway"
        )

    def summary(self) -> str:
        verb = "removed" if self.executed else "would remove"
        return (
            f"{verb} {len(self.entries)} entr{'y' if len(self.entries) == 1 else 'ies'} and "
            f"{len(self.blobs)} blob{'s' if len(self.blobs) != 1 else ''}, freeing "
            f"{human_size(self.bytes_freed)}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "signatures": list(self.signatures),
            "env": self.env,
            "executed": self.executed,
            "entries": [v.to_dict() for v in self.entries],
            "blobs": list(self.blobs),
            "bytes_freed": self.bytes_freed,
            "pinned": [v.key for v in self.pinned],
        }


def _select(cache: ArtifactStore, target: str) -> list[IndexEntry]:
    reads = cache.reader
    entries = reads.entries(target)
    if entries:
        return entries
    if _HEX.match(target):
        keys = reads.find_key_prefix(target.lower(), limit=11)
        if len(keys) > 1:
            shown = ", ".join(k[:12] for k in keys[:10]) + (", ..." if len(keys) > 10 else "")
            raise ArtifactNotFoundError(
                f"key prefix {target!r} is ambiguous ({shown}); give more characters"
            )
        if keys:
            entry = reads.get(keys[0])
            if entry is not None:
                return [entry]
    import difflib

    names = sorted({e.name for e in reads.entries()})
    close = difflib.get_close_matches(target, names, n=3)
    hint = f" (did you mean {' or '.join(repr(n) for n in close)}?)" if close else ""
    raise ArtifactNotFoundError(
        f"no entry named {target!r} (as a name glob) and no key starting with it in the "
        f"cache at {cache.display_location}{hint}; `aot ls` lists what is stored"
    )


def _digests(entry: IndexEntry) -> set[str]:
    return referenced_digests(entry)


def plan_removal(
    cache: ArtifactStore, target: str, *, signatures: Sequence[str] = (), env: str = "all",
) -> RemovalPlan:
    """The entries ``target`` (a key, a unique key prefix, or a name glob) selects,
    narrowed to ``signatures`` (any of them; see :class:`SignatureFilter`) and, with
    ``env="this"``, to this environment's. Raises :class:`aot.ArtifactNotFoundError`
    when nothing matches the target; a filter that leaves nothing is an empty plan."""
    check_env_choice(env)
    filters = [SignatureFilter.parse(s) for s in signatures]
    # KIND jit entries (by function name glob or key prefix): they have no input
    # signature and no environment of ours, so a --signature or --env this filter
    # leaves them out.
    jit = cache.reader.jit_entries(target) if not filters and env == "all" else []
    try:
        selected = _select(cache, target)
    except ArtifactNotFoundError:
        if not jit:
            raise
        selected = []
    if env == "this":
        # What is deleted is decided with the real fingerprint, never the listing record
        # (known_environment uses it once JAX is imported).
        cache.environment  # noqa: B018
    rows = entry_rows(cache, selected, env=env, current=cache.known_environment())
    if filters:
        rows = [r for r in rows if any(f.matches(r.entry, r.signature) for f in filters)]
    victims = {r.entry.key for r in rows}
    survivors: set[str] = set()
    alive: set[str] = set()  # the programs an entry of which survives
    reads = cache.reader  # the plan reads without SQLAlchemy on a folder cache
    for entry in reads.entries():
        if entry.key not in victims:
            survivors |= _digests(entry)
            alive.add(entry.program_fp)
    jit_keys = {e.key for e in jit}
    if rows or jit:
        survivors |= {e.digest for e in reads.jit_entries() if e.key not in jit_keys}
    candidates = set().union(*(_digests(r.entry) for r in rows), {e.digest for e in jit})
    unkept = sorted(candidates - survivors)
    freed_blobs = sorted(set(unkept) - kept_by_rows(reads, unkept, alive, victims | jit_keys))
    sizes = reads.blob_sizes()
    freed = sum(sizes.get(d, 0) for d in freed_blobs)
    pins = _release_pins(cache) if rows else {}
    return RemovalPlan(
        target, tuple(signatures), env,
        (*(RemovalVictim.of(r, pins.get(r.entry.key, ())) for r in rows), *(RemovalVictim.of_jit(e) for e in jit)),
        tuple(freed_blobs), freed,
    )


def _release_pins(cache: ArtifactStore) -> dict[str, tuple[str, ...]]:
    """``{key: labels}`` of the entries a release label pins (as gc keeps them)."""
    prefix = "release "
    return {
        key: tuple(why[len(prefix):] for why in whys if why.startswith(prefix))
        for key, whys in cache.reader.pin_reasons().items()
        if any(why.startswith(prefix) for why in whys)
    }


def execute_removal(cache: ArtifactStore, plan: RemovalPlan, *, force: bool = False) -> RemovalPlan:
    """Deletes the plan's index rows, then its blobs that no row references any more.
    Raises :class:`aot.CacheError` naming the labels when a release pins an entry of
    the plan, unless ``force``."""
    cache.check_writable("remove entries")
    if not force:
        # Read again: a label may have been promoted onto an entry since the plan.
        pins = _release_pins(cache)
        now = replace(plan, entries=tuple(
            replace(v, pinned_by=pins.get(v.key, ())) if v.kind == "aot" else v for v in plan.entries
        ))
        if now.pinned:
            raise CacheError(now.refusal())
    aot_keys = [v.key for v in plan.entries if v.kind == "aot"]
    if aot_keys:
        cache.index.delete(aot_keys)
    cache.index.jit_delete(v.key for v in plan.entries if v.kind == "jit")
    # The blobs go through gc's protocol: each re-checked under the index's lock, so a
    # writer storing one of them again meanwhile keeps it.
    removed, freed = delete_unreferenced_blobs(cache, list(plan.blobs))
    log.info("rm: removed %d entries and %d blobs", len(plan.entries), len(removed))
    return replace(plan, blobs=tuple(removed), bytes_freed=freed, executed=True)


def remove(
    cache: ArtifactStore, target: str, *, signatures: Iterable[str] = (), env: str = "all",
    dry_run: bool = False, force: bool = False,
) -> RemovalPlan:
    """:func:`plan_removal`, then (unless ``dry_run``) :func:`execute_removal`."""
    plan = plan_removal(cache, target, signatures=tuple(signatures), env=env)
    return plan if dry_run else execute_removal(cache, plan, force=force)
