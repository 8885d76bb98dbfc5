"""Reading serving statistics back: what ``aot stats`` shows, from the index's
``call_stats`` table. The value objects are :mod:`aot.cache.stats_report`; recording
them (on the serving path, cheap to import) is :mod:`aot.cache.stats_recorder`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from aot.cache.stats_report import SignatureStats, StatsReport, ordered
from aot.signatures import Signature

if TYPE_CHECKING:
    from aot.cache.index.served import Slot
    from aot.cache.store import ArtifactStore
    from aot.fingerprint import Fingerprint

__all__ = ["environment_targets", "named_signatures", "read_stats", "release_memberships", "zero_stats"]


def read_stats(
    cache: ArtifactStore, name_glob: str | None = None, *, env: str = "all", arguments: bool = True,
) -> StatsReport:
    """The statistics stored in ``cache``'s index (or its local tier's; names matching
    ``name_glob``; ``env="this"``: this environment's only), most called first: what
    every process that served from it wrote. (What this process counted on a
    read-only cache, kept in memory, is :meth:`StatsRecorder.report`.)

    ``arguments=False`` leaves :attr:`StatsReport.named` empty (signatures shown flat):
    the entries' manifests are not read, which is most of the work on a large index;
    :meth:`StatsReport.to_dict` (``aot stats --json``) never uses them."""
    current = cache.known_environment()
    # Unknown here: no row is this environment's, and --env this shows none.
    this = current.digest if current is not None else "unknown"
    reads = cache.stats_cache.reader
    rows = []
    for data in reads.call_stats(name_glob, this if env == "this" else None):
        data.pop("signature_digest", None)
        rows.append(SignatureStats(this_environment=data["env_fp"] == this, **data))
    return StatsReport(
        reads.url, ordered(rows), env, stored=True, named=named_signatures(cache, rows) if arguments else {},
        jit=tuple(reads.jit_stats(name_glob)), jit_stored=len(reads.jit_entries(name_glob)),
        environment_known=current is not None, targets=environment_targets(cache, rows, current),
    )


def environment_targets(
    cache: ArtifactStore, rows: Iterable[SignatureStats], current: Fingerprint | None = None,
) -> dict[str, str]:
    """env_fp -> what each row's environment is for (``tpu:v5e:2x2``, ``cpu x8``): this
    host's from its fingerprint, any other's from the manifest of one entry stored for
    it (one manifest per environment, never per signature); an environment with no
    entry is left out (nothing when the index cannot be read)."""
    from aot.cache.rows import environment_names
    from aot.errors import AotError
    from aot.targets import environment_name

    out: dict[str, str] = {}
    wanted = {row.env_fp for row in rows}
    if current is not None and current.digest in wanted:
        out[current.digest] = environment_name(current.as_dict())
        wanted.discard(current.digest)
    if wanted:
        try:
            out.update(environment_names(cache, cache.reader.environment_keys(wanted)))
        except AotError:
            pass
    return out


def release_memberships(cache: ArtifactStore, rows: Iterable[SignatureStats]) -> dict[Slot, str]:
    """(name, signature, env_fp) -> the release labels whose current set has that
    signature, comma-separated and sorted (``candidate,prod``); a signature in no
    release is left out. ``aot stats --prometheus``'s ``release`` label."""
    reads = cache.reader
    names = sorted({row.name for row in rows})
    found: dict[Slot, list[str]] = {}
    for label in sorted(reads.release_labels()):
        for name in names:
            for member in reads.release_members(label, name) or ():
                found.setdefault(member.slot, []).append(label)
    return {slot: ",".join(labels) for slot, labels in found.items()}


def named_signatures(
    cache: ArtifactStore, rows: Iterable[SignatureStats],
) -> dict[tuple[str, str], Signature]:
    """(name, flat signature) -> the signature by argument name, from the manifests of
    the stored entries of the rows' names (nothing when the index cannot be read).
    One manifest per (name, signature) of the rows (the smallest key's), read through
    the name index; a name with a row that has no entry of its own (a miss) also has
    all its other signatures read, which lend theirs (:meth:`StatsReport.arguments`)."""
    from aot.errors import AotError

    wanted = {(row.name, row.signature) for row in rows}
    named: dict[tuple[str, str], Signature] = {}
    parse = Signature.from_manifest_json
    try:
        reads = cache.reader
        found = reads.signature_manifests(wanted)
        lending = {name for name, signature in wanted if (name, signature) not in found}
        for pair, manifest in found.items():
            if pair[0] not in lending:
                named[pair] = parse(manifest, pair[1])
        if lending:  # every stored signature of these names, in the order the index groups them
            keys = reads.signature_keys(lending)
            manifests = reads.manifests(keys.values())
            for pair, key in keys.items():
                if key in manifests:
                    named[pair] = parse(manifests[key], pair[1])
    except AotError:
        return {}
    return named


def zero_stats(cache: ArtifactStore, name_glob: str | None = None, *, env: str = "all") -> int:
    """Deletes the statistics (matching ``name_glob``, in ``env``); how many rows.
    Entries' ``hits`` and last-used times are left alone (gc needs them)."""
    from aot.cache.index.call_stats import delete_call_stats

    cache.stats.flush()  # what this process counted goes too
    cache.stats.zero(name_glob)
    target = getattr(cache, "stats_cache", cache)
    target.check_writable("reset the call statistics")
    # The real fingerprint (never the listing record) decides what is deleted; not needed for all.
    this = cache.environment.digest if env == "this" else None
    return delete_call_stats(target.index, name_glob, this)

