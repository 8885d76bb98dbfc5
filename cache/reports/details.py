"""Looking entries up by key or name and describing them (``aot show``)."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.artifact import PORTABLE_HLO, Manifest
from aot.errors import AotError, ArtifactNotFoundError, CorruptArtifactError
from aot.fingerprint import PartDifference
from aot.cache.rows import name_gpus, served_state
from aot.signatures import Signature
from aot.targets import environment_name

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore
    from aot.cache.index.entry import IndexEntry

_HEX = re.compile(r"^[0-9a-fA-F]{1,64}$")

#: The shortest key prefix accepted (shorter ones match too many keys to be safe).
MIN_KEY_PREFIX = 4
_CANDIDATES = 10


def _candidates(cache: ArtifactStore, keys: list[str]) -> str:
    shown = []
    for key in keys[:_CANDIDATES]:
        entry = cache.reader.get(key)
        shown.append(f"{key[:12]} ({entry.name})" if entry is not None else key[:12])
    more = ", ..." if len(keys) > _CANDIDATES else ""
    return ", ".join(shown) + more


def find_entries(cache: ArtifactStore, key_or_name: str) -> list[IndexEntry]:
    """Every entry (any environment or state) named ``key_or_name``; else the one entry
    whose key starts with it (at least :data:`MIN_KEY_PREFIX` hex digits). Raises
    :class:`aot.ArtifactNotFoundError`, listing the candidate keys of a prefix that is
    too short or ambiguous, and close names."""
    entries = cache.reader.by_name(key_or_name, state=None)
    if entries:
        return entries
    if _HEX.match(key_or_name):
        prefix = key_or_name.lower()
        keys = cache.reader.find_key_prefix(prefix, limit=_CANDIDATES + 1)
        if keys and len(prefix) < MIN_KEY_PREFIX:
            raise ArtifactNotFoundError(
                f"no entry named {key_or_name!r}, and {key_or_name!r} is too short for a key "
                f"prefix (give at least {MIN_KEY_PREFIX} hex digits); keys starting with it: "
                f"{_candidates(cache, keys)}"
            )
        if len(keys) > 1:
            raise ArtifactNotFoundError(
                f"key prefix {key_or_name!r} is ambiguous: {_candidates(cache, keys)}; "
                "give more characters"
            )
        if keys:
            entry = cache.reader.get(keys[0])
            if entry is not None:
                return [entry]
    names = sorted({e.name for e in cache.reader.entries()})
    close = difflib.get_close_matches(key_or_name, names, n=3)
    hint = f" (did you mean {' or '.join(repr(n) for n in close)}?)" if close else ""
    raise ArtifactNotFoundError(
        f"no entry named {key_or_name!r} and no key starting with it in the cache at "
        f"{cache.display_location}{hint}; `aot ls` lists what is stored"
    )


@dataclass(frozen=True, slots=True)
class EntryDetails:
    """An entry, its parsed manifest, how it compares with this environment, its
    arguments by path, the newer entry that supersedes it (if any), its HLO."""

    entry: IndexEntry
    manifest: Manifest | None
    manifest_error: str | None
    environment_differences: tuple[PartDifference, ...]
    hlo: str | None = None
    signature: Signature | None = None
    superseded_by: str | None = None
    served_by: str | None = None  # "ref" / "newest" (legacy rule) / "release" when served, else None
    releases: tuple[str, ...] = ()
    #: False when this host's environment is unknown (:meth:`~aot.cache.store.ArtifactStore.known_environment`).
    environment_known: bool = True
    #: The release "served" is for (a replica of that label); None: the refs.
    release: str | None = None

    @property
    def this_environment(self) -> bool:
        return self.manifest is not None and self.environment_known and not self.environment_differences

    @property
    def target(self) -> str | None:
        """What the entry is for (:func:`aot.targets.environment_name`: ``tpu:v5e:2x2``,
        ``cpu x8``); None when its manifest cannot be read."""
        return environment_name(self.manifest.environment.as_dict()) if self.manifest is not None else None

    @property
    def arguments(self) -> Signature:
        if self.signature is not None:
            return self.signature
        return Signature.from_manifest_json(self.entry.manifest, self.entry.signature)

    def to_dict(self) -> dict[str, Any]:
        entry = self.entry.to_dict()
        entry.pop("manifest", None)
        return {
            "entry": entry,
            "manifest": self.manifest.to_dict() if self.manifest is not None else None,
            "manifest_error": self.manifest_error,
            "this_environment": self.this_environment,
            "environment_differences": [d.to_dict() for d in self.environment_differences],
            "target": self.target,
            **({"autotune": self.manifest.autotune} if self.manifest is not None and self.manifest.autotune else {}),
            **({} if self.environment_known else {"environment_unknown": True}),
            "arguments": self.arguments.to_list(),
            "statics": list(self.arguments.statics),
            "superseded_by": self.superseded_by,
            "served": self.served_by is not None,
            "served_by": self.served_by,
            "releases": list(self.releases),
            **({} if self.release is None else {"release": self.release}),
            "hlo": self.hlo,
        }


def portable_hlo_text(cache: ArtifactStore, entry: IndexEntry, *, debug_info: bool = False) -> str:
    """The StableHLO text of an entry's portable HLO blob (``jax.export`` bytes).

    Without ``debug_info`` the source locations (``loc(...)``, which name the files of
    the process that lowered it) are left out.
    """
    import jax

    if entry.hlo_digest is None:
        raise CorruptArtifactError(
            f"{entry.name} ({entry.key[:12]}) has no portable HLO blob (it was compiled "
            "into a read-only cache or imported without one); recompile it to get one"
        )
    blob = cache.artifact(entry).blob(PORTABLE_HLO)
    try:
        text = str(jax.export.deserialize(bytearray(blob)).mlir_module())
    except Exception as exc:  # noqa: BLE001 - jax raises various kinds on bad bytes
        raise CorruptArtifactError(
            f"{entry.name} ({entry.key[:12]}): the portable HLO blob does not deserialize: {exc}"
        ) from None
    return text if debug_info else _without_locations(text)


def _without_locations(text: str) -> str:
    try:
        from aot.jaxcompat.mlir import text_without_locations

        return text_without_locations(text)
    except Exception:  # noqa: BLE001 - private API: fall back to the text as stored
        return text


def describe_entries(
    cache: ArtifactStore, key_or_name: str, *, hlo: bool = False, debug_info: bool = False,
    release: str | None = None,
) -> list[EntryDetails]:
    """:func:`find_entries`, each with its manifest, environment differences, named
    arguments, supersession and HLO. ``release``: whether each is served is said for
    a replica of that label (:func:`~aot.cache.rows.served_state`)."""
    found = find_entries(cache, key_or_name)
    name_gpus(cache, found)  # cuda:NAME for the entries of a captured GPU
    peers = [p for name in sorted({e.name for e in found}) for p in cache.reader.by_name(name)]
    superseded, served, labels = served_state(cache, peers, {e.name for e in found}, release)
    details = []
    current = cache.known_environment() if found else None
    for entry in found:
        manifest: Manifest | None
        try:
            manifest = Manifest.from_json(entry.manifest)
            error = None
            diffs = manifest.environment.diff(current) if current is not None else ()
        except AotError as exc:
            manifest, error, diffs = None, str(exc), ()
        text = portable_hlo_text(cache, entry, debug_info=debug_info) if hlo else None
        signature = (
            Signature.from_manifest_args(manifest.args, manifest.statics) if manifest is not None
            else Signature.flat(entry.signature)
        )
        details.append(EntryDetails(
            entry, manifest, error, diffs, text, signature, superseded.get(entry.key),
            served.get(entry.key), tuple(labels.get(entry.key, ())), current is not None, release,
        ))
    return details
