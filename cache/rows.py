"""An entry's row as the listings show it (``aot ls``, ``aot rm``'s plan): its named
signature, whether it was built for this environment (or which part differs), whether
it is served, by what, or superseded, and the release labels that name it.

An entry is *served* when ``aot.load`` serves it for its (name, signature, environment):
the key its ref names, else (no ref: a cache written before refs) the newest intact
entry (:mod:`aot.cache.index.served`). Every other intact entry of that slot is
*superseded* by it and only takes space (``aot gc --superseded``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.cache.index.entry import IndexEntry
from aot.cache.index.served import Slot, ref_map, served_key, superseded_keys
from aot import platforms
from aot.platforms.tuning import Tuning
from aot.signatures import Signature
from aot.targets import environment_name

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from aot.cache.index.releases import Release
    from aot.cache.store import ArtifactStore
    from aot.fingerprint import Fingerprint, PartDifference

ENV_CHOICES = ("this", "all")

__all__ = [
    "ENV_CHOICES", "EntryRow", "EnvironmentStatus", "check_env_choice", "entry_rows", "environment_names",
    "environment_parts_of", "environment_statuses", "jax_release",
    "release_labels", "release_slots", "served_keys", "served_state", "set_targets",
]


@dataclass(frozen=True, slots=True)
class EnvironmentStatus:
    """How an entry's environment compares with this process's: the same, or the
    parts that differ (``device_count 8 != 1``: stored value first)."""

    this: bool
    differences: tuple[PartDifference, ...] = ()
    error: str | None = None  # the manifest could not be read
    #: This host's environment is not known (not recorded, and finding it out would
    #: open the device: :meth:`~aot.cache.store.ArtifactStore.known_environment`).
    unknown: bool = False
    #: What the entry is for (:func:`aot.targets.environment_name`): a device target's
    #: name (``tpu:v5e:2x2``), else ``cpu x8``; None when the manifest cannot be read.
    target: str | None = None
    #: The JAX release that compiled it (:func:`jax_release`: ``0.9.2``); None when the
    #: manifest cannot be read.
    jax: str | None = None
    jaxlib: str | None = None

    def short(self) -> str:
        """``this``, or the first differing part with its stored value
        (``device_count 8``, ``+2`` when more parts differ)."""
        if self.this:
            return "this"
        if self.unknown:
            return "unknown"
        if not self.differences:
            return "unreadable" if self.error else "other"
        first = self.differences[0]
        text, shown = f"{first.part} {_clip(first.expected)}", 1
        if first.part == "platform":  # another accelerator: name it (``TPU v5 lite x4``)
            stored = {d.part: d.expected for d in self.differences}
            kind, count = stored.get("device_kind"), stored.get("device_count")
            if kind is not None:
                text = _clip(kind) + (f" x{count}" if count is not None else "")
                shown += 1 + (count is not None)
        if len(self.differences) > shown:
            text += f" +{len(self.differences) - shown}"
        return text

    def describe(self) -> str:
        """``this environment`` or ``another environment (device_count 8 != 1; ...)``."""
        if self.this:
            return "this environment"
        if self.unknown:
            return "an environment not known to be this host's (this host's environment is not recorded yet)"
        if not self.differences:
            return f"another environment ({self.error or 'unknown differences'})"
        return "another environment (" + "; ".join(d.describe() for d in self.differences) + ")"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "this_environment": self.this,
            "environment_differences": [d.to_dict() for d in self.differences],
            "target": self.target,
            "jax": self.jax,
            "jaxlib": self.jaxlib,
        }
        if self.unknown:
            out["environment_unknown"] = True
        return out


def _clip(value: str | None, limit: int = 24) -> str:
    if value is None:
        return "(absent)"
    return value if len(value) <= limit else value[: limit - 3] + "..."


# Most telling first: the short form (``aot ls``'s ENV column) shows the first one.
_PART_ORDER = (
    "platform", "device_kind", "device_count", "process_count", "topology", "x64",
    "jaxlib", "jax", "platform_version", "xla_flags", "cpu_isa",
)


def _ordered(diffs: Iterable[PartDifference]) -> tuple[PartDifference, ...]:
    rank = {part: i for i, part in enumerate(_PART_ORDER)}
    return tuple(sorted(diffs, key=lambda d: (rank.get(d.part, len(rank)), d.part)))


def environment_statuses(
    entries: Iterable[IndexEntry], current: Fingerprint | None
) -> dict[str, EnvironmentStatus]:
    """Each entry's :class:`EnvironmentStatus` by key (one manifest parse per
    environment digest, not per entry); ``current`` None: this host's is unknown."""
    from aot.fingerprint import Fingerprint as _Fingerprint

    by_env: dict[str, EnvironmentStatus] = {}
    out: dict[str, EnvironmentStatus] = {}
    for entry in entries:
        status = by_env.get(entry.env_fp)
        if status is None:
            stored, error = None, None
            try:
                stored = _Fingerprint.from_dict(json.loads(entry.manifest)["environment"])
            except Exception as exc:  # noqa: BLE001 - verify reports unreadable manifests
                error = f"unreadable manifest: {exc!r}"[:120]
            parts = stored.as_dict() if stored is not None else {}
            target = environment_name(parts) if stored is not None else None
            versions: dict[str, Any] = {"target": target, "jax": parts.get("jax"), "jaxlib": parts.get("jaxlib")}
            if current is None:
                status = EnvironmentStatus(False, unknown=True, **versions)
            elif entry.env_fp == current.digest:
                status = EnvironmentStatus(True, **versions)
            elif stored is None:
                status = EnvironmentStatus(False, error=error)
            else:
                status = EnvironmentStatus(False, _ordered(stored.diff(current)), **versions)
            by_env[entry.env_fp] = status
        out[entry.key] = status
    return out


