"""What ``aot ls`` shows: each entry's row (:mod:`aot.cache.rows`) and the entries of
JAX's persistent cache, for a name glob and an environment filter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.cache.index.jit_records import AOT, JitEntry
from aot.cache.rows import EntryRow, entry_rows, release_slots

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore

__all__ = ["Listing", "list_entries"]


@dataclass(frozen=True, slots=True)
class Listing:
    """The entries of a cache matching a name glob and an environment filter."""

    location: str
    glob: str | None
    env: str
    rows: tuple[EntryRow, ...]
    jit: tuple[JitEntry, ...] = ()  # KIND jit: entries of JAX's persistent cache (aot.jax_cache)

    @property
    def stored_size(self) -> int:
        return sum(row.entry.stored_size for row in self.rows) + sum(e.stored_size for e in self.jit)

    @property
    def superseded(self) -> int:
        return sum(1 for row in self.rows if row.superseded_by)

    #: False when this host's environment is unknown (no ENV says "this").
    environment_known: bool = True
    #: The release SERVED is for (a replica of that label); None: the refs.
    release: str | None = None

    @property
    def other_environments(self) -> int:
        return sum(1 for row in self.rows if not row.environment.this and not row.environment.unknown)

    @property
    def unknown_environments(self) -> int:
        return sum(1 for row in self.rows if row.environment.unknown)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "cache": self.location,
            "env": self.env,
            **({} if self.release is None else {"release": self.release}),
            "count": len(self.rows) + len(self.jit),
            "entries": [{"kind": AOT, **row.to_dict()} for row in self.rows] + [e.to_dict() for e in self.jit],
        }
        if not self.environment_known:
            out["environment_unknown"] = True
        return out


def list_entries(
    cache: ArtifactStore, glob: str | None = None, *, env: str = "all", release: str | None = None,
) -> Listing:
    """Every entry whose name matches ``glob`` (all without one); ``env="this"``:
    only those built for this environment. ``release``: SERVED as a replica of that
    label serves (:func:`served_state`); None: the refs."""
    reads = cache.reader
    entries = reads.entries(glob)
    # A name glob selects every entry of a name or none: they are their own peers.
    current = cache.known_environment()
    if release is not None and not entries:
        release_slots(cache, release, ())  # a mistyped label is an error even with no entries
    rows = entry_rows(cache, entries, env=env, peers=entries, current=current, release=release)
    return Listing(
        cache.display_location, glob, env, tuple(rows), tuple(reads.jit_entries(glob)),
        environment_known=current is not None, release=release,
    )
