"""What :meth:`Cache.compile_entry <aot.cache.cache.Cache.compile_entry>` did.

Apart from :mod:`aot.cache.cache` (which still exports the name) because only a
process that compiles needs it: serving never does, and a frozen dataclass costs
every process that defines it ~0.5 ms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aot.executable import MeshExecutable
    from aot.cache.index.entry import IndexEntry


@dataclass(frozen=True, slots=True)
class CompileResult:
    """What :meth:`Cache.compile_entry` did: the executable, its entry, hit or miss.

    ``executable`` is None for a symbolic (shape-polymorphic) program: it is stored
    as portable HLO and compiled per concrete shape by ``aot.load``.
    """

    executable: MeshExecutable | None
    entry: IndexEntry
    hit: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.entry.key,
            "name": self.entry.name,
            "signature": self.entry.signature,
            "hit": self.hit,
            "seconds": round(self.seconds, 4),
            "compile_seconds": self.entry.compile_seconds,
            "raw_size": self.entry.raw_size,
            "stored_size": self.entry.stored_size,
        }
