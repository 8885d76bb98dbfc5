"""Splitting a warm-up across CI runners: ``aot warmup MANIFEST --shard I/N``.

Every runner of a CI matrix computes the same plan on its own and compiles its share
into one shared cache; ``aot verify --manifest MANIFEST --strict`` then proves that
the shards covered the manifest.

The plan: each item gets a cost (below); items are taken from the most to the least
costly (ties in manifest order) and each goes to the shard with the least total cost
so far (ties to the lowest shard): the "longest processing time first" rule, so shards
take similar times. Every item lands in exactly one shard, whatever N; a shard may be
empty when N exceeds the number of items. Shards are numbered from 1.

The cost of an item, in estimated seconds of compile time:

1. the ``compile_seconds`` stored for the same name and input signature by *another*
   environment (a previous run: the last jaxlib, another host kind), the oldest such
   entry when there are several;
2. else a static estimate from the input sizes: ``1 s + 1 s per 64 MiB`` of inputs
   (``STATIC_BASE_SECONDS``, ``STATIC_BYTES_PER_SECOND``); also when the item's
   inputs cannot be resolved (the run then reports the item's error).

Entries of *this* environment never count: the shards of one run write exactly those
while others are still planning, and every runner must compute the same plan. For the
same reason the oldest entry is used (a newer one written meanwhile by another
pipeline does not change it). Costs shape the balance only; the partition is exact
whatever they are.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.errors import AotError
from aot.cache.warmup.manifest import WarmupItem

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore

__all__ = [
    "STATIC_BASE_SECONDS",
    "STATIC_BYTES_PER_SECOND",
    "ItemCost",
    "estimate_costs",
    "parse_shard",
    "plan_shards",
    "select_shard",
]

log = logging.getLogger(__name__)

STATIC_BASE_SECONDS = 1.0
STATIC_BYTES_PER_SECOND = float(64 * 2**20)
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(text: str | tuple[int, int]) -> tuple[int, int]:
    """``"2/3"`` (or ``(2, 3)``) -> ``(2, 3)``; shards are numbered 1..N."""
    if isinstance(text, tuple):
        index, count = text
    else:
        match = _SHARD.match(text)
        if match is None:
            raise ValueError(f"shard {text!r} is not I/N (e.g. 1/3: the first of three)")
        index, count = int(match.group(1)), int(match.group(2))
    if not (isinstance(index, int) and isinstance(count, int)) or count < 1 or not 1 <= index <= count:
        raise ValueError(f"shard {index}/{count}: expected 1 <= I <= N, e.g. 1/3 .. 3/3")
    return index, count


@dataclass(frozen=True, slots=True)
class ItemCost:
    """The estimated compile time of one item, and where the estimate comes from."""

    seconds: float
    source: str  # "stored" (another environment's compile_seconds) or "static"

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 4), "source": self.source}


def _inputs(item: WarmupItem) -> tuple[str, int]:
    """The item's input signature and the bytes of its inputs (resolves ``@`` specs)."""
    import jax
    import numpy as np

    from aot.cache.warmup.functions import make_mesh, resolve_args
    from aot.specs import format_aval

    mesh = make_mesh(item.mesh, item.device_target) if item.mesh is not None else None
    args, kwargs = resolve_args(item.args, item.kwargs, item.args_from, base_dir=item.base_dir, mesh=mesh)
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    signature = ", ".join(
        format_aval(leaf.shape, leaf.dtype, getattr(leaf, "weak_type", False)) for leaf in leaves
    )
    # dtype.itemsize: typed keys (key<fry>) have one too, and no numpy dtype.
    size = sum(int(np.prod(leaf.shape, dtype=np.int64)) * leaf.dtype.itemsize for leaf in leaves)
    return signature, size


def estimate_costs(cache: ArtifactStore | None, items: Sequence[WarmupItem]) -> list[ItemCost]:
    """The cost of each item by the rule in the module docstring (``cache`` may be None)."""
    from aot.cache.warmup.functions import item_environment

    envs: dict[str | None, str] = {}  # device target (None: this host) -> environment digest
    previous: dict[tuple[str, str | None], dict[str, float]] = {}  # (name, target) -> signature -> seconds
    costs: list[ItemCost] = []
    for item in items:
        try:
            signature, size = _inputs(item)
        except (AotError, Exception):  # noqa: BLE001 - the run reports it with the item
            log.debug("warmup shard: cannot resolve %s; static cost", item.label, exc_info=True)
            costs.append(ItemCost(STATIC_BASE_SECONDS, "static"))
            continue
        slot = (item.name, item.device_target)
        if cache is not None and slot not in previous:
            if item.device_target not in envs:
                envs[item.device_target] = item_environment(cache, item).digest
            env = envs[item.device_target]
            stored: dict[str, float] = {}
            for entry in cache.index.by_name(item.name, state=None):  # oldest first
                if entry.env_fp != env and entry.compile_seconds and entry.compile_seconds > 0:
                    stored.setdefault(entry.signature, float(entry.compile_seconds))
            previous[slot] = stored
        seconds = previous.get(slot, {}).get(signature)
        if seconds is not None:
            costs.append(ItemCost(seconds, "stored"))
        else:
            costs.append(ItemCost(STATIC_BASE_SECONDS + size / STATIC_BYTES_PER_SECOND, "static"))
    return costs


def plan_shards(costs: Sequence[float], count: int) -> list[list[int]]:
    """Item indices of each of ``count`` shards (longest first to the least loaded)."""
    if count < 1:
        raise ValueError(f"shard count must be >= 1, got {count}")
    loads = [0.0] * count
    shards: list[list[int]] = [[] for _ in range(count)]
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        target = min(range(count), key=lambda s: (loads[s], s))
        shards[target].append(index)
        loads[target] += costs[index]
    return [sorted(s) for s in shards]


def select_shard(
    items: Sequence[WarmupItem], shard: tuple[int, int] | str, cache: ArtifactStore | None = None
) -> list[tuple[int, WarmupItem]]:
    """This shard's ``(manifest index, item)`` pairs, in manifest order."""
    index, count = parse_shard(shard)
    costs = estimate_costs(cache, items)
    chosen = plan_shards([c.seconds for c in costs], count)[index - 1]
    log.info(
        "warmup shard %d/%d: %d of %d entries, estimated %.1fs of %.1fs", index, count,
        len(chosen), len(items), sum(costs[i].seconds for i in chosen),
        sum(c.seconds for c in costs),
    )
    return [(i, items[i]) for i in chosen]
