"""Which items of a manifest a cache holds no intact entry for, each in the
environment it is compiled for: its device target's (``tpu:v5e:1x1``, computed without
the device through libtpu's topology API, as a warm-up computes it) or this host's.

Signatures are computed from the items' specs, without lowering. Why each one is
missing is worded by :mod:`aot.cache.reports.coverage` (``aot verify --manifest``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aot.device import accelerator_runtime
from aot.environment import ENVIRONMENT_KIND
from aot.errors import AotError, CacheError, ManifestError
from aot.fingerprint import UNKNOWN_ENVIRONMENT_NOTE, Fingerprint, known_environment
from aot.jaxcompat.runtime import backend_started
from aot.cache.warmup.manifest import WarmupItem
from aot.cache.warmup.functions import item_environment, item_signature, x64_mode

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore
    from aot.cache.index.entry import IndexEntry

__all__ = ["Uncovered", "find_uncovered", "target_environments"]


@dataclass(frozen=True, slots=True)
class Uncovered:
    """An item with no intact entry for its environment, and what was looked at."""

    item: WarmupItem
    signature: str  # the item's input signature
    entries: tuple[IndexEntry, ...]  # every entry of the item's name, any state
    env: str  # the digest of the environment it is compiled for, in the item's x64 mode
    #: That environment when the item has a device target (None: this host's).
    environment: Fingerprint | None = None


def target_environments(cache: ArtifactStore) -> Callable[[WarmupItem], Fingerprint]:
    """A function giving a device-target item's environment (in its x64 mode), computed
    once per (target, x64): each costs a libtpu topology, never this host's device."""
    computed: dict[tuple[str | None, bool], Fingerprint] = {}

    def environment(item: WarmupItem) -> Fingerprint:
        slot = (item.device_target, item.x64)
        if slot not in computed:
            with x64_mode(item):
                computed[slot] = item_environment(cache, item)
        return computed[slot]

    return environment


def find_uncovered(cache: ArtifactStore, items: Iterable[WarmupItem]) -> list[Uncovered]:
    """The ``items`` with no intact entry (same name and signature) for the environment
    each is compiled for (:attr:`WarmupItem.device_target`'s, else this host's), in
    manifest order. This host's environment is looked at only when an item has no
    target, so a CPU runner checking TPU targets never opens a device. Raises
    :class:`aot.ManifestError` naming the item whose specs cannot be resolved, and
    :class:`aot.DeviceTargetError` when a target cannot be compiled for here (no libtpu)."""
    by_name: dict[str, tuple[IndexEntry, ...]] = {}
    missing = []
    target_environment = target_environments(cache)
    host: list[Fingerprint | None] = []  # [the record, or None: compute it], once a host item needs it

    def host_env(item: WarmupItem) -> str:
        if not host:
            recorded = None if backend_started() else known_environment(lambda: cache.environment)
            if recorded is None and not backend_started() and accelerator_runtime() is not None:
                raise CacheError(f"cannot tell which items this host's cache covers: {UNKNOWN_ENVIRONMENT_NOTE}")
            host.append(recorded)
        recorded = host[0]
        if recorded is not None:  # without opening the device: the record, in the item's x64 mode
            x64 = "true" if item.x64 else recorded.as_dict().get("x64", "false")
            return Fingerprint.of(ENVIRONMENT_KIND, {**recorded.as_dict(), "x64": x64}).digest
        with x64_mode(item):
            return cache.environment.digest

    for item in items:
        if item.name not in by_name:
            by_name[item.name] = tuple(cache.index.by_name(item.name, state=None))
        environment = target_environment(item) if item.device_target is not None else None
        env = environment.digest if environment is not None else host_env(item)
        try:
            signature = item_signature(item)
        except AotError as exc:
            raise ManifestError(f"{item.source or item.name}: {item.label}: {exc}") from None
        entries = by_name[item.name]
        if any(e.ok and e.env_fp == env and e.signature == signature for e in entries):
            continue
        missing.append(Uncovered(item, signature, entries, env, environment))
    return missing
