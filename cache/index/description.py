"""Which blob location a shared cache uses: the one its index recorded when created.

A SQL index records (``cache_meta``, :class:`~aot.cache.index.releases.CacheDescription`)
where its blobs live, how they are compressed and the artifact format, so that a
client that forgets ``--blobs`` cannot misread it:

* no blob location given: the recorded one is used;
* the same location given: fine;
* another location given: refused (:class:`~aot.errors.BlobLocationError`, naming
  both) unless the client says it is a mirror (``blob_mirror=True``,
  ``--blobs-mirror``, ``AOT_BLOBS_MIRROR=1``).

A recorded ``None`` means "the cache's own store": the index's database. A database
URL is recorded without its password. A cache written before ``cache_meta`` gets its
description at the first writable, non-mirror open whose blob store holds the blobs
of the entries it checks (never guessed: a client that forgot ``--blobs`` finds none
and records nothing).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aot.artifact import FORMAT_VERSION, READABLE_FORMAT_VERSIONS
from aot.errors import BlobLocationError
from aot.cache.index.releases import CacheDescription
from aot.cache.storage.locations import DATABASE, FOLDER, classify_location, same_database

if TYPE_CHECKING:
    from aot.cache.index.sql import Index
    from aot.cache.storage.content import ContentStore

log = logging.getLogger(__name__)

__all__ = ["COMPRESSION", "EVIDENCE_ENTRIES", "blob_identity", "check_description", "choose_blob_location",
           "record_description", "shown_blobs"]

#: How every ContentStore compresses (one zstd frame per blob).
COMPRESSION = "zstd"
#: Entries whose executable blob is looked up before describing an existing cache.
EVIDENCE_ENTRIES = 8


def blob_identity(location: str | None, cache_location: str) -> str | None:
    """``location`` as recorded and compared: None for the cache's own store (its
    database), an absolute path for a folder, a database URL without its password,
    an object-store URL without a trailing slash."""
    if location is None or same_database(location, cache_location):
        return None
    where = classify_location(location)
    if where.kind == FOLDER:
        return str(Path(where.target).expanduser().resolve())
    if where.kind == DATABASE:
        from sqlalchemy.engine import make_url

        return make_url(location).set(password=None).render_as_string(hide_password=False)
    return location.rstrip("/")


def shown_blobs(identity: str | None) -> str:
    """A recorded location for messages."""
    return identity if identity is not None else "the index's own database"


def check_description(found: CacheDescription, cache_location: str) -> None:
    """Refuses a cache whose compression or format this jax-aot cannot read."""
    if found.compression != COMPRESSION:
        raise BlobLocationError(
            f"the cache at {cache_location} records blobs compressed with {found.compression!r}; "
            f"this jax-aot writes and reads {COMPRESSION!r}: upgrade jax-aot to the version that "
            "created the cache"
        )
    if found.format_version not in READABLE_FORMAT_VERSIONS:
        raise BlobLocationError(
            f"the cache at {cache_location} records artifact format {found.format_version}; this "
            f"jax-aot writes {FORMAT_VERSION} and reads {', '.join(map(str, READABLE_FORMAT_VERSIONS))}: "
            "upgrade jax-aot to the version that created the cache"
        )


def choose_blob_location(
    found: CacheDescription | None, given: str | None, cache_location: str, *, mirror: bool,
    shown_cache: str,
) -> str | None:
    """The blob location to open: ``given``, else the recorded one (None: the index's
    database). Raises :class:`BlobLocationError` when ``given`` differs from the
    recorded location and ``mirror`` is false."""
    if mirror and given is None:
        raise BlobLocationError(
            f"blob_mirror (--blobs-mirror, AOT_BLOBS_MIRROR) was given without a blob location "
            f"for the cache at {shown_cache}: give the mirror's location with --blobs "
            "(blob_location=), or drop the mirror flag to use the recorded location"
        )
    if found is None:
        return given
    check_description(found, shown_cache)
    recorded = found.blob_location
    if given is None:
        if recorded is not None:
            log.info("blobs of %s: %s (recorded by the cache)", shown_cache, recorded)
        return recorded
    identity = blob_identity(given, cache_location)
    if identity == recorded or mirror:
        if identity != recorded:
            log.info("blobs of %s: the mirror %s (the cache records %s)", shown_cache, identity,
                     shown_blobs(recorded))
        return given
    raise BlobLocationError(
        f"the cache at {shown_cache} records its blobs at {shown_blobs(recorded)}, but this "
        f"client gives {identity}: every blob would look missing there. Drop --blobs "
        "(AOT_BLOBS, blob_location=) to use the recorded location, or, if "
        f"{identity} holds a copy of the same blobs, say so with --blobs-mirror "
        "(AOT_BLOBS_MIRROR=1, blob_mirror=True)"
    )


def record_description(
    index: Index, blobs: ContentStore, location: str | None, cache_location: str, shown_cache: str,
) -> CacheDescription | None:
    """Records where the blobs live: at once for an empty index (a new cache), and for
    an existing one only when ``blobs`` holds the executable of one of its first
    :data:`EVIDENCE_ENTRIES` intact entries (logged either way)."""
    identity = blob_identity(location, cache_location)
    if not index.is_empty():
        entries = [e for e in index.entries() if e.ok][:EVIDENCE_ENTRIES]
        digests = [e.exe_digest or e.hlo_digest for e in entries]
        if entries and not blobs.exists([d for d in digests if d]):
            log.warning(
                "not recording the blob location of %s: none of %d entries checked has its "
                "blobs at %s (is --blobs right?)", shown_cache, len(entries), shown_blobs(identity),
            )
            return None
        log.warning(
            "the cache at %s was written before it recorded its blob location: recording %s "
            "(where its blobs are found)", shown_cache, shown_blobs(identity),
        )
    found = index.describe(identity, COMPRESSION, FORMAT_VERSION)
    if found.blob_location != identity:  # another client recorded first: check against it
        choose_blob_location(found, location, cache_location, mirror=False, shown_cache=shown_cache)
    return found


def blobs_as_recorded(cache: Any, described: CacheDescription | None) -> bool:
    """Whether the blob store in use is the one the cache itself names: the location
    its index records (a database cache), or a folder cache's own ``blobs`` folder.
    False for a mirror, another ``--blobs``, or no record to compare with."""
    location = getattr(cache, "location", None)
    if described is not None:
        if getattr(cache, "blob_mirror", False) or not isinstance(location, str):
            return False
        return blob_identity(getattr(cache, "blob_location", None), location) == described.blob_location
    index_file = getattr(cache, "_index_file", None)
    if index_file is None:
        return False
    given = getattr(cache, "blob_location", None)
    own = str(Path(index_file).parent / "blobs")
    return given is None or blob_identity(given, own) == blob_identity(own, own)
