"""The schema of the SQL index: SQLAlchemy Core tables, the schema version and its migrations.

One database holds everything the cache knows except the blob bytes (and, for a
database blob store, those too, in ``blobs_data``):

``programs``
    one row per program fingerprint: the name and input signature it was first
    stored under and the digest of its portable HLO (``jax.export`` bytes).
``artifacts``
    one row per (program fingerprint x environment fingerprint) = artifact key:
    the JSON manifest, the executable and HLO digests, sizes, compile time,
    created / last-used times, hit count, and a state (``ok`` / ``quarantined``).
``blobs``
    the blob reference table: every digest the index has registered, with its
    uncompressed and stored size; reachability for ``gc`` is computed from the
    digests that ``artifacts`` and ``programs`` rows reference.
``blobs_data``
    compressed blob bytes when the blobs live in the database
    (:class:`aot.cache.storage.database.SqlObjectStore`), so a PostgreSQL URL alone is a
    complete shared cache.
``blob_leases``
    pending references: a writer's claim on the digests it is about to check,
    write and name in a row, with an expiry on the database server's clock. gc
    never deletes a leased blob (the protocol is in docs/reliability.md).
``call_stats``
    serving statistics per (environment, name, signature): calls, loads and load
    time, compile time saved, misses and recompiles with their last reason
    (:mod:`aot.cache.stats_recorder` writes them in batches, never one write per call).
``ref_history`` and ``refs``
    which key is served for each (environment, name, signature): every change
    appended to ``ref_history`` (its autoincremented ``seq`` orders them: the index's
    commit order, never a client's clock), the current one kept in ``refs``
    (:mod:`aot.cache.index.refs`, :mod:`aot.cache.index.refs_sql`).
``releases`` and ``release_members``
    a label over a set of refs: each promotion, labelled warm-up or rollback appends a
    set; the label's current set is its highest id; ``previous`` chains rollbacks.
``cache_meta``
    one row: how the cache describes itself (blob location, compression, format).
``schema_version``
    a single row holding the schema version of the database.

Schema versions and migrations
------------------------------
The schema carries a version (:data:`SCHEMA_VERSION`) and an ordered tuple of migration
functions (:data:`MIGRATIONS`), not alembic: the table set is small (a migration is a few DDL
statements), and migrations run implicitly when *any* process first opens a cache (a fleet
starting at once): :func:`ensure_schema` runs them in one transaction under a lock
(``pg_advisory_xact_lock`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), re-reading the
version under it; DDL is transactional on both, so a failing migration changes nothing.

A fresh database is created directly at the current version from the tables; an
older one is upgraded by running every migration whose version is newer than the
stored one; a *newer* one is refused with a :class:`~aot.errors.CacheError`
naming both versions (upgrade jax-aot).

Changelog of :data:`SCHEMA_VERSION`:

* 1 (initial): schema_version, programs, artifacts, blobs, blobs_data.
* 2 (2026-12-02): ``artifacts.exe_digest`` may be NULL: a symbolic
  (shape-polymorphic) entry stores portable HLO and no executable
  (``_migrate_exe_digest_nullable``).
* 3 (2026-12-02): blob_leases (gc never races a writer); indexes on the digest
  columns of artifacts and programs (gc re-checks references per batch)
  (``_migrate_add_blob_leases``).
* 4 (2026-12-03): call_stats: calls, loads, misses and recompiles per environment,
  name and signature, written in batches off the call path (``_migrate_add_call_stats``,
  :mod:`aot.cache.stats_recorder`).
* 5 (2026-12-03): index_state: when a deletion of this index's own (gc, ``aot rm``)
  left it empty, so that gc tells an index it emptied from a lost or replaced one
  (``_migrate_add_index_state``, :mod:`aot.cache.index.state`).
* 6 (2026-12-04): refs and their history, releases and their members, cache_meta:
  what is served is declared, never inferred from a clock; a shared cache records
  where its blobs are (``_migrate_add_refs``). A cache without refs serves by the
  rule of schema 5 (the newest row) until a warm-up sets them.
* 7 (2026-12-04): jit_entries, jit_stats and jit_claims: entries of JAX's persistent compilation
  cache stored through jax-aot (KIND ``jit``, under JAX's own key, beside the ``aot``
  artifacts; :mod:`aot.cache.jax_cache`), their hits and misses per function name, and
  the claims of processes compiling a key others wait for (``_migrate_add_jit``). Additive: older rows are untouched.
* 8: default_release (``_migrate_add_default_release``).
* 9 (2026-12-06): captured_targets: a fleet's own GPU's target config, CUDA versions and
  autotune results (``aot target capture``, :mod:`aot.cache.index.targets`), inline: a few
  KiB of text each (``_migrate_add_captured_targets``). Additive.
* 10 (2026-12-06): ``artifacts.manifest_digest``: the manifest text of every entry is also
  a blob of the blob store (content-addressed, like its executable), so that ``aot repair``
  rebuilds an entry whose row was on an unreadable page (``_migrate_add_manifest_digest``:
  existing rows get the digest, their blob is written by the next store of the entry).
* 11 (2026-12-07): journal: each release set (its label, members and commit) and each
  captured GPU is also a content-addressed blob (:mod:`aot.cache.index.journal`), named
  here so that gc keeps it while the set or capture lives, and so that ``aot repair``
  rebuilds releases, their history and the captured GPUs of an index lost whole
  (``_migrate_add_journal``). Additive: the next change of a release or capture journals
  every set and capture not journaled yet.
* 12 (2026-12-07): ``artifacts.const_digest``: the blob of the closed-over constants JAX
  (0.12.1) hoisted into the executable's arguments (:mod:`aot.constants`), a blob of the
  entry like its executable, kept by gc while the row lives and carried by every copy
  (``_migrate_add_const_digest``). Additive: NULL in every older row (no constants).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy import Index as SqlIndex
from sqlalchemy.engine import Connection, Dialect, Engine

from aot.cache.index.advice import mask_url, reason_of
from aot.cache.index.entry import BLOB_COLUMNS, SCHEMA_VERSION, as_utc, utcnow
from aot.errors import CacheError

logger = logging.getLogger(__name__)

__all__ = [
    "OutdatedSchemaError",
    "SCHEMA_VERSION",
    "MIGRATIONS",
    "Migration",
    "UTCDateTime",
    "METADATA",
    "BLOBS_DATA",
    "ARTIFACTS",
    "PROGRAMS",
    "BLOBS",
    "SCHEMA_VERSIONS",
    "LEASES",
    "CALL_STATS",
    "INDEX_STATE",
    "REFS",
    "REF_HISTORY",
    "RELEASES",
    "RELEASE_MEMBERS",
    "CACHE_META",
    "DEFAULT_RELEASE",
    "CAPTURED_TARGETS",
    "JIT_ENTRIES",
    "JIT_STATS",
    "JIT_CLAIMS",
    "JOURNAL",
    "NOT_CREATED",
    "NOT_SALVAGED",
    "blob_columns",
    "blob_reference_columns",
    "ensure_schema",
    "found_instead",
    "salvaged_tables",
    "read_version",
]

#: Arbitrary constant key of the PostgreSQL advisory lock taken while migrating.
_PG_MIGRATION_LOCK_KEY = 0x6A61785F616F7431  # "jax_aot1"


# --------------------------------------------------------------------------- tables


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so the value is
    stored as naive UTC text (which sorts chronologically) and UTC is re-attached
    on the way out.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = as_utc(value, "a timestamp stored in the index")
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


#: One MetaData for the whole schema (what ``create_all`` creates on a fresh index).
METADATA = sa.MetaData()


def _required(name: str, type_: Any, *args: Any, **kwargs: Any) -> sa.Column[Any]:
    """A NOT NULL column (what the ORM's ``Mapped[T]`` declared)."""
    return sa.Column(name, type_, *args, nullable=False, **kwargs)


def _optional(name: str, type_: Any, *args: Any, **kwargs: Any) -> sa.Column[Any]:
    """A NULL-able column (``Mapped[T | None]``)."""
    return sa.Column(name, type_, *args, nullable=True, **kwargs)


def _key(name: str, type_: Any, *args: Any, **kwargs: Any) -> sa.Column[Any]:
    return sa.Column(name, type_, *args, primary_key=True, nullable=False, **kwargs)


SCHEMA_VERSIONS = sa.Table(
    "schema_version",
    METADATA,
    _key("id", Integer),
    _required("version", Integer),
    _required("updated_at", UTCDateTime),
    CheckConstraint("id = 1", name="ck_schema_version_single_row"),
)

PROGRAMS = sa.Table(
    "programs",
    METADATA,
    _key("program_fp", String(128)),
    _required("name", String(512)),
    _required("signature", Text),
    _optional("hlo_digest", String(64), info={"blob": True}),
    _required("created_at", UTCDateTime),
    SqlIndex("ix_programs_hlo_digest", "hlo_digest"),
)

ARTIFACTS = sa.Table(
    "artifacts",
    METADATA,
    _key("key", String(256)),
    _required("name", String(512), index=True),
    _required("program_fp", String(128), ForeignKey("programs.program_fp"), index=True),
    _required("env_fp", String(128), index=True),
    _required("signature", Text),
    _required("platform", String(64)),
    _required("manifest", Text),
    # NULL for a symbolic (shape-polymorphic) entry: portable HLO only (schema 2).
    _optional("exe_digest", String(64), info={"blob": True}),
    _optional("hlo_digest", String(64), info={"blob": True}),
    _required("raw_size", BigInteger),
    _required("stored_size", BigInteger),
    _required("compile_seconds", Float),
    _required("created_at", UTCDateTime),
    _required("last_used_at", UTCDateTime, index=True),
    _required("hits", Integer, default=0),
    _required("state", String(16), default="ok"),
    _optional("state_reason", Text),
    # sha256 of ``manifest``'s UTF-8 bytes, which the blob store holds too (schema 10):
    # a blob of the entry like its executable, so that ``aot repair`` can rebuild a row
    # lost with an unreadable page. NULL: never in a row this jax-aot writes (a row of
    # an older one is backfilled by the migration; its blob may not exist).
    _optional("manifest_digest", String(64), info={"blob": True}),
    # The entry's hoisted constants (schema 12; NULL: none), aot.constants.
    _optional("const_digest", String(64), info={"blob": True}),
    SqlIndex("ix_artifacts_name_env_state", "name", "env_fp", "state"),
    SqlIndex("ix_artifacts_exe_digest", "exe_digest"),
    SqlIndex("ix_artifacts_hlo_digest", "hlo_digest"),
    SqlIndex("ix_artifacts_manifest_digest", "manifest_digest"),
    SqlIndex("ix_artifacts_const_digest", "const_digest"),
    CheckConstraint("state IN ('ok', 'quarantined')", name="ck_artifacts_state"),
)

#: The blob reference table.
BLOBS = sa.Table(
    "blobs",
    METADATA,
    _key("digest", String(64)),
    _required("size", BigInteger),
    _required("stored_size", BigInteger),
    _required("created_at", UTCDateTime),
)

#: Compressed blob bytes, used by :class:`aot.cache.storage.database.SqlObjectStore`;
#: ``created_at`` is the blob's last write or touch, on the database server's clock.
BLOBS_DATA = sa.Table(
    "blobs_data",
    METADATA,
    _key("digest", String(64)),
    _required("data", LargeBinary),
    _required("created_at", UTCDateTime),
)

#: A writer's pending reference to a blob (see :meth:`Index.lease`).
LEASES = sa.Table(
    "blob_leases",
    METADATA,
    _key("token", String(32)),
    _key("digest", String(64)),
    _required("expires_at", UTCDateTime),
    SqlIndex("ix_blob_leases_digest", "digest"),
)

#: Serving statistics of one (environment, name, signature): see :mod:`aot.cache.stats_recorder`.
#: ``signature_digest`` (sha256 of ``signature``) is in the key instead of the text,
#: which can be longer than an index entry may be. A row may hold only misses: the
#: signature of calls that found no executable.
CALL_STATS = sa.Table(
    "call_stats",
    METADATA,
    _key("env_fp", String(128)),
    _key("name", String(512)),
    _key("signature_digest", String(64)),
    _required("signature", Text),
    _required("calls", BigInteger, default=0),
    _required("loads", BigInteger, default=0),
    _required("load_seconds", Float, default=0.0),
    _required("saved_seconds", Float, default=0.0),
    _required("misses", BigInteger, default=0),
    _optional("miss_reason", Text),
    _required("recompiles", BigInteger, default=0),
    _required("recompile_seconds", Float, default=0.0),
    _optional("recompile_reason", Text),
    _required("created_at", UTCDateTime),
    _required("updated_at", UTCDateTime),
)

#: One row: ``emptied_at`` is set when a deletion through the index left it without
#: any artifact or program row, and cleared by the next row added. An empty index
#: without it was never emptied by us: lost, truncated or replaced.
INDEX_STATE = sa.Table(
    "index_state",
    METADATA,
    _key("id", Integer),
    _optional("emptied_at", UTCDateTime),
    CheckConstraint("id = 1", name="ck_index_state_single_row"),
)

#: Every change of a ref, in the index's order (``seq``).
REF_HISTORY = sa.Table(
    "ref_history",
    METADATA,
    _key("seq", BigInteger().with_variant(Integer, "sqlite"), autoincrement=True),
    _required("env_fp", String(128)),
    _required("name", String(512)),
    _required("signature_digest", String(64)),
    _required("signature", Text),
    _required("key", String(256), index=True),
    _required("set_at", UTCDateTime),
    _required("host", String(256)),
    _required("user", String(256)),
    _required("source", Text),
    _optional("release", String(256)),
    _optional("commit", String(256)),
    SqlIndex("ix_ref_history_slot", "name", "env_fp", "signature_digest", "seq"),
)

#: The current ref of each (environment, name, signature): its latest history record.
REFS = sa.Table(
    "refs",
    METADATA,
    _key("env_fp", String(128)),
    _key("name", String(512)),
    _key("signature_digest", String(64)),
    _required("signature", Text),
    _required("key", String(256), index=True),
    _required("seq", BigInteger),
    _required("set_at", UTCDateTime),
    _required("host", String(256)),
    _required("user", String(256)),
    _required("source", Text),
    _optional("release", String(256)),
    _optional("commit", String(256)),
    SqlIndex("ix_refs_name", "name"),
)

#: One set a label pointed to; the label's current set is its highest id.
RELEASES = sa.Table(
    "releases",
    METADATA,
    _key("id", BigInteger().with_variant(Integer, "sqlite"), autoincrement=True),
    _required("label", String(256)),
    _optional("previous", BigInteger),
    _required("created_at", UTCDateTime),
    _required("host", String(256)),
    _required("user", String(256)),
    _required("source", Text),
    _optional("commit", String(256)),
    _optional("run", String(256)),  # shards of one run share a set
    SqlIndex("ix_releases_label", "label", "id"),
)

RELEASE_MEMBERS = sa.Table(
    "release_members",
    METADATA,
    _key("release_id", BigInteger, ForeignKey("releases.id")),
    _key("env_fp", String(128)),
    _key("name", String(512)),
    _key("signature_digest", String(64)),
    _required("signature", Text),
    _required("key", String(256)),
    SqlIndex("ix_release_members_key", "key"),
)

#: How the cache describes itself (:class:`aot.cache.index.releases.CacheDescription`).
CACHE_META = sa.Table(
    "cache_meta",
    METADATA,
    _key("id", Integer),
    _optional("blob_location", Text),
    _required("compression", String(64)),
    _required("format_version", Integer),
    _required("created_at", UTCDateTime),
    CheckConstraint("id = 1", name="ck_cache_meta_single_row"),
)

#: The release a replica serves when it names none (``aot release default LABEL``):
#: one row; no row, or ``label`` NULL, and it serves the refs. A label, not a set: it
#: follows the label's promotions and rollbacks.
DEFAULT_RELEASE = sa.Table(
    "default_release",
    METADATA,
    _key("id", Integer),
    _optional("label", String(256)),
    _required("set_at", UTCDateTime),
    _required("host", String(256)),
    _required("user", String(256)),
    CheckConstraint("id = 1", name="ck_default_release_single_row"),
)

#: A GPU captured from a host of the fleet (``aot target capture NAME``): its target config
#: (text), the versions recorded with it (JSON), and XLA's autotune results (text) when
#: captured; ``cuda:NAME`` compiles for exactly that GPU (:mod:`aot.platforms.cuda`).
CAPTURED_TARGETS = sa.Table(
    "captured_targets",
    METADATA,
    _key("name", String(128)),
    _required("platform", String(32)),
    _required("config", Text),
    _required("config_digest", String(80)),
    _required("versions", Text),
    _optional("autotune", Text),
    _optional("autotune_digest", String(80)),
    _required("device_kind", String(256)),
    _required("captured_at", UTCDateTime),
    _required("host", String(256)),
    _required("user", String(256)),
)

#: The blob journaling each declaration (:mod:`aot.cache.index.journal`): ``kind``
#: ``release`` (``name`` the set's id) or ``target`` (``name`` the captured GPU's). A
#: declaration without a row here is not journaled yet (new, or changed since): the
#: next journaling writes its blob. The row goes with its set or capture, and gc frees
#: the blob then.
JOURNAL = sa.Table(
    "journal",
    METADATA,
    _key("kind", String(16)),
    _key("name", String(256)),
    _required("digest", String(64), index=True, info={"blob": True}),
    _required("written_at", UTCDateTime),
)


def blob_columns() -> tuple[tuple[str, str], ...]:
    """(table, column) of every column marked as naming a blob gc keeps while its row
    lives (``info={"blob": True}``), read from :data:`METADATA` when called."""
    return tuple((t.name, c.name) for t in METADATA.sorted_tables for c in t.columns if c.info.get("blob"))


#: The tables a repaired index does not carry over (``aot repair``): ``blob_leases`` and
#: ``jit_claims`` (a writer's, minutes long), ``blobs_data`` (the bytes of a database blob
#: store: a folder cache keeps its blobs in files), ``schema_version`` (the new index's
#: own). Every other table is salvaged: a table added to the schema is carried over
#: unless it is named here.
NOT_SALVAGED = frozenset({"blob_leases", "jit_claims", "blobs_data", "schema_version"})


def salvaged_tables() -> tuple[str, ...]:
    """The tables a repaired index carries over, parents before children: every table
    of :data:`METADATA` but :data:`NOT_SALVAGED`, read when called (one list, never
    typed out twice)."""
    return tuple(t.name for t in METADATA.sorted_tables if t.name not in NOT_SALVAGED)


def blob_reference_columns() -> list[sa.Column[Any]]:
    """The columns of :data:`~aot.cache.index.entry.BLOB_COLUMNS`: what gc's queries
    union (a digest any of them holds is referenced)."""
    return [METADATA.tables[table].c[column] for table, column in BLOB_COLUMNS]


#: An entry of JAX's persistent compilation cache (KIND ``jit``): JAX's key, the
#: jitted function's name, the blob of JAX's zstd payload (:mod:`aot.cache.index.jit`).
JIT_ENTRIES = sa.Table(
    "jit_entries",
    METADATA,
    _key("key", String(1024)),
    _required("name", String(512), index=True),
    _required("digest", String(64), index=True, info={"blob": True}),
    _required("size", BigInteger),
    _required("stored_size", BigInteger),
    _required("compile_seconds", Float),
    _required("platform", String(64)),
    _optional("signature", String(128)),
    _required("created_at", UTCDateTime),
    _required("last_used_at", UTCDateTime, index=True),
    _required("hits", BigInteger, default=0),
)

#: A process compiling a jit key that others missed too (compile once per fleet):
#: who holds it, until when (the database server's clock).
JIT_CLAIMS = sa.Table(
    "jit_claims",
    METADATA,
    _key("key", String(1024)),
    _required("holder", String(256)),
    _required("expires_at", UTCDateTime),
)

#: Hits and misses of JAX's persistent cache through jax-aot, per function name.
JIT_STATS = sa.Table(
    "jit_stats",
    METADATA,
    _key("name", String(512)),
    _required("hits", BigInteger, default=0),
    _required("misses", BigInteger, default=0),
    _required("saved_seconds", Float, default=0.0),
    _required("updated_at", UTCDateTime),
)


# ------------------------------------------------------------------------ migrations


@dataclass(frozen=True, slots=True)
class Migration:
    """Upgrade a database from ``version - 1`` to ``version`` (runs inside the lock)."""

    version: int
    description: str
    upgrade: Callable[[Connection], None]


def _create_v1(conn: Connection) -> None:
    METADATA.create_all(conn, checkfirst=True)


def _migrate_exe_digest_nullable(conn: Connection) -> None:
    """``artifacts.exe_digest`` NULL-able, for symbolic entries (no executable).

    PostgreSQL alters the column in place. SQLite cannot drop a NOT NULL: the table
    is rebuilt (new table from the model, rows copied, old table dropped, new one
    renamed, indexes recreated), inside the migration's transaction.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("ALTER TABLE artifacts ALTER COLUMN exe_digest DROP NOT NULL"))
        return
    metadata = sa.MetaData()
    PROGRAMS.to_metadata(metadata)  # the foreign key's target, for the DDL
    staging = ARTIFACTS.to_metadata(metadata, name="artifacts__v2")
    conn.execute(sa.schema.CreateTable(staging))
    # The columns of schema 1 (a later migration adds the newer ones; the staging
    # table has them, NULL here).
    columns = ", ".join(c.name for c in ARTIFACTS.columns if c.name not in _ADDED_AFTER_2)
    conn.execute(sa.text(f"INSERT INTO artifacts__v2 ({columns}) SELECT {columns} FROM artifacts"))
    conn.execute(sa.text("DROP TABLE artifacts"))
    conn.execute(sa.text("ALTER TABLE artifacts__v2 RENAME TO artifacts"))
    for index in ARTIFACTS.indexes:
        index.create(conn)


#: Columns of ``artifacts`` that migrations after 2 add.
_ADDED_AFTER_2 = ("manifest_digest", "const_digest")


def _migrate_add_blob_leases(conn: Connection) -> None:
    LEASES.create(conn, checkfirst=True)
    for table in (ARTIFACTS, PROGRAMS):
        for index in table.indexes:
            if index.name in ("ix_artifacts_exe_digest", "ix_artifacts_hlo_digest", "ix_programs_hlo_digest"):
                index.create(conn, checkfirst=True)


def _migrate_add_call_stats(conn: Connection) -> None:
    CALL_STATS.create(conn, checkfirst=True)


def _migrate_add_index_state(conn: Connection) -> None:
    INDEX_STATE.create(conn, checkfirst=True)


def _migrate_add_refs(conn: Connection) -> None:
    for table in (REF_HISTORY, REFS, RELEASES, RELEASE_MEMBERS, CACHE_META):
        table.create(conn, checkfirst=True)


def _migrate_add_jit(conn: Connection) -> None:
    for table in (JIT_ENTRIES, JIT_STATS, JIT_CLAIMS):
        table.create(conn, checkfirst=True)


def _migrate_add_default_release(conn: Connection) -> None:
    DEFAULT_RELEASE.create(conn, checkfirst=True)


def _migrate_add_captured_targets(conn: Connection) -> None:
    CAPTURED_TARGETS.create(conn, checkfirst=True)


def _migrate_add_journal(conn: Connection) -> None:
    JOURNAL.create(conn, checkfirst=True)


_BACKFILL_BATCH = 1000


def _migrate_add_manifest_digest(conn: Connection) -> None:
    """``artifacts.manifest_digest``, backfilled with the sha256 of each row's manifest
    text. Only the digest: the blob itself is not written here (a migration touches the
    index only), so :func:`aot.cache.admin.maintenance.verify` names such an entry as one
    ``aot repair`` could not rebuild, and the next store of the entry writes its blob."""
    import hashlib

    have = {c["name"] for c in sa.inspect(conn).get_columns("artifacts")}
    if "manifest_digest" not in have:  # a database migrated from 1 got it with migration 2's rebuild
        conn.execute(sa.text("ALTER TABLE artifacts ADD COLUMN manifest_digest VARCHAR(64)"))
    index = next(i for i in ARTIFACTS.indexes if i.name == "ix_artifacts_manifest_digest")
    index.create(conn, checkfirst=True)
    after = ""
    while True:
        rows = conn.execute(
            sa.select(ARTIFACTS.c.key, ARTIFACTS.c.manifest)
            .where(ARTIFACTS.c.key > after, ARTIFACTS.c.manifest_digest.is_(None))
            .order_by(ARTIFACTS.c.key).limit(_BACKFILL_BATCH)
        ).all()
        if not rows:
            return
        conn.execute(
            sa.update(ARTIFACTS).where(ARTIFACTS.c.key == sa.bindparam("k")).values(manifest_digest=sa.bindparam("d")),
            [{"k": key, "d": hashlib.sha256(manifest.encode()).hexdigest()} for key, manifest in rows],
        )
        after = rows[-1][0]


def _migrate_add_const_digest(conn: Connection) -> None:
    """``artifacts.const_digest`` (NULL in every existing row: no hoisted constants)."""
    have = {c["name"] for c in sa.inspect(conn).get_columns("artifacts")}
    if "const_digest" not in have:  # a database migrated from 1 got it with migration 2's rebuild
        conn.execute(sa.text("ALTER TABLE artifacts ADD COLUMN const_digest VARCHAR(64)"))
    index = next(i for i in ARTIFACTS.indexes if i.name == "ix_artifacts_const_digest")
    index.create(conn, checkfirst=True)


#: Ordered migrations; ``MIGRATIONS[-1].version == SCHEMA_VERSION``. A fresh
#: database is created from the tables at the current version; migration 1 exists
#: so that the list is complete and every version has a description.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema: programs, artifacts, blobs, blobs_data", _create_v1),
    Migration(2, "artifacts.exe_digest may be NULL (symbolic entries)", _migrate_exe_digest_nullable),
    Migration(3, "blob leases, and indexes on blob digests (gc safety)", _migrate_add_blob_leases),
    Migration(4, "call statistics per environment, name and signature", _migrate_add_call_stats),
    Migration(5, "index_state: an index emptied by its own deletions", _migrate_add_index_state),
    Migration(6, "refs, ref history, releases and cache_meta: what is served is declared", _migrate_add_refs),
    Migration(7, "jit_entries and jit_stats: JAX's persistent cache through jax-aot", _migrate_add_jit),
    Migration(8, "default_release: the release a replica serves when it names none", _migrate_add_default_release),
    Migration(9, "captured_targets: a fleet's own GPUs, their CUDA versions and autotune results",
              _migrate_add_captured_targets),
    Migration(10, "artifacts.manifest_digest: each entry's manifest is a blob too", _migrate_add_manifest_digest),
    Migration(11, "journal: each release set and captured GPU is a blob too", _migrate_add_journal),
    Migration(12, "artifacts.const_digest: an entry's hoisted constants are a blob of it", _migrate_add_const_digest),
)


def _jax_aot_version() -> str:
    try:
        from importlib.metadata import version

        return version("jax-aot")
    except Exception:  # noqa: BLE001 - only used in messages
        return "unknown"


def read_version(conn: Connection) -> int:
    """The schema version the database records (0: no schema yet)."""
    if not sa.inspect(conn).has_table(SCHEMA_VERSIONS.name):
        return 0
    query = sa.select(SCHEMA_VERSIONS.c.version).where(SCHEMA_VERSIONS.c.id == 1)
    value = conn.execute(query).scalar_one_or_none()
    return int(value) if value is not None else 0


def _too_new(url: str, found: int, supported: int) -> CacheError:
    return CacheError(
        f"the cache index at {url} has schema version {found}, but this jax-aot "
        f"({_jax_aot_version()}) understands schema versions up to {supported}; "
        f"upgrade jax-aot to use this cache (or use another cache location)"
    )


#: How an open that must not create (a command that only reads) answers a location
#: without a cache.
NOT_CREATED = (
    "this command creates no cache (aot compile, aot warmup and aot bundle import do): "
    "check --cache, AOT_CACHE or [tool.aot]"
)


def found_instead(conn: Connection, url: str) -> str:
    """What a database without a jax-aot schema holds, in words: empty, or the tables
    of something else (a foreign database is never taken for an empty cache)."""
    tables = sorted(sa.inspect(conn).get_table_names())
    if not tables:
        return f"the database at {url} is empty (no tables)"
    shown = ", ".join(tables[:5]) + (f", ... ({len(tables)} in all)" if len(tables) > 5 else "")
    ours = {t.name for t in METADATA.sorted_tables}
    if ours & set(tables):
        return f"the database at {url} holds some of jax-aot's tables but no schema version ({shown})"
    return f"the database at {url} is not a jax-aot cache index: it holds {len(tables)} other table(s) ({shown})"


class OutdatedSchemaError(CacheError):
    """A read-only open found an index of an older schema, which only a writer migrates."""


def ensure_schema(engine: Engine, *, read_only: bool = False, create: bool = True) -> int:
    """Create or migrate the schema of ``engine``'s database; return its version.

    Safe to call concurrently from many processes (see the module docstring).
    Read-only callers never write: they get a :class:`CacheError` if the database
    is missing its schema or needs a migration. ``create=False`` (the commands that
    only read, even on a writable connection) neither creates nor migrates either: an
    empty or foreign database is a :class:`CacheError` saying what it holds.
    """
    target = SCHEMA_VERSION
    migrations = MIGRATIONS
    url = mask_url(engine.url)
    with engine.connect() as conn:
        with conn.begin():
            found = read_version(conn)
            if found == 0 and not create:
                raise CacheError(f"no jax-aot cache index: {found_instead(conn, url)}; {NOT_CREATED}")
        if found == target:
            return found
        if found > target:
            raise _too_new(url, found, target)
        if not create and not read_only:
            raise OutdatedSchemaError(
                f"the cache index at {url} has schema version {found} and this jax-aot "
                f"needs {target}; a command that only reads does not migrate it: run one "
                f"that stores (aot compile, aot warmup, aot bundle import) to upgrade it"
            )
        if read_only:
            if found == 0:
                with conn.begin():
                    what = found_instead(conn, url)
                raise CacheError(
                    f"no jax-aot cache index: {what} (opened read-only, so nothing was "
                    f"created); check the location, or fill it with a command that stores"
                )
            raise OutdatedSchemaError(
                f"the cache index at {url} has schema version {found} and this jax-aot "
                f"needs {target}; it was opened read-only so it was not migrated: open "
                f"it once read-write (any jax-aot command that writes) to upgrade it"
            )
        conn.execution_options(aot_write=True)
        with conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK_KEY})
            found = read_version(conn)  # again, under the lock
            if found > target:
                raise _too_new(url, found, target)
            if found == 0:
                logger.info("creating the cache index schema v%d at %s", target, url)
                METADATA.create_all(conn, checkfirst=True)
                conn.execute(sa.insert(SCHEMA_VERSIONS).values(id=1, version=target, updated_at=utcnow()))
            elif found < target:
                for migration in migrations:
                    if found < migration.version <= target:
                        logger.info(
                            "migrating the cache index at %s to schema v%d: %s",
                            url,
                            migration.version,
                            migration.description,
                        )
                        try:
                            migration.upgrade(conn)
                        except Exception as e:
                            # Leaving the block rolls the whole transaction back.
                            raise CacheError(
                                f"migrating the cache index at {url} to schema version "
                                f"{migration.version} ({migration.description}) failed: "
                                f"{reason_of(e)}; nothing was changed, the database is still "
                                f"at version {found}"
                            ) from e
                conn.execute(
                    sa.update(SCHEMA_VERSIONS)
                    .where(SCHEMA_VERSIONS.c.id == 1)
                    .values(version=target, updated_at=utcnow())
                )
            return target
