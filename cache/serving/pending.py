"""Index rows filed when their signature is first needed, not at start-up.

Filing a row (:class:`~aot.cache.serving.programs.ProgramTable`) parses its manifest
and cross-checks it against its fingerprints: most of a millisecond per row, so a
name stored at 1,000 signatures spent most of a lazy start-up filing rows that no call
had asked for. A row whose index columns say which call it serves (its signature
column names common dtypes at integer dimensions: no statics, no symbolic dimension)
is held here instead, grouped by the leaf keys a call of it has, and filed (with every
check filing makes today) when:

* a call of those leaf keys arrives (the first call of a lazy signature);
* its signature is loaded (eager start-up, a background load);
* anything needs every program: a call no filed program serves (before it is called a
  miss, so padding, symbolic shapes, keyword calls and the miss's wording see every
  row), the start-up check that something is servable (one group at a time, until one
  is), listing the signatures, a release check, a start-up error.

The column only says *when* a row is filed, never *how* it is served: a row is served
under the signature its checked manifest gives, and a row whose column lies is found
by the miss that files every row. A manifest problem is therefore still found before
the row's executable is run (filing, then the loader's own checks).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from aot.dtype_names import SHORT_DTYPES

if TYPE_CHECKING:
    from aot.artifact import Manifest
    from aot.cache.index.entry import IndexEntry

__all__ = ["CheckedManifests", "PendingRows", "leaf_keys_of"]

#: (shape, dtype, weak_type) of one input, as a call's leaves give it.
Keys = tuple[tuple[tuple[int, ...], Any, bool], ...]

_LONG = {short: long for long, short in SHORT_DTYPES.items() if long != "pred"}


@lru_cache(maxsize=None)
def _dtype(short: str) -> Any:
    from aot.artifact import parse_manifest_dtype  # the loader's own parse of a dtype

    return parse_manifest_dtype(_LONG[short])


def leaf_keys_of(signature: str) -> Keys | None:
    """The leaf keys of a call that a flat signature column (``"f32[8,784], ~f32[]"``)
    describes; None when the column does not say (no arguments, statics, a symbolic
    dimension, a dtype outside the common ones): such a row is filed at start-up."""
    if not signature:
        return None
    keys = []
    for part in signature.split(", "):
        weak = part.startswith("~")
        head, bracket, rest = (part[1:] if weak else part).partition("[")
        if head not in _LONG or not bracket or not rest.endswith("]"):
            return None
        dims = rest[:-1]
        if dims and not all(d.isascii() and d.isdigit() for d in dims.split(",")):
            return None
        keys.append((tuple(int(d) for d in dims.split(",")) if dims else (), _dtype(head), weak))
    return tuple(keys)


class PendingRows:
    """Rows not filed yet, by the leaf keys their signature column names, in filing
    order. Each group is filed once, by whichever thread asks first; the others wait
    for it and get the same programs."""

    def __init__(self, file_row: Callable[[IndexEntry], Any]) -> None:
        self._file_row = file_row  # files one row; returns its program, or None
        self._groups: dict[Keys, list[IndexEntry]] = {}
        self._filed: dict[Keys, list[Any]] = {}
        self._lock = threading.RLock()
        self.held = False  # whether any row was ever held (a miss must then file them)

    def __len__(self) -> int:
        return len(self._groups)

    def hold(self, keys: Keys, entry: IndexEntry) -> None:
        self._groups.setdefault(keys, []).append(entry)
        self.held = True

    def keys(self) -> list[Keys]:
        """The groups not filed yet."""
        with self._lock:
            return list(self._groups)

    def file(self, keys: Keys) -> list[Any]:
        """Files the group of ``keys`` unless it was; the programs its rows were filed
        under (empty: no such group, or none of its rows could be filed)."""
        with self._lock:
            rows = self._groups.pop(keys, None)
            if rows is not None:
                programs: list[Any] = []
                for row in rows:
                    program = self._file_row(row)
                    if program is not None and all(program is not p for p in programs):
                        programs.append(program)
                self._filed[keys] = programs
            return self._filed.get(keys, [])

    def file_next(self) -> list[Any] | None:
        """Files the first group left: its programs, or None when none is left."""
        with self._lock:
            if not self._groups:
                return None
            return self.file(next(iter(self._groups)))

    def file_all(self) -> None:
        """Files every group left (waits for a group another thread is filing)."""
        with self._lock:
            for keys in list(self._groups):
                self.file(keys)


class CheckedManifests:
    """Manifests that filing parsed and found consistent with their fingerprints, kept
    for the load that usually follows at once (an eager or background load, a first
    call), so that the loader neither parses nor cross-checks the same text again.

    A manifest is handed out once, and only for the very row object it was parsed from
    (a row read again is parsed again). At most :attr:`LIMIT` are kept (the oldest are
    dropped): filing every row to list the signatures must not keep 1,000 parsed
    manifests alive."""

    LIMIT = 64

    def __init__(self) -> None:
        self._items: dict[str, tuple[str, Manifest]] = {}
        self._lock = threading.Lock()

    def keep(self, entry: IndexEntry, manifest: Manifest) -> None:
        with self._lock:
            self._items[entry.key] = (entry.manifest, manifest)
            while len(self._items) > self.LIMIT:
                del self._items[next(iter(self._items))]

    def take(self, entry: IndexEntry) -> Manifest | None:
        """The manifest kept for ``entry`` (None: parse it)."""
        with self._lock:
            item = self._items.pop(entry.key, None)
        return item[1] if item is not None and item[0] is entry.manifest else None
