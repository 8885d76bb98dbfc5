"""How a reader that may not write opens a folder cache's SQLite index: the URI
(:func:`read_only_open`), and when an immutable open no longer fits (:func:`stale_immutable`).
Used by the standard library's reader (:mod:`aot.cache.index.reader`), the SQL index's
read-only engine and ``aot.load``'s read-ahead, which must not import either.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- read-only opens
#
# A reader that may not write must never need to create the -wal/-shm files of a WAL
# database, nor take a write lock. SQLite opens a WAL database with ``mode=ro`` only
# when its -shm file exists (a connection has the database open: the writer's -shm
# and -wal are then read, never written) or when the folder lets it create one. A
# serving user that cannot write the CI user's folder meets neither once the last
# writer has closed (SQLite deletes -wal and -shm then); but then the database file is
# complete and nobody writes it, and SQLite's ``immutable=1`` reads it without any
# lock or side file. Should a writer appear later, it creates the -shm before it
# changes a single page of the database file (it writes to the -wal first), so every
# statement checks whether the -shm has appeared and reopens the normal way if so.
# docs/reliability.md ("Serving read-only") has the cases and the test.


@dataclass(frozen=True, slots=True)
class ReadOnlyOpen:
    """How to open a SQLite index read-only: the URI, and whether it is immutable."""

    uri: str
    immutable: bool
    reason: str
    stamp: tuple[int, int, int] | None = None  # the database file when opened immutable
    watch_shm: bool = True  # a -shm appearing means a writer: reopen through it


def _wal_mode(path: Path) -> bool:
    """True when the database header says WAL (file format versions 2 at bytes 18-19)."""
    try:
        with open(path, "rb") as f:
            header = f.read(20)
    except OSError:
        return False
    return len(header) == 20 and header[18] == 2 and header[19] == 2


def _read_only_file_system(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows)
        return False


def read_only_open(path: Path) -> ReadOnlyOpen:
    """The URI a read-only reader of ``path`` uses now (see the comment above)."""
    path = Path(path)
    base = f"file:{quote(path.resolve().as_posix())}?mode=ro"
    shm = path.with_name(path.name + "-shm")
    wal = path.with_name(path.name + "-wal")
    if _read_only_file_system(path):
        return ReadOnlyOpen(base + "&immutable=1", True, "read-only file system")
    if not _wal_mode(path):
        return ReadOnlyOpen(base, False, "rollback journal: shared locks only")
    if shm.exists():
        return ReadOnlyOpen(base, False, "WAL with a live -shm: read through it")
    if wal.exists() and wal.stat().st_size > 0:
        log.warning(
            "%s: the -wal file holds transactions no reader can see without creating a "
            "-shm file, which a read-only reader never does; until a writer opens the "
            "cache once (it folds them in), they are invisible here", path,
        )
    return ReadOnlyOpen(base + "&immutable=1", True, "WAL, no writer: immutable", file_stamp(path))


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """(mtime, size, inode) of ``path``; None if it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def stale_immutable(path: Path, opened: ReadOnlyOpen) -> bool:
    """True when an immutable open no longer fits: a writer has the database open (its
    -shm exists), or one came and went (it changed the file: its cached pages are old)."""
    if not opened.immutable or opened.stamp is None:
        return False
    path = Path(path)
    if opened.watch_shm and path.with_name(path.name + "-shm").exists():
        return True
    return file_stamp(path) != opened.stamp