def set_targets(cache: ArtifactStore, sets: Iterable[Release]) -> dict[int, dict[str, int]]:
    """``{set id: {target: members}}``: what each release set serves on
    (``{"tpu:v5e:1x1": 8, "tpu:v5e:2x2": 1}``), from its members (a label's history
    lists its sets without them: they are read here)."""
    from collections import Counter

    members = {}
    for release in sets:
        found = cache.index.release_set(release.label, set_id=release.id)
        members[release.id] = found.members if found is not None else ()
    names = environment_names(cache, {m.env_fp: m.key for ms in members.values() for m in ms})
    return {
        set_id: dict(sorted(Counter(names.get(m.env_fp, "unknown") for m in ms).items()))
        for set_id, ms in members.items()
    }


def _captured(platform: str) -> bool:
    room = platforms.of(platform)
    return room is not None and room.CAPTURED_CONFIGS


def name_gpus(cache: ArtifactStore, entries: Sequence[IndexEntry] | None) -> None:
    """Makes the cache's captured GPUs known to :func:`aot.targets.environment_name`
    (``cuda:fleet``) when ``entries`` (None: any) hold a GPU's; a cache that cannot say
    (read-only copy without the table) leaves GPU entries named by device."""
    from aot.platforms.cuda import captured_in_use, use_captured

    if captured_in_use() is not None or (entries is not None and not any(_captured(e.platform) for e in entries)):
        return
    try:
        from aot.cache.index.targets import write_targets

        use_captured(write_targets(cache.index, cache.location)[1])
    except Exception as exc:  # noqa: BLE001 - naming is a courtesy of the listing
        log.debug("captured GPUs not read: %s", exc)


def environment_names(cache: ArtifactStore, keys_by_env: Mapping[str, str]) -> dict[str, str]:
    """``{env_fp: name}`` (:func:`aot.targets.environment_name`: ``tpu:v5e:2x2``,
    ``cpu x8``) of each environment digest, read from the manifest of one entry of it
    (``keys_by_env``: env_fp -> a key); an environment whose manifest cannot be read is
    left out. Reads the index only: no JAX, no device."""
    return {env: environment_name(parts) for env, parts in environment_parts_of(cache, keys_by_env).items()}


