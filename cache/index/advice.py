"""What a database error or URL looks like in a message: the reason, the advice a
user can act on, a URL with its password masked."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine.url import URL

__all__ = [
    "DAMAGED_INDEX_ADVICE", "advice_for", "damaged_index_message", "mask_url", "on_read_only_file_system",
    "reason_of",
]

#: What to do about a corrupt or truncated SQLite index (``aot repair``: issue 49).
DAMAGED_INDEX_ADVICE = (
    "the index file is damaged (corrupt or truncated). Run `aot repair`: it rebuilds the "
    "index from every row it can still read and the blob store, says what it could not "
    "recover, and moves the damaged file aside (`aot repair --dry-run` shows the plan "
    "first); or restore index.sqlite from a backup. Entries it cannot recover: `aot bundle "
    "import` a bundle of them, or `aot warmup` again"
)


def damaged_index_message(path: object, reason: str) -> str:
    """The message for a folder cache's index that SQLite cannot read: what is wrong
    with it (truncated, corrupt: :func:`aot.cache.index.salvage.damage_of`) and what to do."""
    from pathlib import Path

    from aot.cache.index.salvage import damage_of

    damage = damage_of(Path(str(path))) or f"corrupt ({reason})"
    return f"the cache index {path} is {damage}; {DAMAGED_INDEX_ADVICE}"


def mask_url(url: str | URL) -> str:
    """``url`` with any password replaced by ``***`` (for messages and logs)."""
    # Here, not at the top: the standard library's reader words its errors with this
    # module's advice, on paths that never import SQLAlchemy.
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL has no password we can find
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", str(url))


def reason_of(e: BaseException) -> str:
    """The first line of a database error's own message (the driver's, when wrapped)."""
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def advice_for(reason: str, read_only: bool = False, database: str | None = None) -> str:
    """What to do about the database errors a user can fix (``database``: a SQLite
    index's file, whose file system is looked at when it cannot be written)."""
    text = reason.lower()
    if "malformed" in text or "not a database" in text or "database corrupt" in text:
        return "; " + DAMAGED_INDEX_ADVICE
    if "disk is full" in text or "no space left" in text or "quota" in text:
        return "; free disk space (e.g. `aot gc --max-size ...`) or move the cache (AOT_CACHE)"
    if "statement timeout" in text:
        return (
            "; the database did not finish the statement within AOT_DB_STATEMENT_TIMEOUT "
            "(seconds, default 30): check the database server's load and locks, or raise "
            "the bound (or set statement_timeout in the URL's options)"
        )
    if "timeout expired" in text:
        return (
            "; the database did not answer within AOT_DB_CONNECT_TIMEOUT (seconds, default 5): "
            "check that the server is up and reachable, or raise the bound (or set "
            "connect_timeout in the URL)"
        )
    readonly = "readonly database" in text or "read-only" in text
    if read_only and (readonly or "unable to open database file" in text):
        # Opened read-only already: never advise the option that is set.
        return (
            "; the index cannot be read here: check that this user may read the cache "
            "folder and index.sqlite (and, while a writer has it open, index.sqlite-wal "
            "and index.sqlite-shm)"
        )
    if (readonly or "unable to open database file" in text) and on_read_only_file_system(database):
        return (
            "; the cache folder is on a read-only file system (a read-only mount): nothing can be "
            "written there, whatever the permissions. Serve it read-only (read_only=True, "
            "`aot --read-only`), or warm up into a cache on a writable file system and ship that"
        )
    if readonly or "unable to open database file" in text:
        return (
            "; the index cannot be written here: fix the permissions of the cache folder, "
            "or serve it read-only (read_only=True, `aot --read-only`), which needs read "
            "access only"
        )
    return ""


def on_read_only_file_system(path: str | None) -> bool:
    """Whether ``path`` (or, when it does not exist yet, the nearest folder above it) is
    on a file system mounted read-only (``statvfs``'s ST_RDONLY: EROFS for every write)."""
    if not path or path == ":memory:":
        return False
    import os
    from pathlib import Path

    for candidate in (Path(path), *Path(path).parents):
        try:
            return bool(os.statvfs(candidate).f_flag & os.ST_RDONLY)
        except FileNotFoundError:
            continue
        except (OSError, AttributeError):  # no statvfs (Windows), or unreadable: unknown
            return False
    return False
