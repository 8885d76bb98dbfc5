"""The engine of the SQL index: creating it, its connections and transactions, and the
database server's clock.

SQLite: pragmas on every connection (busy timeout, foreign keys, WAL and
``synchronous = NORMAL`` when writable); a read-only index is opened so that it is
never written (no -wal/-shm created, no write lock taken). PostgreSQL: psycopg, a
connect and a statement timeout (:mod:`aot.cache.timeouts`), a client-side bound on
every round trip for a server that froze mid-call (:mod:`aot.cache.index.deadlines`),
sessions that refuse writes when read-only, and a ping only for a pooled connection
that sat idle.

Transactions are short, one per method call. On SQLite the pysqlite driver's own
transaction handling is switched off and transactions are begun explicitly:
``BEGIN IMMEDIATE`` for writes (so a writer waits on ``busy_timeout`` instead of
failing on a read-to-write lock upgrade) and ``BEGIN`` for reads; WAL mode lets
readers proceed while one process writes.

Every time compared across machines (leases, blob ages, last use) is the database
server's (:func:`server_now`, :func:`server_now_expr`): client clocks drift.

SQLite has no server: its clock is the clock of each host that opens the file, and a
folder cache on a network file system is shared by hosts whose clocks disagree. So the
SQLite clock of the index is monotonic: ``now`` is the later of this host's clock and
the highest time the index holds (:func:`high_water`: the latest last use of an
entry, the latest ref change), plus a microsecond. A host whose clock is behind stamps
what it writes after what is already there (gc ``--older-than`` does not take its
fresh entries for old ones), and a write is always later than the writes committed
before it. What remains: a host whose clock is ahead drags the mark forward with it,
and every age (``gc --older-than``) then counts from that mark until real time catches
up; a host behind that writes alone into an index whose times are all older than its
clock is not corrected (nothing in the file tells it the real time).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.engine.url import URL
from sqlalchemy.pool import StaticPool

from aot.cache.index.advice import advice_for, mask_url, reason_of
from aot.cache.index.entry import SQLITE_BUSY_TIMEOUT_MS, as_utc, sqlite_clock
from aot.cache.index.schema import ARTIFACTS, NOT_CREATED, REF_HISTORY, UTCDateTime
from aot.cache.index.deadlines import bound_round_trips
from aot.cache.timeouts import DB_CLIENT_GRACE_S, Timeouts, db_client_bound
from aot.cache.timeouts import timeouts as environment_timeouts
from aot.errors import CacheError, ReadOnlyCacheError

logger = logging.getLogger(__name__)

__all__ = [
    "PING_AFTER_IDLE_S",
    "SQLITE_BUSY_TIMEOUT_MS",
    "IndexEngine",
    "connection_for",
    "high_water",
    "index_now_expr",
    "insert_ignore",
    "joined",
    "make_engine",
    "server_now",
    "server_now_expr",
]


# -------------------------------------------------------------------------- engines


def missing_index_file(path: Path) -> str | None:
    """What is found instead of the SQLite index ``path`` (None: a non-empty file)."""
    if path.is_file() and path.stat().st_size > 0:
        return None
    if path.is_file():
        found = "an empty file"
    elif path.exists():
        found = "not a file"
    elif not path.parent.is_dir():
        found = f"no folder {path.parent}"
    else:
        found = "no such file"
    return f"no jax-aot cache index at {path} ({found}); {NOT_CREATED}"


def _sqlite_engine(url: URL, read_only: bool, create: bool = True) -> Engine:
    database = url.database
    if not database or database == ":memory:":
        engine = sa.create_engine(
            url, poolclass=StaticPool, connect_args={"check_same_thread": False}
        )
    else:
        if database.startswith("file:"):
            raise CacheError(f"SQLite URI filenames are not supported as index URL: {url}")
        path = Path(database).expanduser()
        if not create and not read_only:
            missing = missing_index_file(path)
            if missing:
                raise CacheError(missing)
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
    connection is opened as :func:`aot.cache.index.read_only.read_only_open` decides
    (``immutable=1`` on a WAL database no writer has open), and an immutable one is
    replaced at checkout once a writer has opened the database."""
    import sqlite3

    from aot.cache.index.read_only import read_only_open, stale_immutable

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


