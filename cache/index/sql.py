"""The SQL index of the artifact cache: SQLAlchemy 2.0 typed models and :class:`Index`.

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
  (``_migrate_add_index_state``).

Transactions are short, one per method call. On SQLite the pysqlite driver's own
transaction handling is switched off and transactions are begun explicitly:
``BEGIN IMMEDIATE`` for writes (so a writer waits on ``busy_timeout`` instead of
failing on a read-to-write lock upgrade) and ``BEGIN`` for reads; WAL mode lets
readers proceed while one process writes.
"""

from __future__ import annotations

import fnmatch
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields
from datetime import datetime, timedelta, timezone
from pathlib import Path
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
    event,
)
from sqlalchemy import Index as SqlIndex
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Dialect, Engine, make_url
from sqlalchemy.engine.url import URL
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.pool import StaticPool

from aot.cache.index.entry import ARTIFACT_STATES, INDEX_FILE, SCHEMA_VERSION, IndexEntry, _as_utc, utcnow
from aot.cache.index.leases import Lease, LeaseLostError
from aot.cache.pauses import reached
from aot.errors import AotError, CacheError, ReadOnlyCacheError

logger = logging.getLogger(__name__)

__all__ = [
    "SCHEMA_VERSION",
    "MIGRATIONS",
    "ARTIFACT_STATES",
    "Migration",
    "IndexEntry",
    "BlobRow",
    "DeletionBatch",
    "Index",
    "Lease",
    "LeaseLostError",
    "LEASE_SECONDS",
    "ensure_schema",
    "mask_url",
    "utcnow",
]

#: SQLite waits this long for a lock held by another writer before failing.
SQLITE_BUSY_TIMEOUT_MS = 30_000

#: Arbitrary constant key of the PostgreSQL advisory lock taken while migrating.
_PG_MIGRATION_LOCK_KEY = 0x6A61785F616F7431  # "jax_aot1"

#: Rows per statement when deleting by a list of keys (SQLite variable limits).
_CHUNK = 500

#: How long a writer's lease on its blobs lasts (database server's clock). A writer
#: that outlives its lease finds out when it commits and starts over; a killed
#: writer's leases pin its blobs for at most this long.
LEASE_SECONDS = 3600.0

#: PostgreSQL: taken by gc's deletion transaction; conflicts with the ROW EXCLUSIVE
#: lock every INSERT/DELETE on blob_leases takes, and with itself.
_PG_DELETION_LOCK = "LOCK TABLE blob_leases IN SHARE ROW EXCLUSIVE MODE"


