"""What gc selects besides age, size and supersession: the signatures a manifest no
longer lists (``aot gc --manifest M``), and the entries of a retired JAX release
(``aot gc --jax-release 0.9.2``).

An entry's JAX release is part of its environment (the ``jax`` and ``jaxlib`` parts of
its environment fingerprint: :func:`aot.environment.environment_parts`), so the
entries of one release are those of the environments whose ``jax`` or ``jaxlib`` part
names it. Once no host runs the release, nothing serves them: the refs of those
environments and the release sets' members for them (a label holds one member per
(name, signature, environment): docs/jax-releases.md) serve no host either, and are
dropped with the entries, after the plan says which.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from aot.cache.index.entry import BLOB_OWNERS, IndexEntry
from aot.cache.index.protocol import IndexReader

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore

__all__ = ["entry_release", "kept_by_rows", "release_environments", "retire_reason", "stale_signatures"]


def stale_signatures(
    cache: ArtifactStore, manifest: str | os.PathLike[str], reads: IndexReader | None = None,
) -> frozenset[tuple[str, str]]:
    """(name, signature) of the refs and entries whose name manifest ``manifest`` lists
    but not with that signature (a changed layer size leaves the old ones behind);
    read through ``reads`` (default the cache's reader)."""
    from aot.cache.warmup.manifest import expand, load_manifest
    from aot.cache.warmup.functions import item_signature

    wanted: dict[str, set[str]] = {}
    for item in expand(load_manifest(manifest)):
        wanted.setdefault(item.name, set()).add(item_signature(item))
    reads = cache.reader if reads is None else reads
    stale = {(r.name, r.signature) for r in reads.refs() if r.name in wanted and r.signature not in wanted[r.name]}
    for name, signatures in wanted.items():
        stale |= {(e.name, e.signature) for e in reads.by_name(name, state=None) if e.signature not in signatures}
    return frozenset(stale)


def entry_release(manifest_json: str) -> tuple[str | None, str | None]:
    """(jax, jaxlib) of the environment an entry was compiled for, from its manifest
    text; (None, None) when it cannot be read."""
    try:
        parts = json.loads(manifest_json)["environment"]["parts"]
    except (ValueError, KeyError, TypeError):
        return None, None
    if not isinstance(parts, Mapping):
        return None, None
    jax, jaxlib = parts.get("jax"), parts.get("jaxlib")
    return (jax if isinstance(jax, str) else None), (jaxlib if isinstance(jaxlib, str) else None)


def release_environments(entries: Iterable[IndexEntry], jax_release: str) -> frozenset[str]:
    """The environment digests among ``entries`` whose ``jax`` or ``jaxlib`` part is
    ``jax_release`` (one manifest read per environment)."""
    seen: dict[str, bool] = {}
    for entry in entries:
        if entry.env_fp not in seen:
            seen[entry.env_fp] = jax_release in entry_release(entry.manifest)
    return frozenset(env for env, retired in seen.items() if retired)


def retire_reason(jax_release: str, pins: Iterable[str]) -> str:
    """Why gc removes an entry of a retired release, with what it unpins."""
    whys = list(dict.fromkeys(pins))
    return f"JAX release {jax_release} retired" + (f"; unpins: {', '.join(whys)}" if whys else "")


def kept_by_rows(
    reads: IndexReader, digests: Sequence[str], programs: Collection[str], victims: Collection[str],
) -> set[str]:
    """Those of ``digests`` (blobs of the entries a plan deletes) that a row the run
    keeps still references, as the run's deletion lock will find (so that the plan
    equals its run): a programs row of a program in ``programs`` (one of its entries
    survives; the row's HLO may be an older release's export, which only a deleted entry
    had), an artifact or jit row not among ``victims``, and a row of any table gc never
    deletes rows of (a journaled release set or captured GPU)."""
    return {d for d, table, owner in reads.referencing(digests) if (table == "programs" and owner in programs)
            or table not in BLOB_OWNERS or (table != "programs" and owner not in victims)}
