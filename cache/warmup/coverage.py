"""Which items of a manifest a cache holds no intact entry for, in this environment.

Signatures are computed from the items' specs, without lowering. Why each one is
missing is worded by :mod:`aot.cache.reports.coverage` (``aot verify --manifest``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aot.device import accelerator_runtime
from aot.environment import ENVIRONMENT_KIND
from aot.errors import AotError, CacheError, ManifestError
from aot.fingerprint import UNKNOWN_ENVIRONMENT_NOTE, Fingerprint, known_environment
from aot.jaxcompat.runtime import backend_started
from aot.cache.warmup.manifest import WarmupItem
from aot.cache.warmup.functions import item_signature, x64_mode

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore
    from aot.cache.index.entry import IndexEntry

__all__ = ["Uncovered", "find_uncovered"]


@dataclass(frozen=True, slots=True)
class Uncovered:
    """An item with no intact entry for this environment, and what was looked at."""

    item: WarmupItem
    signature: str  # the item's input signature
    entries: tuple[IndexEntry, ...]  # every entry of the item's name, any state
    env: str  # this environment's digest, in the item's x64 mode


def find_uncovered(cache: ArtifactStore, items: Iterable[WarmupItem]) -> list[Uncovered]:
    """The ``items`` with no intact entry (same name and signature) for this
    environment, in manifest order. Raises :class:`aot.ManifestError` naming the item
    whose specs cannot be resolved."""
    by_name: dict[str, tuple[IndexEntry, ...]] = {}
    missing = []
    recorded = None if backend_started() else known_environment(lambda: cache.environment)
    if recorded is None and not backend_started() and accelerator_runtime() is not None:
        raise CacheError(f"cannot tell which items this host's cache covers: {UNKNOWN_ENVIRONMENT_NOTE}")
    for item in items:
        if item.name not in by_name:
            by_name[item.name] = tuple(cache.index.by_name(item.name, state=None))
        if recorded is not None:  # without opening the device: the record, in the item's x64 mode
            x64 = "true" if item.x64 else recorded.as_dict().get("x64", "false")
            env = Fingerprint.of(ENVIRONMENT_KIND, {**recorded.as_dict(), "x64": x64}).digest
        else:
            with x64_mode(item):
                env = cache.environment.digest
        try:
            signature = item_signature(item)
        except AotError as exc:
            raise ManifestError(f"{item.source or item.name}: {item.label}: {exc}") from None
        entries = by_name[item.name]
        if any(e.ok and e.env_fp == env and e.signature == signature for e in entries):
            continue
        missing.append(Uncovered(item, signature, entries, env))
    return missing
