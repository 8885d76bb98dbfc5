"""The schema of the SQL index: SQLAlchemy 2.0 typed models, the schema version and its migrations.

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
    (:mod:`aot.cache.serving.stats` writes them in batches, never one write per call).
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
The schema carries a version (:data:`SCHEMA_VERSION`) and an ordered tuple of
migration functions (:data:`MIGRATIONS`), rather than alembic, because:

* jax-aot owns exactly one small table set, so a migration is a few DDL
  statements; alembic would add a dependency, a migrations folder and an
  ``alembic.ini`` to every installation for no gain;
* migrations must run implicitly and safely when *any* process first opens a
  cache (a CI job, a server fleet starting at once), not from an operator's
  command line. :func:`ensure_schema` does that in one transaction under a lock:
  ``pg_advisory_xact_lock`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite. The
  version is re-read under the lock, so concurrent first opens create the tables
  once and the losers see a finished schema. DDL is transactional on both
  databases, so a failing migration leaves the previous version intact.

A fresh database is created directly at the current version from the models; an
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
  :mod:`aot.cache.serving.stats`).
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
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

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
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from aot.cache.index.advice import mask_url, reason_of
from aot.cache.index.entry import SCHEMA_VERSION, as_utc, utcnow
from aot.errors import CacheError

logger = logging.getLogger(__name__)

__all__ = [
    "OutdatedSchemaError",
    "SCHEMA_VERSION",
    "MIGRATIONS",
    "Migration",
    "UTCDateTime",
    "Base",
    "SchemaVersionRow",
    "ProgramRow",
    "ArtifactRow",
    "BlobRefRow",
    "BlobDataRow",
    "BlobLeaseRow",
    "CallStatsRow",
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
    "JIT_ENTRIES",
    "JIT_STATS",
    "JIT_CLAIMS",
    "ensure_schema",
    "read_version",
]

#: Arbitrary constant key of the PostgreSQL advisory lock taken while migrating.
_PG_MIGRATION_LOCK_KEY = 0x6A61785F616F7431  # "jax_aot1"


# --------------------------------------------------------------------------- models


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


class Base(DeclarativeBase):
    """Declarative base of the index models (one MetaData for the whole schema)."""


class SchemaVersionRow(Base):
    __tablename__ = "schema_version"
    __table_args__ = (CheckConstraint("id = 1", name="ck_schema_version_single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ProgramRow(Base):
    __tablename__ = "programs"
    __table_args__ = (SqlIndex("ix_programs_hlo_digest", "hlo_digest"),)

    program_fp: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(512))
    signature: Mapped[str] = mapped_column(Text)
    hlo_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ArtifactRow(Base):
    __tablename__ = "artifacts"
    __table_args__ = (
        SqlIndex("ix_artifacts_name_env_state", "name", "env_fp", "state"),
        SqlIndex("ix_artifacts_exe_digest", "exe_digest"),
        SqlIndex("ix_artifacts_hlo_digest", "hlo_digest"),
        CheckConstraint("state IN ('ok', 'quarantined')", name="ck_artifacts_state"),
    )

    key: Mapped[str] = mapped_column(String(256), primary_key=True)
    name: Mapped[str] = mapped_column(String(512), index=True)
    program_fp: Mapped[str] = mapped_column(
        String(128), ForeignKey("programs.program_fp"), index=True
    )
    env_fp: Mapped[str] = mapped_column(String(128), index=True)
    signature: Mapped[str] = mapped_column(Text)
    platform: Mapped[str] = mapped_column(String(64))
    manifest: Mapped[str] = mapped_column(Text)
    # NULL for a symbolic (shape-polymorphic) entry: portable HLO only (schema 2).
    exe_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    hlo_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    raw_size: Mapped[int] = mapped_column(BigInteger)
    stored_size: Mapped[int] = mapped_column(BigInteger)
    compile_seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_used_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    hits: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default="ok")
    state_reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class BlobRefRow(Base):
    __tablename__ = "blobs"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    stored_size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class BlobDataRow(Base):
    """Compressed blob bytes, used by :class:`aot.cache.storage.database.SqlObjectStore`.

    ``created_at`` is the blob's last write or touch, on the database server's clock.
    """

    __tablename__ = "blobs_data"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class BlobLeaseRow(Base):
    """A writer's pending reference to a blob (see :meth:`Index.lease`)."""

    __tablename__ = "blob_leases"
    __table_args__ = (SqlIndex("ix_blob_leases_digest", "digest"),)

    token: Mapped[str] = mapped_column(String(32), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class CallStatsRow(Base):
    """Serving statistics of one (environment, name, signature): see :mod:`aot.cache.serving.stats`.

    ``signature_digest`` (sha256 of ``signature``) is in the key instead of the text,
    which can be longer than an index entry may be. A row may hold only misses: the
    signature of calls that found no executable.
    """

    __tablename__ = "call_stats"

    env_fp: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(512), primary_key=True)
    signature_digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    signature: Mapped[str] = mapped_column(Text)
    calls: Mapped[int] = mapped_column(BigInteger, default=0)
    loads: Mapped[int] = mapped_column(BigInteger, default=0)
    load_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    saved_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    misses: Mapped[int] = mapped_column(BigInteger, default=0)
    miss_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    recompiles: Mapped[int] = mapped_column(BigInteger, default=0)
    recompile_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    recompile_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class IndexStateRow(Base):
    """One row: ``emptied_at`` is set when a deletion through the index left it without
    any artifact or program row, and cleared by the next row added. An empty index
    without it was never emptied by us: lost, truncated or replaced."""

    __tablename__ = "index_state"
    __table_args__ = (CheckConstraint("id = 1", name="ck_index_state_single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    emptied_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class RefHistoryRow(Base):
    """Every change of a ref, in the index's order (``seq``)."""

    __tablename__ = "ref_history"
    __table_args__ = (SqlIndex("ix_ref_history_slot", "name", "env_fp", "signature_digest", "seq"),)

    seq: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    env_fp: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(512))
    signature_digest: Mapped[str] = mapped_column(String(64))
    signature: Mapped[str] = mapped_column(Text)
    key: Mapped[str] = mapped_column(String(256), index=True)
    set_at: Mapped[datetime] = mapped_column(UTCDateTime)
    host: Mapped[str] = mapped_column(String(256))
    user: Mapped[str] = mapped_column(String(256))
    source: Mapped[str] = mapped_column(Text)
    release: Mapped[str | None] = mapped_column(String(256), nullable=True)
    commit: Mapped[str | None] = mapped_column(String(256), nullable=True)


class RefRow(Base):
    """The current ref of each (environment, name, signature): its latest history record."""

    __tablename__ = "refs"
    __table_args__ = (SqlIndex("ix_refs_name", "name"),)

    env_fp: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(512), primary_key=True)
    signature_digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    signature: Mapped[str] = mapped_column(Text)
    key: Mapped[str] = mapped_column(String(256), index=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    set_at: Mapped[datetime] = mapped_column(UTCDateTime)
    host: Mapped[str] = mapped_column(String(256))
    user: Mapped[str] = mapped_column(String(256))
    source: Mapped[str] = mapped_column(Text)
    release: Mapped[str | None] = mapped_column(String(256), nullable=True)
    commit: Mapped[str | None] = mapped_column(String(256), nullable=True)


class ReleaseRow(Base):
    """One set a label pointed to; the label's current set is its highest id."""

    __tablename__ = "releases"
    __table_args__ = (SqlIndex("ix_releases_label", "label", "id"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    label: Mapped[str] = mapped_column(String(256))
    previous: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    host: Mapped[str] = mapped_column(String(256))
    user: Mapped[str] = mapped_column(String(256))
    source: Mapped[str] = mapped_column(Text)
    commit: Mapped[str | None] = mapped_column(String(256), nullable=True)
    run: Mapped[str | None] = mapped_column(String(256), nullable=True)  # shards of one run share a set


class ReleaseMemberRow(Base):
    __tablename__ = "release_members"
    __table_args__ = (SqlIndex("ix_release_members_key", "key"),)

    release_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("releases.id"), primary_key=True)
    env_fp: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(512), primary_key=True)
    signature_digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    signature: Mapped[str] = mapped_column(Text)
    key: Mapped[str] = mapped_column(String(256))


class CacheMetaRow(Base):
    """How the cache describes itself (:class:`aot.cache.index.refs.CacheDescription`)."""

    __tablename__ = "cache_meta"
    __table_args__ = (CheckConstraint("id = 1", name="ck_cache_meta_single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    blob_location: Mapped[str | None] = mapped_column(Text, nullable=True)
    compression: Mapped[str] = mapped_column(String(64))
    format_version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class JitEntryRow(Base):
    """An entry of JAX's persistent compilation cache (KIND ``jit``): JAX's key, the
    jitted function's name, the blob of JAX's zstd payload (:mod:`aot.cache.index.jit`)."""

    __tablename__ = "jit_entries"

    key: Mapped[str] = mapped_column(String(1024), primary_key=True)
    name: Mapped[str] = mapped_column(String(512), index=True)
    digest: Mapped[str] = mapped_column(String(64), index=True)
    size: Mapped[int] = mapped_column(BigInteger)
    stored_size: Mapped[int] = mapped_column(BigInteger)
    compile_seconds: Mapped[float] = mapped_column(Float)
    platform: Mapped[str] = mapped_column(String(64))
    signature: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_used_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    hits: Mapped[int] = mapped_column(BigInteger, default=0)


class JitClaimRow(Base):
    """A process compiling a jit key that others missed too (compile once per fleet):
    who holds it, until when (the database server's clock)."""

    __tablename__ = "jit_claims"

    key: Mapped[str] = mapped_column(String(1024), primary_key=True)
    holder: Mapped[str] = mapped_column(String(256))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class JitStatsRow(Base):
    """Hits and misses of JAX's persistent cache through jax-aot, per function name."""

    __tablename__ = "jit_stats"

    name: Mapped[str] = mapped_column(String(512), primary_key=True)
    hits: Mapped[int] = mapped_column(BigInteger, default=0)
    misses: Mapped[int] = mapped_column(BigInteger, default=0)
    saved_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


#: The tables, for Core statements (the models' ``__table__``).
ARTIFACTS: sa.Table = ArtifactRow.__table__  # type: ignore[assignment]
PROGRAMS: sa.Table = ProgramRow.__table__  # type: ignore[assignment]
BLOBS: sa.Table = BlobRefRow.__table__  # type: ignore[assignment]
SCHEMA_VERSIONS: sa.Table = SchemaVersionRow.__table__  # type: ignore[assignment]
LEASES: sa.Table = BlobLeaseRow.__table__  # type: ignore[assignment]
CALL_STATS: sa.Table = CallStatsRow.__table__  # type: ignore[assignment]
INDEX_STATE: sa.Table = IndexStateRow.__table__  # type: ignore[assignment]
REFS: sa.Table = RefRow.__table__  # type: ignore[assignment]
REF_HISTORY: sa.Table = RefHistoryRow.__table__  # type: ignore[assignment]
RELEASES: sa.Table = ReleaseRow.__table__  # type: ignore[assignment]
RELEASE_MEMBERS: sa.Table = ReleaseMemberRow.__table__  # type: ignore[assignment]
CACHE_META: sa.Table = CacheMetaRow.__table__  # type: ignore[assignment]
JIT_ENTRIES: sa.Table = JitEntryRow.__table__  # type: ignore[assignment]
JIT_STATS: sa.Table = JitStatsRow.__table__  # type: ignore[assignment]
JIT_CLAIMS: sa.Table = JitClaimRow.__table__  # type: ignore[assignment]


# ------------------------------------------------------------------------ migrations


@dataclass(frozen=True, slots=True)
class Migration:
    """Upgrade a database from ``version - 1`` to ``version`` (runs inside the lock)."""

    version: int
    description: str
    upgrade: Callable[[Connection], None]


def _create_v1(conn: Connection) -> None:
    Base.metadata.create_all(conn, checkfirst=True)


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
    columns = ", ".join(c.name for c in ARTIFACTS.columns)
    conn.execute(sa.text(f"INSERT INTO artifacts__v2 ({columns}) SELECT {columns} FROM artifacts"))
    conn.execute(sa.text("DROP TABLE artifacts"))
    conn.execute(sa.text("ALTER TABLE artifacts__v2 RENAME TO artifacts"))
    for index in ARTIFACTS.indexes:
        index.create(conn)


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


#: Ordered migrations; ``MIGRATIONS[-1].version == SCHEMA_VERSION``. A fresh
#: database is created from the models at the current version; migration 1 exists
#: so that the list is complete and every version has a description.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema: programs, artifacts, blobs, blobs_data", _create_v1),
    Migration(2, "artifacts.exe_digest may be NULL (symbolic entries)", _migrate_exe_digest_nullable),
    Migration(3, "blob leases, and indexes on blob digests (gc safety)", _migrate_add_blob_leases),
    Migration(4, "call statistics per environment, name and signature", _migrate_add_call_stats),
    Migration(5, "index_state: an index emptied by its own deletions", _migrate_add_index_state),
    Migration(6, "refs, ref history, releases and cache_meta: what is served is declared", _migrate_add_refs),
    Migration(7, "jit_entries and jit_stats: JAX's persistent cache through jax-aot", _migrate_add_jit),
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


class OutdatedSchemaError(CacheError):
    """A read-only open found an index of an older schema, which only a writer migrates."""


def ensure_schema(engine: Engine, *, read_only: bool = False) -> int:
    """Create or migrate the schema of ``engine``'s database; return its version.

    Safe to call concurrently from many processes (see the module docstring).
    Read-only callers never write: they get a :class:`CacheError` if the database
    is missing its schema or needs a migration.
    """
    target = SCHEMA_VERSION
    migrations = MIGRATIONS
    url = mask_url(engine.url)
    with engine.connect() as conn:
        with conn.begin():
            found = read_version(conn)
        if found == target:
            return found
        if found > target:
            raise _too_new(url, found, target)
        if read_only:
            if found == 0:
                raise CacheError(
                    f"no jax-aot cache index at {url} (opened read-only, so it was not "
                    f"created); open it once without read_only or check the location"
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
                Base.metadata.create_all(conn, checkfirst=True)
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
