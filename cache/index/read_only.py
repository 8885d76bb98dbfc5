"""How a reader that may not write opens a folder cache's SQLite index: the URI
(:func:`read_only_open`), and when an immutable open no longer fits (:func:`stale_immutable`).
Used by the standard library's reader (:mod:`aot.cache.index.reader`), the SQL index's
read-only engine and ``aot.load``'s read-ahead, which must not import either (its
reads: :func:`served_manifests`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
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
#
# Nothing here opens the database file (or its -wal/-shm) other than through SQLite:
# on POSIX, closing *any* descriptor of a file drops every fcntl lock this process
# holds on it, including those of its own SQLite connections (SQLite's "How To
# Corrupt An SQLite Database File", section 2.2). A WAL connection that lost its shared
# lock lets another process's closing connection believe it is the last one, checkpoint
# and delete the -wal and -shm under it: a corrupt index (issue 49). So the decision
# below uses os.stat alone (which side files exist), never the database header: jax-aot
# creates every index in WAL mode, and a database in rollback mode (converted by hand)
# has a -journal beside it while a writer changes it, which is watched as the -shm is.
# tests/reliability/test_index_descriptors.py fails on any new raw open in aot/, cache/
# and cli/.


@dataclass(frozen=True, slots=True)
class ReadOnlyOpen:
    """How to open a SQLite index read-only: the URI, and whether it is immutable."""

    uri: str
    immutable: bool
    reason: str
    stamp: tuple[int, int, int] | None = None  # the database file when opened immutable
    watch_shm: bool = True  # a -shm appearing means a writer: reopen through it


def read_only_file_system(path: Path) -> bool:
    """Whether ``path`` lies on a file system mounted read-only (statvfs)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows)
        return False


def read_only_open(path: Path) -> ReadOnlyOpen:
    """The URI a read-only reader of ``path`` uses now (see the comment above): decided
    from which side files exist, without opening any file."""
    path = Path(path)
    base = f"file:{quote(path.resolve().as_posix())}?mode=ro"
    wal = _side(path, "-wal")
    if read_only_file_system(path):
        return ReadOnlyOpen(base + "&immutable=1", True, "read-only file system")
    if _side(path, "-shm").exists():
        return ReadOnlyOpen(base, False, "WAL with a live -shm: read through it")
    if _side(path, "-journal").exists():
        return ReadOnlyOpen(base, False, "rollback journal beside it: shared locks only")
    if wal.exists() and wal.stat().st_size > 0:
        log.warning(
            "%s: the -wal file holds transactions no reader can see without creating a "
            "-shm file, which a read-only reader never does; until a writer opens the "
            "cache once (it folds them in), they are invisible here", path,
        )
    return ReadOnlyOpen(base + "&immutable=1", True, "no writer (no -shm): immutable", file_stamp(path))


def _side(path: Path, suffix: str) -> Path:
    """The -wal, -shm or -journal file of the database ``path`` (only ever stat'ed here)."""
    return path.with_name(path.name + suffix)


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """(mtime, size, inode) of ``path``; None if it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def stale_immutable(path: Path, opened: ReadOnlyOpen) -> bool:
    """True when an immutable open no longer fits: a writer has the database open (its
    -shm, or a rollback -journal, exists), or one came and went (it changed the file:
    its cached pages are old)."""
    if not opened.immutable or opened.stamp is None:
        return False
    path = Path(path)
    if opened.watch_shm and (_side(path, "-shm").exists() or _side(path, "-journal").exists()):
        return True
    return file_stamp(path) != opened.stamp


def served_manifests(index_file: Path, name: str, env_fp: str, *, most: int) -> list[str]:
    """The manifests of the executables an eager load of ``name`` in environment
    ``env_fp`` is expected to serve (``aot.load``'s read-ahead guess); [] when there are
    more than ``most``. Opened as the load's own reader opens it: no -wal/-shm file
    created, no lock taken."""
    connection = sqlite3.connect(read_only_open(index_file).uri, uri=True, timeout=0.5)
    try:
        rows = connection.execute(
            "SELECT key, signature, created_at FROM artifacts "
            "WHERE name = ? AND env_fp = ? AND state = 'ok' AND exe_digest IS NOT NULL",
            (name, env_fp),
        ).fetchall()
        referenced = {
            str(k) for (k,) in connection.execute(
                "SELECT key FROM refs WHERE name = ? AND env_fp = ?", (name, env_fp)
            )
        }
        keys = _served(rows, referenced)
        if not keys or len(keys) > most:
            return []
        marks = ",".join("?" * len(keys))
        return [text for (text,) in connection.execute(f"SELECT manifest FROM artifacts WHERE key IN ({marks})", keys)]
    finally:
        connection.close()


def _served(rows: Sequence[tuple[Any, ...]], referenced: set[str]) -> list[str]:
    """Per signature, the key its ref names, else the newest row's."""
    by_signature: dict[str, list[tuple[str, str]]] = {}
    for key, signature, created_at in rows:
        by_signature.setdefault(str(signature), []).append((str(created_at), str(key)))
    keys = []
    for candidates in by_signature.values():
        named = [key for _, key in candidates if key in referenced]
        keys.append(named[0] if len(named) == 1 else max(candidates)[1])
    return sorted(keys)