def mask_url(url: str | URL) -> str:
    """``url`` with any password replaced by ``***`` (for messages and logs)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL has no password we can find
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", str(url))


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
        value = _as_utc(value, "a timestamp stored in the index")
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
    """One row: ``emptied_at`` is set when a deletion through :class:`Index` left the
    index without any artifact or program row, and cleared by the next row added.
    An empty index without it was never emptied by us: lost, truncated or replaced."""

    __tablename__ = "index_state"
    __table_args__ = (CheckConstraint("id = 1", name="ck_index_state_single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    emptied_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


_ART = ArtifactRow.__table__
_PROG = ProgramRow.__table__
_BLOB = BlobRefRow.__table__
_VER = SchemaVersionRow.__table__
_LEASE = BlobLeaseRow.__table__
_STATS = CallStatsRow.__table__
_STATE = IndexStateRow.__table__


# --------------------------------------------------------------------- value objects


@dataclass(frozen=True, slots=True)
class BlobRow:
    """One row of the blob reference table."""

    digest: str
    size: int
    stored_size: int
    created_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "size": self.size,
            "stored_size": self.stored_size,
            "created_at": self.created_at.isoformat(),
        }


_ENTRY_COLUMNS = tuple(_ART.c[f.name] for f in fields(IndexEntry))


def _entry(row: sa.Row[Any]) -> IndexEntry:
    return IndexEntry(*row)  # _ENTRY_COLUMNS are in field order


# The lookups on every load, built once: a statement built per call costs SQLAlchemy
# its construction and cache-key walk each time.
_GET = sa.select(*_ENTRY_COLUMNS).where(_ART.c.key == sa.bindparam("key"))


def _by_name_query(with_env: bool, with_state: bool) -> sa.Select[Any]:
    q = sa.select(*_ENTRY_COLUMNS).where(_ART.c.name == sa.bindparam("name"))
    if with_env:
        q = q.where(_ART.c.env_fp == sa.bindparam("env_fp"))
    if with_state:
        q = q.where(_ART.c.state == sa.bindparam("state"))
    return q.order_by(_ART.c.created_at, _ART.c.key)


_BY_NAME = {(env, state): _by_name_query(env, state) for env in (False, True) for state in (False, True)}


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
    _PROG.to_metadata(metadata)  # the foreign key's target, for the DDL
    staging = _ART.to_metadata(metadata, name="artifacts__v2")
    conn.execute(sa.schema.CreateTable(staging))
    columns = ", ".join(c.name for c in _ART.columns)
    conn.execute(sa.text(f"INSERT INTO artifacts__v2 ({columns}) SELECT {columns} FROM artifacts"))
    conn.execute(sa.text("DROP TABLE artifacts"))
    conn.execute(sa.text("ALTER TABLE artifacts__v2 RENAME TO artifacts"))
    for index in _ART.indexes:
        index.create(conn)


def _migrate_add_blob_leases(conn: Connection) -> None:
    _LEASE.create(conn, checkfirst=True)
    for table in (_ART, _PROG):
        for index in table.indexes:
            if index.name in ("ix_artifacts_exe_digest", "ix_artifacts_hlo_digest", "ix_programs_hlo_digest"):
                index.create(conn, checkfirst=True)


def _migrate_add_call_stats(conn: Connection) -> None:
    _STATS.create(conn, checkfirst=True)


def _migrate_add_index_state(conn: Connection) -> None:
    _STATE.create(conn, checkfirst=True)


#: Ordered migrations; ``MIGRATIONS[-1].version == SCHEMA_VERSION``. A fresh
#: database is created from the models at the current version; migration 1 exists
#: so that the list is complete and every version has a description.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema: programs, artifacts, blobs, blobs_data", _create_v1),
    Migration(2, "artifacts.exe_digest may be NULL (symbolic entries)", _migrate_exe_digest_nullable),
    Migration(3, "blob leases, and indexes on blob digests (gc safety)", _migrate_add_blob_leases),
    Migration(4, "call statistics per environment, name and signature", _migrate_add_call_stats),
    Migration(5, "index_state: an index emptied by its own deletions", _migrate_add_index_state),
)


def _jax_aot_version() -> str:
    try:
        from importlib.metadata import version

        return version("jax-aot")
    except Exception:  # noqa: BLE001 - only used in messages
        return "unknown"


def _read_version(conn: Connection) -> int:
    if not sa.inspect(conn).has_table(_VER.name):
        return 0
    value = conn.execute(sa.select(_VER.c.version).where(_VER.c.id == 1)).scalar_one_or_none()
    return int(value) if value is not None else 0


def _too_new(url: str, found: int, supported: int) -> CacheError:
    return CacheError(
        f"the cache index at {url} has schema version {found}, but this jax-aot "
        f"({_jax_aot_version()}) understands schema versions up to {supported}; "
        f"upgrade jax-aot to use this cache (or use another cache location)"
    )


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
            found = _read_version(conn)
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
            raise CacheError(
                f"the cache index at {url} has schema version {found} and this jax-aot "
                f"needs {target}; it was opened read-only so it was not migrated: open "
                f"it once read-write (any jax-aot command that writes) to upgrade it"
            )
        conn.execution_options(aot_write=True)
        with conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK_KEY})
            found = _read_version(conn)  # again, under the lock
            if found > target:
                raise _too_new(url, found, target)
            if found == 0:
                logger.info("creating the cache index schema v%d at %s", target, url)
                Base.metadata.create_all(conn, checkfirst=True)
                conn.execute(sa.insert(_VER).values(id=1, version=target, updated_at=utcnow()))
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
                                f"{_reason(e)}; nothing was changed, the database is still "
                                f"at version {found}"
                            ) from e
                conn.execute(
                    sa.update(_VER).where(_VER.c.id == 1).values(version=target, updated_at=utcnow())
                )
            return target


# -------------------------------------------------------------------------- engines


def _sqlite_engine(url: URL, read_only: bool) -> Engine:
    database = url.database
    if not database or database == ":memory:":
        engine = sa.create_engine(
            url, poolclass=StaticPool, connect_args={"check_same_thread": False}
        )
    else:
        if database.startswith("file:"):
            raise CacheError(f"SQLite URI filenames are not supported as index URL: {url}")
        path = Path(database).expanduser()
        if read_only:
            if not path.is_file():
                raise CacheError(
                    f"no jax-aot cache index at {path} (opened read-only, so it was not "
                    f"created); check the cache location"
                )
            engine = _read_only_sqlite_engine(url, path)
        else:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise CacheError(
                    f"cannot create the folder of the cache index {path}: {e.strerror or e}; "
                    f"choose a writable cache location (AOT_CACHE)"
                ) from e
            engine = sa.create_engine(url, connect_args={"check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below emit BEGIN instead of pysqlite.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA foreign_keys = ON")
            if not read_only:
                _enable_wal(cur)
                cur.execute("PRAGMA synchronous = NORMAL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get("aot_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def _enable_wal(cur: Any) -> None:
    """Switches a SQLite database to WAL. Connections opening a new database at once
    all try the switch, and SQLite answers "database is locked" at once to the losers
    (the busy handler does not cover it): retry until the busy timeout."""
    import sqlite3

    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    delay = 0.005
    while True:
        try:
            if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def _read_only_sqlite_engine(url: URL, path: Path) -> Engine:
    """An engine that never creates -wal/-shm files nor takes a write lock: each
    connection is opened as :func:`aot.cache.index.reader.read_only_open` decides
    (``immutable=1`` on a WAL database no writer has open), and an immutable one is
    replaced at checkout once a writer has opened the database."""
    import sqlite3

    from aot.cache.index.reader import read_only_open, stale_immutable

    opens: dict[int, Any] = {}

    def creator() -> sqlite3.Connection:
        how = read_only_open(path)
        conn = sqlite3.connect(how.uri, uri=True, check_same_thread=False)
        opens[id(conn)] = how
        return conn

    engine = sa.create_engine(url, creator=creator)

    @event.listens_for(engine, "connect")
    def _remember(dbapi_conn: Any, record: Any) -> None:
        record.info["aot_open"] = opens.pop(id(dbapi_conn), None)

    @event.listens_for(engine, "checkout")
    def _still_fits(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        how = record.info.get("aot_open")
        if how is not None and stale_immutable(path, how):
            raise sa_exc.DisconnectionError("a writer opened the database: reopen it")

    return engine


def _make_engine(url: str | URL, read_only: bool) -> Engine:
    try:
        parsed = make_url(url)
    except sa_exc.ArgumentError as e:
        raise CacheError(
            f"cannot parse the cache index URL {mask_url(url)!r}: {e}; expected e.g. "
            f"sqlite:///path/index.sqlite or postgresql+psycopg://user@host/db"
        ) from e
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed, read_only)
    if backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        connect_args: dict[str, Any] = {"connect_timeout": 10}
        if read_only:  # the server refuses writes too, whatever a code path tries
            connect_args["options"] = "-c default_transaction_read_only=on"
        try:
            engine = sa.create_engine(parsed, connect_args=connect_args)
        except ModuleNotFoundError as e:
            raise CacheError(
                f"the PostgreSQL driver for {mask_url(parsed)} is not installed ({e}); "
                f"install it with: pip install 'jax-aot[postgres]'"
            ) from e
        _ping_when_idle(engine)
        return engine
    raise CacheError(
        f"unsupported cache index database {backend!r} in {mask_url(url)}: jax-aot "
        f"supports SQLite (sqlite:///...) and PostgreSQL (postgresql+psycopg://...)"
    )


#: A pooled PostgreSQL connection idle longer than this is pinged at checkout (one
#: more round trip); one used more recently is taken as alive (HikariCP's
#: ``aliveBypassWindowMs`` is the same idea, at 0.5 s).
PING_AFTER_IDLE_S = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """SQLAlchemy's ``pool_pre_ping`` pings at every checkout: a round trip on every
    lookup (a third of a ``get`` on loopback). Only a connection that sat idle in the
    pool, which the server or a proxy may have closed meanwhile, is pinged; a dead one
    is replaced before the caller sees it (the pool retries the checkout)."""

    @event.listens_for(engine, "checkin")
    def _idle_from(dbapi_conn: Any, record: Any) -> None:
        record.info["aot_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _alive(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("aot_idle_since")
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return  # just connected, or just used
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as e:  # noqa: BLE001 - any failure: reconnect
            raise sa_exc.DisconnectionError(f"a pooled connection is gone: {e}") from e


def _reason(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _advice(reason: str, read_only: bool = False) -> str:
    """What to do about the database errors a user can fix."""
    text = reason.lower()
    if "malformed" in text or "not a database" in text or "database corrupt" in text:
        return (
            "; the index file is damaged (truncated or overwritten). Restore it from a "
            "backup, or move it aside and rebuild the index: `aot bundle import` a bundle "
            "of the entries, or `aot warmup` again (stored blobs are reused, and `aot gc` "
            "refuses to delete them while the index is empty)"
        )
    if "disk is full" in text or "no space left" in text or "quota" in text:
        return "; free disk space (e.g. `aot gc --max-size ...`) or move the cache (AOT_CACHE)"
    readonly = "readonly database" in text or "read-only" in text
    if read_only and (readonly or "unable to open database file" in text):
        # Opened read-only already: never advise the option that is set.
        return (
            "; the index cannot be read here: check that this user may read the cache "
            "folder and index.sqlite (and, while a writer has it open, index.sqlite-wal "
            "and index.sqlite-shm)"
        )
    if readonly or "unable to open database file" in text:
        return (
            "; the index cannot be written here: fix the permissions of the cache folder, "
            "or serve it read-only (read_only=True, `aot --read-only`), which needs read "
            "access only"
        )
    return ""


def _insert_ignore(conn: Connection, table: sa.Table) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING for the connection's dialect."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table)


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def glob_to_like(pattern: str) -> str:
    """Translate an fnmatch glob into a LIKE pattern (escape character ``\\``).

    ``*`` -> ``%``, ``?`` -> ``_``, a bracket class -> ``_`` (callers post-filter
    with :func:`fnmatch.fnmatchcase`), literal ``%``/``_``/``\\`` are escaped. Every
    name fnmatch matches, LIKE matches (a superset): a class is found exactly as
    :func:`fnmatch.translate` finds it (``]`` right after ``[`` or ``[!`` is a
    member, a ``[`` without a closing ``]`` is a literal), and each class and each
    ``?`` stands for exactly one character, as ``_`` does.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        i += 1
        if ch == "*":
            out.append("%")
        elif ch == "?":
            out.append("_")
        elif ch == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append(_like_escape(ch))  # no closing bracket: a literal "["
            else:
                out.append("_")
                i = j + 1
        else:
            out.append(_like_escape(ch))
    return "".join(out)


# --------------------------------------------------------------- the server's clock


def _server_now_expr(dialect: str) -> Any:
    """The database server's current UTC time as an SQL expression (SQLite is in
    process: its clock is this host's)."""
    if dialect == "sqlite":
        # SQLAlchemy's own SQLite text format (microseconds), so values compare as text
        return sa.type_coerce(sa.func.strftime("%Y-%m-%d %H:%M:%f000", "now"), UTCDateTime)
    return sa.type_coerce(sa.func.now(), UTCDateTime)


def server_now(conn: Connection) -> datetime:
    """The database server's clock (PostgreSQL ``now()``: this transaction's start)."""
    value = conn.execute(sa.select(_server_now_expr(conn.dialect.name))).scalar_one()
    return _as_utc(value, "the database clock")


# A SQL blob store that lives in the index's database joins gc's deletion
# transaction (SQLite allows one writer at a time: a second connection would wait
# on the lock gc holds; PostgreSQL then deletes blobs atomically with the checks).
_JOINED: ContextVar[tuple[Engine, Connection] | None] = ContextVar("aot_joined_connection", default=None)


@contextmanager
def connection_for(engine: Engine, *, write: bool) -> Iterator[Connection]:
    """A connection in a transaction on ``engine``: the enclosing deletion lock's if
    one is open on this engine (then its transaction decides), else a new one."""
    joined = _JOINED.get()
    if joined is not None and joined[0] is engine:
        yield joined[1]
        return
    with engine.connect() as conn:
        if write:
            conn.execution_options(aot_write=True)
        with conn.begin():
            yield conn


# ------------------------------------------------------------------------- leases


def _no_rows(conn: Connection) -> bool:
    return all(
        conn.execute(sa.select(sa.literal(1)).select_from(t).limit(1)).first() is None for t in (_ART, _PROG)
    )


def _mark_emptied(conn: Connection) -> None:
    """Records, in the deleting transaction, that this deletion emptied the index."""
    now = server_now(conn)
    upsert = _insert_ignore(conn, _STATE).values(id=1, emptied_at=now)
    conn.execute(upsert.on_conflict_do_update(index_elements=[_STATE.c.id], set_={"emptied_at": now}))


def _clear_emptied(conn: Connection) -> None:
    """A row was added: an empty index from now on would not be one we emptied."""
    conn.execute(sa.update(_STATE).where(_STATE.c.id == 1, _STATE.c.emptied_at.is_not(None)).values(emptied_at=None))


class DeletionBatch:
    """gc's view inside :meth:`Index.deletion_lock` (one transaction, under the lock)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.now = server_now(conn)

    def deletable(self, digests: Iterable[str]) -> list[str]:
        """The digests no artifact or program row references and no live lease holds.

        Expired leases on them are deleted, so that their writers, if still alive,
        find out when they commit (:class:`LeaseLostError`) and start over.
        """
        wanted = sorted(set(digests))
        if not wanted:
            return []
        conn = self._conn
        protected: set[str] = set()
        expired: set[str] = set()
        for i in range(0, len(wanted), _CHUNK):
            chunk = wanted[i : i + _CHUNK]
            protected.update(
                conn.execute(
                    sa.union(
                        sa.select(_ART.c.exe_digest).where(_ART.c.exe_digest.in_(chunk)),
                        sa.select(_ART.c.hlo_digest).where(_ART.c.hlo_digest.in_(chunk)),
                        sa.select(_PROG.c.hlo_digest).where(_PROG.c.hlo_digest.in_(chunk)),
                    )
                ).scalars()
            )
            for digest, expires_at in conn.execute(
                sa.select(_LEASE.c.digest, _LEASE.c.expires_at).where(_LEASE.c.digest.in_(chunk))
            ):
                if expires_at > self.now:
                    protected.add(digest)
                else:
                    expired.add(digest)
        doomed = [d for d in wanted if d not in protected]
        stale = sorted(expired - protected)
        for i in range(0, len(stale), _CHUNK):
            conn.execute(
                sa.delete(_LEASE).where(
                    _LEASE.c.digest.in_(stale[i : i + _CHUNK]), _LEASE.c.expires_at <= self.now
                )
            )
        return doomed

    def forget(self, digests: Iterable[str]) -> None:
        """Deletes the blob reference rows of ``digests`` (their blobs are gone)."""
        gone = sorted(set(digests))
        for i in range(0, len(gone), _CHUNK):
            self._conn.execute(sa.delete(_BLOB).where(_BLOB.c.digest.in_(gone[i : i + _CHUNK])))

    def drop_expired_leases(self) -> int:
        """Deletes every expired lease (left by killed writers); how many."""
        return int(self._conn.execute(sa.delete(_LEASE).where(_LEASE.c.expires_at <= self.now)).rowcount or 0)


# ----------------------------------------------------------------------------- Index


class Index:
    """The SQL index of a cache: SQLite (default) or PostgreSQL (shared)."""

    def __init__(self, url: str | URL, *, read_only: bool = False) -> None:
        self.read_only = read_only
        self.url = mask_url(url)
        self._engine = _make_engine(url, read_only)
        try:
            self._version = ensure_schema(self._engine, read_only=read_only)
        except AotError:
            self._engine.dispose()
            raise
        except (sa_exc.SQLAlchemyError, OSError) as e:
            self._engine.dispose()
            reason = _reason(e)
            raise CacheError(
                f"cannot open the cache index at {self.url}: {reason}"
                + (_advice(reason, read_only) or "; check that the database is reachable and that "
                   "the URL, user and password are right")
            ) from e
        self._autocommit_reads = self._engine.dialect.name == "postgresql"
        logger.debug("opened cache index %s (schema v%d, read_only=%s)", self.url, self._version, read_only)

    @classmethod
    def for_folder(cls, path: str | Path, *, read_only: bool = False) -> Index:
        """The SQLite index of a folder cache: ``path/index.sqlite``."""
        db = Path(path).expanduser() / INDEX_FILE
        return cls(URL.create("sqlite", database=str(db)), read_only=read_only)

    # -- plumbing -----------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (shared with :class:`~aot.cache.storage.database.SqlObjectStore`)."""
        return self._engine

    @property
    def dialect(self) -> str:
        return self._engine.dialect.name

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Index({self.url!r}, read_only={self.read_only})"

    def _fail(self, what: str, e: BaseException) -> CacheError:
        reason = _reason(e)
        return CacheError(
            f"{what} failed on the cache index at {self.url}: {reason}{_advice(reason, self.read_only)}"
        )

    @contextmanager
    def _read(self, what: str) -> Iterator[Connection]:
        """A connection for reads. On PostgreSQL it autocommits: every read here is one
        statement, which is atomic alone, and BEGIN and COMMIT would be two more round
        trips. (SQLite keeps its BEGIN: a local call, and the read-only engine's
        reopen logic runs there.)"""
        try:
            with self._engine.connect() as conn:
                if self._autocommit_reads:
                    conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                with conn.begin():
                    yield conn
        except sa_exc.SQLAlchemyError as e:
            raise self._fail(what, e) from e

    @contextmanager
    def _write(self, what: str) -> Iterator[Connection]:
        if self.read_only:
            raise ReadOnlyCacheError(
                f"cannot {what}: the cache index at {self.url} was opened read-only; "
                f"open the cache without read_only=True to modify it"
            )
        try:
            with self._engine.connect() as conn:
                conn.execution_options(aot_write=True)
                with conn.begin():
                    yield conn
        except sa_exc.SQLAlchemyError as e:
            raise self._fail(what, e) from e

    def schema_version(self) -> int:
        """The schema version recorded in the database."""
        with self._read("read the schema version") as conn:
            return _read_version(conn)

    def now(self) -> datetime:
        """The database server's clock: every time compared across machines is on it."""
        with self._read("read the database clock") as conn:
            return server_now(conn)

    def is_empty(self) -> bool:
        """No artifact and no program row (a new, lost or emptied index)."""
        with self._read("count rows") as conn:
            for table in (_ART, _PROG):
                if conn.execute(sa.select(sa.literal(1)).select_from(table).limit(1)).first() is not None:
                    return False
        return True

    def emptiness(self) -> tuple[bool, datetime | None]:
        """Whether the index has no artifact or program row and, if so, when a deletion
        of its own (gc's eviction, ``aot rm``) left it so (None: never emptied that way,
        or a row was added since: new, lost, truncated or replaced). One statement, so
        both answers come from one snapshot even while writers and gc run."""
        empty = sa.and_(
            ~sa.select(sa.literal(1)).select_from(_ART).exists(),
            ~sa.select(sa.literal(1)).select_from(_PROG).exists(),
        )
        marked = sa.select(_STATE.c.emptied_at).where(_STATE.c.id == 1).scalar_subquery()
        with self._read("read the index state") as conn:
            row = conn.execute(sa.select(empty.label("empty"), marked.label("emptied_at"))).one()
        is_empty = bool(row.empty)
        return is_empty, (row.emptied_at if is_empty else None)

    def emptied_at(self) -> datetime | None:
        """:meth:`emptiness`'s time: when the index's own deletion left it empty."""
        return self.emptiness()[1]

    # -- leases (see docs/reliability.md, "gc and writers") ------------------------

    def lease(self, digests: Iterable[str], *, seconds: float | None = None) -> Lease:
        """Claims ``digests`` for a row about to be written: gc deletes none of them
        until the lease is released (by :meth:`add` or :meth:`release`) or expires
        (``seconds`` on the database server's clock). Take it *before* checking or
        writing the blobs; it serializes with gc's deletion lock."""
        wanted = frozenset(digests)
        token = secrets.token_hex(16)
        with self._write("lease blobs") as conn:
            expires_at = server_now(conn) + timedelta(seconds=LEASE_SECONDS if seconds is None else seconds)
            if wanted:
                conn.execute(
                    sa.insert(_LEASE),
                    [{"token": token, "digest": d, "expires_at": expires_at} for d in sorted(wanted)],
                )
        return Lease(token, wanted, expires_at)

    def release(self, lease: Lease) -> None:
        """Gives a lease up (a writer that failed). Never raises: an unreleased lease
        only pins its blobs until it expires."""
        if not lease.digests:
            return
        try:
            with self._write("release a lease") as conn:
                conn.execute(sa.delete(_LEASE).where(_LEASE.c.token == lease.token))
        except AotError as e:
            logger.warning("index: could not release lease %s: %s", lease.token[:8], e)

    def leased_digests(self) -> set[str]:
        """Digests under a live lease (writes in progress)."""
        with self._read("list leases") as conn:
            now = server_now(conn)
            return set(conn.execute(sa.select(_LEASE.c.digest).where(_LEASE.c.expires_at > now)).scalars())

    @contextmanager
    def deletion_lock(self) -> Iterator[DeletionBatch]:
        """gc's deletion step: one transaction under the lock every lease and every
        lease release waits for (SQLite: ``BEGIN IMMEDIATE``, the database's write
        lock; PostgreSQL: ``SHARE ROW EXCLUSIVE`` on blob_leases). Delete the blobs
        :meth:`DeletionBatch.deletable` returns *inside* the block; a SQL blob store on
        this engine joins the transaction."""
        with self._write("delete blobs") as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(_PG_DELETION_LOCK)
            token = _JOINED.set((self._engine, conn))
            try:
                yield DeletionBatch(conn)
            finally:
                _JOINED.reset(token)

    # -- writes -------------------------------------------------------------------

    def add(
        self, entry: IndexEntry, *, blob_sizes: Mapping[str, tuple[int, int]],
        lease: Lease | None = None, stamp: bool = False, replace: bool = False,
    ) -> bool:
        """Record an artifact: blob rows, its program row and its artifact row, atomically.

        ``blob_sizes`` maps each digest the entry uses to ``(size, stored_size)``;
        call this only after the blobs are durable in the blob store. Returns True
        if the row was inserted, False if an artifact with this key already exists
        (concurrent adders of one key all succeed; one row is kept). A
        ``quarantined`` row with the same key is replaced (healing) -> True; with
        ``replace`` any row of the key is (a row whose blobs were found damaged).

        ``lease``: released in the same transaction; if gc took it (it expired),
        nothing is written and :class:`LeaseLostError` is raised. ``stamp``: the
        row's times come from the database server's clock, not the entry.
        """
        row = entry._row()
        with self._write(f"add artifact {entry.key}") as conn:
            if lease is not None and lease.digests:
                # First statement: on PostgreSQL it waits for gc's deletion lock.
                kept = set(
                    conn.execute(
                        sa.delete(_LEASE).where(_LEASE.c.token == lease.token).returning(_LEASE.c.digest)
                    ).scalars()
                )
                if kept != lease.digests:
                    raise LeaseLostError(
                        f"the lease on the blobs of {entry.name!r} ({entry.key[:12]}) expired "
                        f"and gc may have taken them; store it again"
                    )
            if stamp:
                now = server_now(conn)
                row["created_at"] = row["last_used_at"] = now
            else:
                now = entry.created_at
            if blob_sizes:
                conn.execute(
                    _insert_ignore(conn, _BLOB).on_conflict_do_nothing(),
                    [
                        {"digest": d, "size": int(s), "stored_size": int(st), "created_at": now}
                        for d, (s, st) in sorted(blob_sizes.items())
                    ],
                )
            prog = _insert_ignore(conn, _PROG).values(
                program_fp=entry.program_fp,
                name=entry.name,
                signature=entry.signature,
                hlo_digest=entry.hlo_digest,
                created_at=now,
            )
            conn.execute(
                prog.on_conflict_do_update(
                    index_elements=[_PROG.c.program_fp],
                    set_={"hlo_digest": sa.func.coalesce(_PROG.c.hlo_digest, prog.excluded.hlo_digest)},
                )
            )
            # RETURNING, not rowcount: INSERT rowcount is unreliable across drivers.
            inserted = conn.execute(
                _insert_ignore(conn, _ART)
                .values(**row)
                .on_conflict_do_nothing()
                .returning(_ART.c.key)
            ).scalar_one_or_none()
            if inserted is not None:
                _clear_emptied(conn)
                reached("put.before_commit")
                logger.debug("index: added %s (%s)", entry.key, entry.name)
                return True
            state = conn.execute(
                sa.select(_ART.c.state).where(_ART.c.key == entry.key)
            ).scalar_one_or_none()
            if state == "quarantined" or (replace and state is not None):
                conn.execute(sa.update(_ART).where(_ART.c.key == entry.key).values(**row))
                reached("put.before_commit")
                logger.info("index: replaced %s artifact %s (%s)", state, entry.key, entry.name)
                return True
            reached("put.before_commit")
            logger.debug("index: %s already present", entry.key)
            return False

    def touch(self, key: str, *, when: datetime | None = None) -> None:
        """Record a use: ``last_used_at = when`` or the server's now, ``hits += 1``.

        Never fails a load: on a read-only index it does nothing, and a database
        error is logged, not raised.
        """
        if self.read_only:
            logger.debug("index: not touching %s: read-only", key)
            return
        try:
            with self._write(f"touch {key}") as conn:
                stamp = _as_utc(when, "when") if when is not None else _server_now_expr(conn.dialect.name)
                conn.execute(
                    sa.update(_ART)
                    .where(_ART.c.key == key)
                    .values(last_used_at=stamp, hits=_ART.c.hits + 1)
                )
        except CacheError as e:
            logger.warning("index: could not record the use of %s: %s", key, e)

    def quarantine(self, key: str, reason: str, *, expect: IndexEntry | None = None) -> bool:
        """Mark an artifact unusable (bad digest, undeserializable ...). True if it exists.

        With ``expect`` (the row as the caller read it), only while the row still names
        the same blobs and manifest: a reader holding an old snapshot must not condemn
        a row rewritten since (compare-and-set; False when the row changed).
        """
        q = sa.update(_ART).where(_ART.c.key == key)
        if expect is not None:
            q = q.where(
                _ART.c.exe_digest == expect.exe_digest,
                _ART.c.hlo_digest.is_(None) if expect.hlo_digest is None
                else _ART.c.hlo_digest == expect.hlo_digest,
                _ART.c.manifest == expect.manifest,
            )
        with self._write(f"quarantine {key}") as conn:
            n = conn.execute(q.values(state="quarantined", state_reason=reason)).rowcount
        if n:
            logger.warning("index: quarantined %s: %s", key, reason)
        return bool(n)

    def delete(self, keys: Iterable[str], *, keep_programs: bool = False) -> int:
        """Delete artifact rows; return how many existed.

        Programs rows left without any artifact are deleted too (unless
        ``keep_programs``), so their portable-HLO blob becomes unreferenced and
        ``gc`` can free it: deleting every artifact of a program deletes the
        program. Blob rows are not touched (see :meth:`delete_blob_rows`).
        """
        return self._delete(sorted(set(keys)), keep_programs, None)[0]

    def delete_unchanged(self, planned: Mapping[str, tuple[str, datetime]]) -> list[str]:
        """gc's eviction: deletes each row still as planned (key -> state,
        last_used_at); a row used, healed or replaced since the plan is kept. The
        keys deleted."""
        keys = sorted(planned)
        kept = set(self._delete(keys, False, planned)[1])
        return [k for k in keys if k not in kept]

    def _delete(
        self, keys: list[str], keep_programs: bool, unchanged: Mapping[str, tuple[str, datetime]] | None,
    ) -> tuple[int, list[str]]:
        if not keys:
            return 0, []
        deleted = 0
        kept: list[str] = []
        with self._write("delete artifacts") as conn:
            programs: set[str] = set()
            for i in range(0, len(keys), _CHUNK):
                programs.update(
                    conn.execute(
                        sa.select(_ART.c.program_fp).where(_ART.c.key.in_(keys[i : i + _CHUNK])).distinct()
                    ).scalars()
                )
            if conn.dialect.name == "postgresql" and programs:
                # Lock programs rows before artifacts rows, as a writer does (its upsert
                # of the program comes first): the opposite order deadlocks with it, and
                # the NOT EXISTS below then sees a row the writer committed meanwhile.
                progs = sorted(programs)
                for i in range(0, len(progs), _CHUNK):
                    conn.execute(
                        sa.select(_PROG.c.program_fp)
                        .where(_PROG.c.program_fp.in_(progs[i : i + _CHUNK]))
                        .order_by(_PROG.c.program_fp)
                        .with_for_update()
                    ).all()
            if unchanged is None:
                for i in range(0, len(keys), _CHUNK):
                    deleted += conn.execute(sa.delete(_ART).where(_ART.c.key.in_(keys[i : i + _CHUNK]))).rowcount
            else:
                for key in keys:
                    state, last_used_at = unchanged[key]
                    if conn.execute(
                        sa.delete(_ART).where(
                            _ART.c.key == key, _ART.c.state == state, _ART.c.last_used_at == last_used_at
                        )
                    ).rowcount:
                        deleted += 1
                    else:
                        kept.append(key)
            if not keep_programs and programs:
                still_used = sa.select(_ART.c.program_fp).where(_ART.c.program_fp == _PROG.c.program_fp)
                progs = sorted(programs)
                for i in range(0, len(progs), _CHUNK):
                    conn.execute(
                        sa.delete(_PROG).where(
                            _PROG.c.program_fp.in_(progs[i : i + _CHUNK]), ~still_used.exists()
                        )
                    )
            if deleted and _no_rows(conn):
                _mark_emptied(conn)
        logger.debug("index: deleted %d artifact rows", deleted)
        return deleted, kept

    def delete_blob_rows(self, digests: Iterable[str]) -> int:
        """Delete rows of the blob reference table; return how many existed."""
        digests = sorted(set(digests))
        n = 0
        if not digests:
            return 0
        with self._write("delete blob rows") as conn:
            for i in range(0, len(digests), _CHUNK):
                n += conn.execute(
                    sa.delete(_BLOB).where(_BLOB.c.digest.in_(digests[i : i + _CHUNK]))
                ).rowcount
        return n

    # -- reads --------------------------------------------------------------------

    def get(self, key: str) -> IndexEntry | None:
        with self._read(f"get {key}") as conn:
            row = conn.execute(_GET, {"key": key}).first()
        return _entry(row) if row is not None else None

    def by_name(
        self, name: str, env_fp: str | None = None, state: str | None = "ok"
    ) -> list[IndexEntry]:
        """Artifacts stored under ``name`` (for one environment; ``state=None``: any),
        oldest first, in one query."""
        q = _BY_NAME[env_fp is not None, state is not None]
        with self._read(f"look up {name}") as conn:
            rows = conn.execute(q, {"name": name, "env_fp": env_fp, "state": state}).all()
        return [_entry(r) for r in rows]

    def by_program(self, program_fp: str) -> list[IndexEntry]:
        """Every artifact of one program (all environments and states)."""
        q = (
            sa.select(*_ENTRY_COLUMNS)
            .where(_ART.c.program_fp == program_fp)
            .order_by(_ART.c.created_at, _ART.c.key)
        )
        with self._read(f"look up program {program_fp}") as conn:
            return [_entry(r) for r in conn.execute(q).all()]

    def entries(self, name_glob: str | None = None) -> list[IndexEntry]:
        """All artifacts, or those whose name matches an fnmatch glob (case-sensitive)."""
        q = sa.select(*_ENTRY_COLUMNS)
        if name_glob is not None and name_glob != "*":
            q = q.where(_ART.c.name.like(glob_to_like(name_glob), escape="\\"))
        q = q.order_by(_ART.c.name, _ART.c.created_at, _ART.c.key)
        with self._read("list artifacts") as conn:
            out = [_entry(r) for r in conn.execute(q).all()]
        if name_glob is not None and name_glob != "*":
            # LIKE is case-insensitive on SQLite and has no [...] classes.
            out = [e for e in out if fnmatch.fnmatchcase(e.name, name_glob)]
        return out

    def names(self) -> list[str]:
        """Every name with at least one artifact row."""
        with self._read("list names") as conn:
            return sorted(conn.execute(sa.select(_ART.c.name).distinct()).scalars())

    def count(self) -> int:
        with self._read("count artifacts") as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(_ART)).scalar_one())

    def program(self, program_fp: str) -> dict[str, Any] | None:
        """The programs row as a dict (name, signature, hlo_digest, created_at)."""
        with self._read(f"look up program {program_fp}") as conn:
            row = conn.execute(sa.select(_PROG).where(_PROG.c.program_fp == program_fp)).first()
        return dict(row._mapping) if row is not None else None

    def find_key_prefix(self, prefix: str, *, limit: int | None = None) -> list[str]:
        """Keys starting with ``prefix`` (for abbreviated keys on the command line)."""
        q = (
            sa.select(_ART.c.key)
            .where(_ART.c.key.like(_like_escape(prefix) + "%", escape="\\"))
            .order_by(_ART.c.key)
        )
        if limit is not None:
            q = q.limit(limit)
        with self._read("look up a key prefix") as conn:
            keys = list(conn.execute(q).scalars())
        return [k for k in keys if k.startswith(prefix)]  # SQLite LIKE ignores case

    def referenced_digests(self) -> set[str]:
        """Every blob digest that an artifact or program row references."""
        q = sa.union(
            sa.select(_ART.c.exe_digest.label("d")).where(_ART.c.exe_digest.is_not(None)),
            sa.select(_ART.c.hlo_digest.label("d")).where(_ART.c.hlo_digest.is_not(None)),
            sa.select(_PROG.c.hlo_digest.label("d")).where(_PROG.c.hlo_digest.is_not(None)),
        )
        with self._read("list referenced blobs") as conn:
            return {d for d in conn.execute(q).scalars() if d is not None}

    def blob_rows(self) -> list[BlobRow]:
        with self._read("list blob rows") as conn:
            rows = conn.execute(sa.select(_BLOB).order_by(_BLOB.c.digest)).all()
        return [BlobRow(**r._mapping) for r in rows]

    def total_stored_size(self) -> int:
        """Bytes the registered blobs occupy in the blob store (each digest once)."""
        with self._read("sum blob sizes") as conn:
            return int(
                conn.execute(sa.select(sa.func.coalesce(sa.func.sum(_BLOB.c.stored_size), 0))).scalar_one()
            )

    def bulk_insert(self, entries: Sequence[IndexEntry]) -> None:
        """Insert many new artifact (and program) rows at once; for benchmarks and imports.

        Unlike :meth:`add` this does not register blobs nor tolerate existing keys.
        """
        with self._write("bulk insert") as conn:
            progs: dict[str, dict[str, Any]] = {}
            for e in entries:
                progs.setdefault(
                    e.program_fp,
                    {
                        "program_fp": e.program_fp,
                        "name": e.name,
                        "signature": e.signature,
                        "hlo_digest": e.hlo_digest,
                        "created_at": e.created_at,
                    },
                )
            if progs:
                conn.execute(_insert_ignore(conn, _PROG).on_conflict_do_nothing(), list(progs.values()))
            if entries:
                conn.execute(sa.insert(_ART), [e._row() for e in entries])
                _clear_emptied(conn)
