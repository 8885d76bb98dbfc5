"""Explain a miss: the nearest stored entry and which fingerprint parts differ."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax

from aot.artifact import Manifest
from aot.errors import AotError
from aot.fingerprint import PartDifference, xla_flags_outside_key
from aot.lowering import lower
from aot.specs import format_aval, spec

if TYPE_CHECKING:
    from aot.cache.cache import Cache


@dataclass(frozen=True, slots=True)
class Explanation:
    name: str
    signature: str
    hit: bool
    nearest_key: str | None
    nearest_signature: str | None
    differences: tuple[PartDifference, ...]
    stored: int
    # XLA flags set here that are not part of any key (they cannot change the code).
    xla_flags_outside_key: str = ""

    def describe(self) -> str:
        if self.stored == 0:
            return f"{self.name}: nothing is stored under this name; compile it first"
        if self.hit:
            return f"{self.name} ({self.signature}): hit, key {self.nearest_key[:12]}"  # type: ignore[index]
        lines = [
            f"{self.name} ({self.signature}): miss; nearest of {self.stored} stored entries is "
            f"{self.nearest_key[:12]} ({self.nearest_signature})"  # type: ignore[index]
        ]
        lines += [f"  {d.describe()}" for d in self.differences]
        if self.xla_flags_outside_key:
            lines.append(
                f"  (not compared: XLA flags {self.xla_flags_outside_key}, which cannot change "
                "the executable)"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "signature": self.signature,
            "hit": self.hit,
            "nearest_key": self.nearest_key,
            "nearest_signature": self.nearest_signature,
            "differences": [d.to_dict() for d in self.differences],
            "stored": self.stored,
            "xla_flags_outside_key": self.xla_flags_outside_key,
        }


def explain(
    cache: Cache, name: str, *args: Any, fn: Callable[..., Any] | None = None, **lower_kwargs: Any
) -> Explanation:
    """Compares the request with every entry of ``name``: all program parts when ``fn``
    is given (it is lowered), else the input signature; always the environment."""
    environment = cache.environment
    if fn is not None:
        computation = lower(fn, *args, name=name, **lower_kwargs)
        program_parts = computation.program_fingerprint.as_dict()
        signature = computation.signature
    else:
        leaves = jax.tree_util.tree_leaves(spec(args))
        signature = ", ".join(format_aval(leaf.shape, leaf.dtype, leaf.weak_type) for leaf in leaves)
        program_parts = {"in_avals": signature}
    best: tuple[int, Manifest, tuple[PartDifference, ...]] | None = None
    entries = [e for e in cache.index.by_name(name, state=None)]
    for entry in entries:
        try:
            manifest = Manifest.from_json(entry.manifest)
        except AotError:
            continue
        stored_parts = manifest.program.as_dict()
        diffs = tuple(
            PartDifference(part, stored_parts.get(part), value)
            for part, value in sorted(program_parts.items())
            if stored_parts.get(part) != value
        ) + manifest.environment.diff(environment)
        if not entry.ok:
            diffs += (PartDifference("state", "ok", entry.state),)
        if best is None or len(diffs) < len(best[2]):
            best = (len(diffs), manifest, diffs)
    outside = xla_flags_outside_key()
    if best is None:
        return Explanation(name, signature, False, None, None, (), len(entries), outside)
    _, manifest, diffs = best
    return Explanation(
        name, signature, not diffs, manifest.key, manifest.signature, diffs, len(entries), outside
    )
