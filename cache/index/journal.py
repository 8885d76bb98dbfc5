"""Declarations journaled as blobs (schema 11): each release set and each captured GPU.

A release set (its label, members, commit and who made it) and a captured GPU (its
target config, versions and autotune results) are declarations, as valuable as the
entries they name: an index lost whole must not take them along. So each is also
written to the blob store as one content-addressed JSON blob (:func:`release_blob`,
:func:`target_blob`), named by a row of ``journal`` so that gc keeps it while the set or
capture lives. A change of a set (members added or dropped) or a new capture of a name
deletes its ``journal`` row: the old blob becomes gc's, and the next journaling writes
the new one. ``aot repair`` reads them back (:func:`read_journal`) when the rows are lost.

Journaling follows the writer's side of the gc protocol: the digest is leased, the blob
written, then, in one transaction, the declaration is read again and, still the same,
its ``journal`` row is written and the lease released. It runs after each change of a
release or a capture, through the blob writer the cache gives its index
(:attr:`IndexJournal.journal_writer`); without one (an index opened alone, a read-only
cache) nothing is journaled, and the next writer with one journals every declaration
still without a row (also those of an index migrated from schema 10). A failure to
journal is logged, never raised: the declaration itself is committed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from aot.cache.index.engine import IndexEngine, insert_ignore, server_now
from aot.cache.index.refs import ReleaseMember, signature_digest
from aot.cache.index.schema import BLOBS, CAPTURED_TARGETS, JOURNAL, LEASES, RELEASE_MEMBERS, RELEASES
from aot.errors import AotError

logger = logging.getLogger(__name__)

__all__ = [
    "JOURNAL_FORMAT", "RELEASE", "TARGET", "IndexJournal", "JournaledRelease", "JournaledTarget",
    "read_journal", "release_blob", "target_blob",
]

#: The version of the journal's JSON (``"journal"`` in every blob).
JOURNAL_FORMAT = 1
#: The kinds of declaration journaled (``journal.kind``).
RELEASE = "release"
TARGET = "target"

#: How long a journal write's lease lasts (a few KiB written: seconds at most).
_LEASE_SECONDS = 3600.0

#: Writes bytes to the blob store: (digest, size, stored size).
BlobWriter = Callable[[bytes], tuple[str, int, int]]

_SET_COLUMNS = ("id", "label", "previous", "created_at", "host", "user", "source", "commit", "run")
_TARGET_COLUMNS = ("name", "platform", "config", "config_digest", "versions", "autotune", "autotune_digest",
                   "device_kind", "captured_at", "host", "user")


@dataclass(frozen=True, slots=True, kw_only=True)
class JournaledRelease:
    """A release set as its journal blob holds it."""

    id: int
    label: str
    previous: int | None
    created_at: datetime
    host: str
    user: str
    source: str
    commit: str | None
    run: str | None
    members: tuple[ReleaseMember, ...]

    def row(self) -> dict[str, Any]:
        """Its ``releases`` row."""
        return {c: getattr(self, c) for c in _SET_COLUMNS}


@dataclass(frozen=True, slots=True, kw_only=True)
class JournaledTarget:
    """A captured GPU as its journal blob holds it: its ``captured_targets`` row."""

    values: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.values["name"])

    @property
    def captured_at(self) -> datetime:
        return datetime.fromisoformat(self.values["captured_at"])


def _text(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def release_blob(row: dict[str, Any], members: Iterable[ReleaseMember]) -> bytes:
    """The journal blob of a release set (its ``releases`` row and members): canonical
    JSON, so that the same set always makes the same blob."""
    body = {"journal": JOURNAL_FORMAT, "kind": RELEASE, **{c: _text(row[c]) for c in _SET_COLUMNS}}
    body["id"] = int(body["id"])
    ordered = sorted(members, key=lambda m: (m.env_fp, m.name, signature_digest(m.signature)))
    body["members"] = [[m.name, m.signature, m.env_fp, m.key] for m in ordered]
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def target_blob(row: dict[str, Any]) -> bytes:
    """The journal blob of a captured GPU (its ``captured_targets`` row)."""
    body = {"journal": JOURNAL_FORMAT, "kind": TARGET, **{c: _text(row[c]) for c in _TARGET_COLUMNS}}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def read_journal(data: bytes) -> JournaledRelease | JournaledTarget | None:
    """The declaration a blob journals; None when it is not a journal blob (a manifest,
    an executable) or not one of this format."""
    if not data.lstrip().startswith(b"{"):
        return None
    try:
        body = json.loads(data)
        if not isinstance(body, dict) or body.get("journal") != JOURNAL_FORMAT:
            return None
        if body.get("kind") == RELEASE:
            return JournaledRelease(
                id=int(body["id"]), label=str(body["label"]),
                previous=None if body["previous"] is None else int(body["previous"]),
                created_at=datetime.fromisoformat(body["created_at"]), host=str(body["host"]),
                user=str(body["user"]), source=str(body["source"]), commit=body["commit"], run=body["run"],
                members=tuple(ReleaseMember(str(n), str(s), str(e), str(k)) for n, s, e, k in body["members"]),
            )
        if body.get("kind") == TARGET:
            values = {c: body[c] for c in _TARGET_COLUMNS}
            datetime.fromisoformat(values["captured_at"])
            return JournaledTarget(values=values)
    except (ValueError, KeyError, TypeError):
        return None
    return None


class IndexJournal(IndexEngine):
    """The ``journal`` rows: which declarations are journaled, and journaling the others."""

    #: Set by the cache that opens this index writable: how a journal blob is written.
    journal_writer: BlobWriter | None = None
    #: ... and how one no row names any more is deleted (the content store's ``delete``).
    _journal_deleter: Callable[[list[str]], object] | None = None
    #: Digests of journal rows deleted (changed or removed declarations): each is
    #: deleted after the next journaling, unless a row names it again.
    _stale_journals: list[str]

    if TYPE_CHECKING:
        def drop_unreferenced(self, digests: Iterable[str], delete: Callable[[list[str]], object]) -> list[str]: ...

    def journal_to(self, owner: Callable[[], Any]) -> None:
        """Journals declarations into the blob store of the cache ``owner()`` returns (a
        weak reference to it) from now on."""
        self.journal_writer = blob_writer(owner)

        def delete(digests: list[str]) -> object:
            cache = owner()
            return cache.blobs.delete(digests) if cache is not None else 0
        self._journal_deleter = delete

    def forget_journal(self, conn: Connection, kind: str, names: Iterable[str | int]) -> None:
        """Deletes the ``journal`` rows of declarations changed or removed in ``conn``'s
        transaction: a changed one is journaled again, and their old blobs are deleted
        by the next :meth:`journal_pending` (as gc deletes: unless a row names them)."""
        wanted = sorted({str(n) for n in names})
        for i in range(0, len(wanted), 500):
            chunk = JOURNAL.c.kind == kind, JOURNAL.c.name.in_(wanted[i:i + 500])
            old = list(conn.execute(sa.select(JOURNAL.c.digest).where(*chunk)).scalars())
            conn.execute(sa.delete(JOURNAL).where(*chunk))
            self.__dict__.setdefault("_stale_journals", []).extend(old)

    def journal_pending(self) -> int:
        """Journals every release set and captured GPU without a ``journal`` row (see
        the module docstring); how many. Never raises: a failure is logged."""
        writer = self.journal_writer
        if writer is None or self.read_only:
            return 0
        try:
            written = self._journal_all(writer)
            stale, self._stale_journals = self.__dict__.get("_stale_journals", []), []
            if stale and self._journal_deleter is not None:
                self.drop_unreferenced(stale, self._journal_deleter)
            return written
        except (AotError, OSError) as exc:
            logger.warning("could not journal the release sets and captured GPUs (a repair aid; the next "
                           "change journals them): %s", exc)
            return 0

    def journal_rows(self) -> dict[tuple[str, str], str]:
        """(kind, name) -> digest of every journaled declaration."""
        with self._read("read the journal") as conn:
            return {(k, n): d for k, n, d in conn.execute(sa.select(JOURNAL.c.kind, JOURNAL.c.name, JOURNAL.c.digest))}

    def _journal_all(self, writer: BlobWriter) -> int:
        with self._read("list declarations to journal") as conn:
            done = {(k, n) for k, n in conn.execute(sa.select(JOURNAL.c.kind, JOURNAL.c.name))}
            sets = [str(i) for i in conn.execute(sa.select(RELEASES.c.id).order_by(RELEASES.c.id)).scalars()]
            names = list(conn.execute(sa.select(CAPTURED_TARGETS.c.name).order_by(CAPTURED_TARGETS.c.name)).scalars())
        pending = [(RELEASE, s) for s in sets if (RELEASE, s) not in done]
        pending += [(TARGET, n) for n in names if (TARGET, n) not in done]
        written = 0
        for kind, name in pending:
            with self._read(f"read {kind} {name} to journal") as conn:
                data = _declaration(conn, kind, name)
            if data is not None and self._journal_one(writer, kind, name, data):
                written += 1
        if written:
            logger.info("journaled %d release sets and captured GPUs as blobs", written)
        return written

    def _journal_one(self, writer: BlobWriter, kind: str, name: str, data: bytes) -> bool:
        digest = hashlib.sha256(data).hexdigest()
        token = secrets.token_hex(16)
        with self._write(f"lease the journal blob of {kind} {name}") as conn:
            expires = server_now(conn) + timedelta(seconds=_LEASE_SECONDS)
            conn.execute(sa.insert(LEASES).values(token=token, digest=digest, expires_at=expires))
        committed = False
        try:
            written, size, stored_size = writer(data)
            if written != digest:
                raise AotError(f"the journal blob of {kind} {name} was stored as {written[:12]}, not {digest[:12]}")
            with self._write(f"journal {kind} {name}") as conn:
                held = conn.execute(sa.delete(LEASES).where(LEASES.c.token == token)).rowcount
                if not held or _declaration(conn, kind, name) != data:
                    return False  # changed meanwhile (the next journaling writes it), or lease taken by gc
                conn.execute(sa.delete(JOURNAL).where(JOURNAL.c.kind == kind, JOURNAL.c.name == name))
                now = server_now(conn)
                conn.execute(sa.insert(JOURNAL).values(kind=kind, name=name, digest=digest, written_at=now))
                conn.execute(insert_ignore(conn, BLOBS).values(
                    digest=digest, size=size, stored_size=stored_size, created_at=now,
                ).on_conflict_do_nothing())
                committed = True
            return True
        finally:
            if not committed:
                with self._write("release a journal lease") as conn:
                    conn.execute(sa.delete(LEASES).where(LEASES.c.token == token))


def _declaration(conn: Connection, kind: str, name: str) -> bytes | None:
    """The journal blob of the declaration ``(kind, name)`` as the index holds it now."""
    if kind == RELEASE:
        row = conn.execute(sa.select(RELEASES).where(RELEASES.c.id == int(name))).first()
        if row is None:
            return None
        members = conn.execute(sa.select(RELEASE_MEMBERS).where(RELEASE_MEMBERS.c.release_id == int(name)))
        return release_blob(dict(row._mapping), [ReleaseMember(m.name, m.signature, m.env_fp, m.key) for m in members])
    row = conn.execute(sa.select(CAPTURED_TARGETS).where(CAPTURED_TARGETS.c.name == name)).first()
    return None if row is None else target_blob(dict(row._mapping))


def blob_writer(owner: Callable[[], Any]) -> BlobWriter:
    """The :data:`BlobWriter` into the content store (``.blobs.store_bytes``) of the cache
    ``owner()`` returns (a weak reference: the index never keeps its cache alive)."""
    def write(data: bytes) -> tuple[str, int, int]:
        cache = owner()
        if cache is None:
            raise AotError("the cache that opened this index is closed: nothing to journal into")
        stored = cache.blobs.store_bytes(data)
        return stored.digest, stored.size, stored.stored_size
    return write