def make_engine(url: str | URL, read_only: bool, timeouts: Timeouts | None = None, *, create: bool = True) -> Engine:
    """An engine for the index database at ``url``: SQLite (pragmas, WAL, busy timeout,
    explicit BEGINs; a read-only file never written) or PostgreSQL (psycopg, connect and
    statement timeouts: ``timeouts``, else the environment's; read-only sessions when
    ``read_only``); any other database is refused."""
    try:
        parsed = make_url(url)
    except sa_exc.ArgumentError as e:
        raise CacheError(
            f"cannot parse the cache index URL {mask_url(url)!r}: {e}; expected e.g. "
            f"sqlite:///path/index.sqlite or postgresql+psycopg://user@host/db"
        ) from e
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed, read_only, create)
    if backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        connect_args = _postgres_connect_args(parsed, read_only, timeouts)
        try:
            engine = sa.create_engine(parsed, connect_args=connect_args)
        except ModuleNotFoundError as e:
            raise CacheError(
                f"the PostgreSQL driver for {mask_url(parsed)} is not installed ({e}); "
                f"install it with: pip install 'jax-aot[postgres]'"
            ) from e
        _ping_when_idle(engine)
        bounds = timeouts if timeouts is not None else environment_timeouts()
        statement_s, source = _statement_timeout(parsed, bounds)
        bound = db_client_bound(statement_s)
        why = (f"{bound:g} s ({source} {statement_s:g} s + {DB_CLIENT_GRACE_S:g} s grace)" if statement_s
               else f"{bound:g} s (no statement timeout set: {source} is 0)")
        bound_round_trips(engine, bound, why, ping_seconds=min(bound, bounds.db_connect_s))
        return engine
    raise CacheError(
        f"unsupported cache index database {backend!r} in {mask_url(url)}: jax-aot "
        f"supports SQLite (sqlite:///...) and PostgreSQL (postgresql+psycopg://...)"
    )


def _postgres_connect_args(url: URL, read_only: bool, given: Timeouts | None) -> dict[str, Any]:
    """psycopg's connect arguments: the connect and statement timeouts (``given``, else
    the environment's: :mod:`aot.cache.timeouts`) unless the URL sets its own, and
    read-only sessions. ``options`` in connect_args replaces the URL's, so the URL's are
    kept in front."""
    bounds = given if given is not None else environment_timeouts()
    query = {k: (v[-1] if isinstance(v, tuple) else v) for k, v in url.query.items()}
    args: dict[str, Any] = {}
    if "connect_timeout" not in query:
        args["connect_timeout"] = bounds.db_connect_timeout
    options = [query["options"]] if query.get("options") else []
    # 0 sends nothing: the server's (or role's) setting applies, and a pooler that
    # refuses startup options (PgBouncer) is not sent any by a writable engine.
    if bounds.db_statement_timeout_ms and "statement_timeout" not in query.get("options", ""):
        options.append(f"-c statement_timeout={bounds.db_statement_timeout_ms}")
    if read_only:  # the server refuses writes too, whatever a code path tries
        options.append("-c default_transaction_read_only=on")
    if options:
        args["options"] = " ".join(options)
    return args


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_URL_STATEMENT_TIMEOUT = re.compile(r"statement[_-]timeout\s*=\s*'?([0-9.]+)\s*([a-z]*)", re.IGNORECASE)


def _statement_timeout(url: URL, bounds: Timeouts) -> tuple[float, str]:
    """The statement timeout the sessions of ``url`` get, in seconds, and where it is
    set: the URL's ``options`` (PostgreSQL's units; none is milliseconds), else
    ``bounds`` (``Cache(timeouts=)``, else AOT_DB_STATEMENT_TIMEOUT). 0: none that the client knows of."""
    options = url.query.get("options", "")
    options = options[-1] if isinstance(options, tuple) else options
    found = _URL_STATEMENT_TIMEOUT.search(options or "")
    if found:
        unit = _UNITS.get(found.group(2).lower() or "ms")
        try:
            if unit is not None:
                return float(found.group(1)) * unit, "the URL's statement_timeout"
        except ValueError:
            pass
        logger.debug("cannot read statement_timeout in the URL's options %r", options)
        return 0.0, "a statement_timeout in the URL this client cannot read"
    return bounds.db_statement_s, "AOT_DB_STATEMENT_TIMEOUT"