def environment_parts_of(cache: ArtifactStore, keys_by_env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """``{env_fp: parts}`` of each environment digest, as :func:`environment_names`
    reads them."""
    from aot.fingerprint import Fingerprint as _Fingerprint

    name_gpus(cache, None)
    manifests = cache.reader.manifests(set(keys_by_env.values()))
    out: dict[str, dict[str, str]] = {}
    for env_fp, key in keys_by_env.items():
        try:
            out[env_fp] = _Fingerprint.from_dict(json.loads(manifests[key])["environment"]).as_dict()
        except Exception:  # noqa: BLE001 - a missing or unreadable manifest names nothing
            continue
    return out


def jax_release(jax: str | None, jaxlib: str | None) -> str:
    """The JAX release as listings show it: ``0.9.2``, ``0.9.2 (jaxlib 0.9.1)`` when the
    two differ, ``-`` when unknown."""
    if jax is None:
        return "-" if jaxlib is None else f"jaxlib {jaxlib}"
    return jax if jaxlib in (None, jax) else f"{jax} (jaxlib {jaxlib})"


@dataclass(frozen=True, slots=True)
class EntryRow:
    """One entry of a listing."""

    entry: IndexEntry
    signature: Signature
    environment: EnvironmentStatus
    superseded_by: str | None = None
    #: "ref" (declared), "newest" (legacy rule, no ref), "release" (a member of the
    #: release listed for) or None
    served_by: str | None = None
    releases: tuple[str, ...] = ()  # labels whose current set names this entry

    @property
    def served(self) -> bool:
        """Whether ``aot.load`` serves this entry for its signature and environment."""
        return self.served_by is not None

    @property
    def status(self) -> str:
        """``ok``, ``superseded`` or ``quarantined``."""
        if not self.entry.ok:
            return self.entry.state
        return "superseded" if self.superseded_by else "ok"

    @property
    def autotune(self) -> str | None:
        """A GPU entry's autotuning (:func:`autotune_of`); None elsewhere."""
        return autotune_of(self.entry.manifest)[0]

    def to_dict(self) -> dict[str, Any]:
        data = self.entry.to_dict()
        data.pop("manifest", None)
        state, digest = autotune_of(self.entry.manifest)
        if state is not None:  # GPU entries only: the others' JSON is as it was
            data["autotune"] = state
            data["autotune_digest"] = digest
        data["arguments"] = self.signature.to_list()
        data["statics"] = list(self.signature.statics)
        data.update(self.environment.to_dict())
        data["superseded_by"] = self.superseded_by
        data["served"] = self.served
        data["served_by"] = self.served_by
        data["releases"] = list(self.releases)
        return data


def autotune_of(manifest: str | None) -> tuple[str | None, str | None]:
    """(``tuned``, ``defaults`` or ``measured``; the digest of the results) of a GPU
    entry's manifest (:func:`aot.platforms.cuda.compile_tuned`); (None, None) elsewhere."""
    if not manifest or '"autotune"' not in manifest:
        return None, None
    try:
        value = json.loads(manifest).get("autotune")
    except ValueError:
        return None, None
    tuning = Tuning.parse(value)
    return (tuning.state, tuning.results) if tuning is not None else (None, None)


def check_env_choice(env: str) -> str:
    if env not in ENV_CHOICES:
        raise ValueError(f"env must be one of {ENV_CHOICES}, got {env!r}")
    return env


def entry_rows(
    cache: ArtifactStore, entries: Sequence[IndexEntry], *, env: str = "all",
    peers: Sequence[IndexEntry] | None = None, current: Fingerprint | None,
    release: str | None = None,
) -> list[EntryRow]:
    """Rows for ``entries``, filtered by ``env``. Supersession is decided among
    ``peers`` (default: every intact entry of the names in ``entries``). ``current``:
    this host's environment (:meth:`~aot.cache.store.ArtifactStore.known_environment`; None: unknown)."""
    check_env_choice(env)
    name_gpus(cache, entries)
    if peers is None:
        peers = [p for name in sorted({e.name for e in entries}) for p in cache.reader.by_name(name)]
    superseded, served, labels = served_state(cache, peers, {e.name for e in entries}, release)
    statuses = environment_statuses(entries, current)
    rows = []
    for entry in entries:
        status = statuses[entry.key]
        if env == "this" and not status.this:
            continue
        rows.append(EntryRow(
            entry, Signature.from_manifest_json(entry.manifest, entry.signature), status,
            superseded.get(entry.key), served.get(entry.key), tuple(labels.get(entry.key, ())),
        ))
    return rows


def served_keys(entries: Sequence[IndexEntry], refs: Mapping[Slot, str]) -> dict[str, str]:
    """``{key: "ref" | "newest"}`` of the entries served, one per (name, signature,
    environment) among ``entries``: the ref'd key, else the legacy rule's newest."""
    out: dict[str, str] = {}
    for slot in sorted({(e.name, e.signature, e.env_fp) for e in entries}):
        key = served_key(entries, refs, slot)
        if key is not None:
            out[key] = "ref" if slot in refs else "newest"
    return out


def served_state(
    cache: ArtifactStore, peers: Sequence[IndexEntry], names: Iterable[str], release: str | None = None,
) -> tuple[dict[str, str], dict[str, str], dict[str, list[str]]]:
    """For the entries of ``names`` (``peers``: every entry of them): which each is
    superseded by, how each served one is served (:func:`served_keys`) and the
    release labels naming each (:func:`release_labels`), by key.

    ``release``: as a replica serving that label serves (its members, ``"release"``,
    and nothing else); None: the refs. The caller resolves the label with
    :func:`aot.cache.serving.release_rule.served_release`, the rule of ``aot.load``."""
    names = sorted(set(names))
    refs = ref_map(r for name in names for r in cache.reader.refs_named(name))
    superseded = superseded_keys(peers, refs)
    if release is None:
        return superseded, served_keys(peers, refs), release_labels(cache, names)
    served = {key: "release" for key in release_slots(cache, release, names).values()}
    # What the release serves is not superseded for its replicas (and its label pins it).
    superseded = {key: by for key, by in superseded.items() if key not in served}
    return superseded, served, release_labels(cache, names)


def release_slots(cache: ArtifactStore, release: str, names: Iterable[str]) -> dict[Slot, str]:
    """``{(name, signature, environment): key}`` of ``release``'s members of ``names``.
    Raises :class:`aot.ReleaseNotFoundError` (with close labels) when the cache has no
    such label, as ``aot.load`` does."""
    import difflib

    from aot.errors import ReleaseNotFoundError

    reads = cache.reader
    labels = reads.release_labels()
    if release not in labels:
        close = difflib.get_close_matches(release, labels, n=3)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        raise ReleaseNotFoundError(
            f"no release labelled {release!r} in the cache at {cache.display_location}; {hint}"
            "`aot release ls` lists the labels (the release comes from --release, else AOT_RELEASE, "
            "else the cache's default: `aot release default`)"
        )
    out: dict[Slot, str] = {}
    for name in sorted(set(names)):
        for member in reads.release_members(release, name) or ():
            out[(member.name, member.signature, member.env_fp)] = member.key
    return out


def release_labels(cache: ArtifactStore, names: Iterable[str]) -> dict[str, list[str]]:
    """``{key: [label, ...]}``: the release labels whose current set names each key
    (of ``names``)."""
    wanted = set(names)
    out: dict[str, list[str]] = {}
    reads = cache.reader
    for label in reads.release_labels():
        for name in sorted(wanted):
            for member in reads.release_members(label, name) or ():
                if label not in out.setdefault(member.key, []):
                    out[member.key].append(label)
    return out
