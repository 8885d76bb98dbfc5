"""Where a cache or its blobs live, and opening the object store a location names.

A location is a local folder (a path or ``file://`` URL), a database (a SQLAlchemy URL
of a supported dialect) or an object store (an fsspec URL: ``s3://``, ``gs://``,
``az://``, ``memory://``). :func:`classify_location` tells them apart by scheme;
:func:`open_object_store` opens the matching
:class:`~aot.cache.storage.objectstore.ObjectStore`. Each backend is imported only
when a location needs it: a folder cache never imports SQLAlchemy or fsspec here.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from aot.cache.storage.objectstore import ObjectStore
from aot.cache.timeouts import Timeouts
from aot.errors import CacheError

__all__ = [
    "DATABASE",
    "DATABASE_BACKENDS",
    "FOLDER",
    "OBJECT",
    "OBJECT_SCHEMES",
    "Location",
    "classify_location",
    "is_url",
    "same_database",
    "open_object_store",
]

#: Object-store URL schemes -> the pip extra that installs their fsspec driver.
OBJECT_SCHEMES: dict[str, str] = {
    "s3": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "az": "azure",
    "abfs": "azure",
    "memory": "fsspec",
}

#: SQLAlchemy backends the index and the SQL blob store support.
DATABASE_BACKENDS = ("sqlite", "postgresql")

_SCHEME_PATTERN = r"^([A-Za-z][A-Za-z0-9+.\-]*)://"

FOLDER, DATABASE, OBJECT = "folder", "database", "object"


@dataclass(frozen=True, slots=True)
class Location:
    """Where a cache or its blobs live: a local ``folder`` (a path), a ``database``
    (a SQLAlchemy URL) or an ``object`` store (an fsspec URL)."""

    kind: str
    target: str  # the folder path, or the URL as given
    scheme: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {"kind": self.kind, "target": self.target, "scheme": self.scheme}


def _unknown_scheme(location: str, scheme: str) -> CacheError:
    return CacheError(
        f"unknown location scheme {scheme + '://'!r} in {_shown(location)!r}: expected a folder "
        f"path, file://PATH, s3://, gs://, az://, memory:// (blobs only) or a database URL "
        f"(sqlite:///PATH, postgresql+psycopg://USER@HOST/DB)"
    )


def _shown(location: str) -> str:
    """``location`` without a password, for messages."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", location)


def is_url(value: str | os.PathLike[str]) -> bool:
    """Whether ``value`` is written as a URL (``scheme://...``), known scheme or not;
    :func:`classify_location` says which kind (and refuses an unknown scheme)."""
    return isinstance(value, str) and re.match(_SCHEME_PATTERN, value) is not None


def classify_location(location: str | os.PathLike[str]) -> Location:
    """Which kind of store ``location`` names, by its scheme. An unknown scheme is
    refused (:class:`CacheError`), never taken for a local path; a database URL is
    recognised by its SQLAlchemy dialect, not by ``"://"``."""
    text = os.fspath(location)
    match = re.match(_SCHEME_PATTERN, text) if "://" in text else None  # a path: no regex
    if match is None:
        if text.startswith("sqlite:"):  # sqlite:relative.db is not a folder either
            raise CacheError(f"malformed SQLite URL {text!r}: expected sqlite:///PATH")
        return Location(FOLDER, str(Path(text).expanduser()))
    scheme = match.group(1).lower()
    if scheme == "file":
        rest = text[match.end():]
        if rest.startswith("localhost/"):
            rest = rest[len("localhost"):]
        if not rest.startswith("/"):
            raise CacheError(f"file URL {text!r} must name an absolute path: file:///PATH")
        return Location(FOLDER, unquote(rest), "file")
    if scheme in OBJECT_SCHEMES:
        return Location(OBJECT, text, scheme)
    # Only now pay for SQLAlchemy (a folder cache's serving path never gets here).
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        backend = make_url(text).get_backend_name()
    except (ArgumentError, ValueError):
        raise _unknown_scheme(text, scheme) from None
    if backend in DATABASE_BACKENDS:
        return Location(DATABASE, text, scheme)
    raise _unknown_scheme(text, scheme)


def same_database(a: str, b: str) -> bool:
    """Whether two locations are the same database (URLs equal but for the password)."""
    if classify_location(a).kind != DATABASE or classify_location(b).kind != DATABASE:
        return False
    from sqlalchemy.engine import make_url

    return make_url(a).set(password=None) == make_url(b).set(password=None)


def open_object_store(
    location: str | os.PathLike[str], *, read_only: bool = False, engine: Any = None,
    timeouts: Timeouts | None = None,
) -> ObjectStore:
    """The :class:`ObjectStore` for ``location``, picked by its scheme.

    A folder path or ``file://`` URL -> :class:`~aot.cache.storage.folder.FolderObjectStore`;
    a database URL -> :class:`~aot.cache.storage.database.SqlObjectStore` (on ``engine`` when
    given: the index's own, so that gc's deletions join the index's lock);
    ``s3://``, ``gs://``, ``az://``, ``memory://`` -> the fsspec store
    (``pip install jax-aot[s3]`` etc.); anything else is refused. ``timeouts`` bound
    the waits of a database or S3 store (None: the environment's,
    :mod:`aot.cache.timeouts`).
    """
    where = classify_location(location)
    if where.kind == FOLDER:
        from aot.cache.storage.folder import FolderObjectStore

        return FolderObjectStore(where.target, read_only=read_only)
    if where.kind == DATABASE:
        from aot.cache.storage.database import SqlObjectStore

        if engine is not None:
            return SqlObjectStore(engine, read_only=read_only)
        return SqlObjectStore.open(where.target, read_only=read_only, timeouts=timeouts)
    extra = OBJECT_SCHEMES[where.scheme or ""]
    hint = f"pip install 'jax-aot[{extra}]'"
    try:
        module = importlib.import_module("aot.cache.storage.fsspec_store")
        return module.FsspecObjectStore(where.target, read_only=read_only, timeouts=timeouts)  # type: ignore[no-any-return]
    except ImportError as exc:  # the module, fsspec, or the scheme's driver (s3fs, ...)
        missing = getattr(exc, "name", None) or str(exc)
        raise CacheError(
            f"blobs at {_shown(where.target)} need an object-store driver that is not "
            f"installed ({missing}); install it with: {hint}"
        ) from exc