#: A pooled PostgreSQL connection idle longer than this is pinged at checkout (one
#: more round trip); one used more recently is taken as alive (HikariCP's
#: ``aliveBypassWindowMs`` is the same idea, at 0.5 s).
PING_AFTER_IDLE_S = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """SQLAlchemy's ``pool_pre_ping`` pings at every checkout: a round trip on every
    lookup, a large share of a ``get`` on a fast network. Only a connection that sat idle in the
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


# --------------------------------------------------------------- dialects and the clock


def insert_ignore(conn: Connection, table: sa.Table) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING for the connection's dialect."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table)


def server_now_expr(dialect: str) -> Any:
    """The database server's current UTC time as an SQL expression (SQLite is in
    process: its clock is this host's)."""
    if dialect == "sqlite":
        # SQLAlchemy's own SQLite text format (microseconds), so values compare as text
        return sa.type_coerce(sa.func.strftime("%Y-%m-%d %H:%M:%f000", "now"), UTCDateTime)
    return sa.type_coerce(sa.func.now(), UTCDateTime)


def server_now(conn: Connection) -> datetime:
    """The database server's clock (PostgreSQL ``now()``: this transaction's start).
    SQLite: this host's clock, but never before :func:`high_water` + a microsecond
    (a monotonic clock over every host that writes the file; see the module's doc)."""
    now = as_utc(conn.execute(sa.select(server_now_expr(conn.dialect.name))).scalar_one(), "the database clock")
    if conn.dialect.name == "sqlite":
        mark = high_water(conn)
        if mark is not None and mark - now > timedelta(seconds=60):
            logger.debug("this host's clock is %s behind the index's (%s)", mark - now, mark.isoformat())
        now = sqlite_clock(now, mark)
    return now


def high_water(conn: Connection) -> datetime | None:
    """The highest time a SQLite index holds that marks a write: the latest last use
    of an artifact (every row added is stamped with it) and the time of the latest ref
    change. Two index lookups. None: an index with neither."""
    used = sa.select(sa.func.max(ARTIFACTS.c.last_used_at)).scalar_subquery()
    ref = sa.select(REF_HISTORY.c.set_at).order_by(REF_HISTORY.c.seq.desc()).limit(1).scalar_subquery()
    row = conn.execute(sa.select(sa.type_coerce(used, UTCDateTime), sa.type_coerce(ref, UTCDateTime))).one()
    times = [as_utc(t, "a time in the index") for t in row if t is not None]
    return max(times) if times else None


def index_now_expr(dialect: str) -> Any:
    """:func:`server_now_expr` for a statement on the index's own tables: on SQLite
    never before the latest last use stored (the monotonic clock of :func:`server_now`,
    without its step; for stamping a use)."""
    if dialect != "sqlite":
        return server_now_expr(dialect)
    latest = sa.select(sa.func.max(ARTIFACTS.c.last_used_at)).scalar_subquery()
    now = sa.func.strftime("%Y-%m-%d %H:%M:%f000", "now")
    return sa.type_coerce(sa.func.max(now, sa.func.coalesce(sa.type_coerce(latest, sa.Text), "")), UTCDateTime)


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


# --------------------------------------------------------------- transactions


@contextmanager
def joined(engine: Engine, conn: Connection) -> Iterator[None]:
    """Within the block, :func:`connection_for` on ``engine`` (in this context) hands
    out ``conn``: gc's deletion transaction, which a SQL blob store joins."""
    token = _JOINED.set((engine, conn))
    try:
        yield
    finally:
        _JOINED.reset(token)


class IndexEngine:
    """What every part of :class:`~aot.cache.index.sql.Index` shares: the engine, the
    URL for messages, and one short transaction per method call."""

    read_only: bool
    url: str
    _engine: Engine
    _autocommit_reads: bool

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (shared with :class:`~aot.cache.storage.database.SqlObjectStore`)."""
        return self._engine

    @property
    def dialect(self) -> str:
        return self._engine.dialect.name

    def close(self) -> None:
        self._engine.dispose()

    def _fail(self, what: str, e: BaseException) -> CacheError:
        reason = reason_of(e)
        return CacheError(
            f"{what} failed on the cache index at {self.url}: {reason}"
            f"{advice_for(reason, self.read_only, self._engine.url.database if self.dialect == 'sqlite' else None)}"
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
