"""How long the cache waits on the network: every wait has a bound.

A frozen database or object store (a stopped process, a dropped route, a proxy that
accepts and never answers) must fail a call in seconds, so that a replica falls back
to its local tier or reports the outage, instead of hanging a request for minutes.
Each bound is read from the environment when an index engine or an object-store
filesystem is created; the defaults suit a serving fleet.

=========================  =======  ===================================================
Variable                   Default  Bounds
=========================  =======  ===================================================
AOT_DB_CONNECT_TIMEOUT     5        opening a PostgreSQL connection (whole seconds)
AOT_DB_STATEMENT_TIMEOUT   30       one SQL statement on PostgreSQL (0: the server's);
                                    the client gives up at this + 5 s (0: after 600 s)
AOT_BLOB_CONNECT_TIMEOUT   5        opening a connection to the object store (S3)
AOT_BLOB_READ_TIMEOUT      10       waiting for bytes from the object store (S3)
AOT_BLOB_RETRIES           3        attempts of one object-store request (S3)
AOT_STATS_EXIT_TIMEOUT     5        the last statistics flush, at close and exit
AOT_WORKER_STOPPED_TIMEOUT 10       a warm-up worker process stopped (SIGSTOP, state T)
=========================  =======  ===================================================

A database URL that sets ``connect_timeout`` or ``statement_timeout`` itself keeps its
own value. Storage options passed to an object store replace these defaults.

The server enforces the statement timeout, but a *frozen* server (stopped after the
connection was made) cannot: so the client also bounds every round trip (a statement,
a commit, a rollback, a ping) at the statement timeout plus :data:`DB_CLIENT_GRACE_S`,
and then closes the connection (:mod:`aot.cache.index.deadlines`). With no statement
timeout (``AOT_DB_STATEMENT_TIMEOUT=0``, or 0 in the URL) the client's bound is
:data:`DB_CLIENT_UNSET_S`: no statement of the index runs for ten minutes, and a
process must still exit some day.

A warm-up worker may compile for minutes, so compile time has no bound; a worker that
stays *stopped* (Linux ``/proc`` state ``T``/``t``) longer than
``AOT_WORKER_STOPPED_TIMEOUT`` is killed and its entry fails.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from aot.errors import CacheError

__all__ = ["DB_CLIENT_GRACE_S", "DB_CLIENT_UNSET_S", "ENVIRONMENT", "Timeouts", "db_client_bound", "timeouts"]

#: The client gives a PostgreSQL round trip this long past the statement timeout
#: (the server's own timeout, when it can fire, comes first and says more).
DB_CLIENT_GRACE_S = 5.0
#: The client's bound on a round trip when no statement timeout is set.
DB_CLIENT_UNSET_S = 600.0

#: The environment variable of each bound.
ENVIRONMENT = {
    "db_connect_s": "AOT_DB_CONNECT_TIMEOUT",
    "db_statement_s": "AOT_DB_STATEMENT_TIMEOUT",
    "blob_connect_s": "AOT_BLOB_CONNECT_TIMEOUT",
    "blob_read_s": "AOT_BLOB_READ_TIMEOUT",
    "blob_retries": "AOT_BLOB_RETRIES",
    "stats_exit_s": "AOT_STATS_EXIT_TIMEOUT",
    "worker_stopped_s": "AOT_WORKER_STOPPED_TIMEOUT",
}


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The network bounds in seconds (``blob_retries``: attempts per request)."""

    db_connect_s: float = 5.0
    db_statement_s: float = 30.0  # 0: not set, the server's (or role's) setting applies
    blob_connect_s: float = 5.0
    blob_read_s: float = 10.0  # between bytes, not for a whole blob: x retries per request
    blob_retries: int = 3
    stats_exit_s: float = 5.0  # past it, unflushed statistics are dropped with a warning
    worker_stopped_s: float = 10.0  # a warm-up worker stopped this long is killed

    @property
    def db_connect_timeout(self) -> int:
        """libpq takes whole seconds: round up, so a bound is never shorter than asked."""
        return max(1, math.ceil(self.db_connect_s))

    @property
    def db_statement_timeout_ms(self) -> int:
        return max(0, math.ceil(self.db_statement_s * 1000))


def db_client_bound(statement_s: float) -> float:
    """The client's bound on one PostgreSQL round trip for a statement timeout of
    ``statement_s`` seconds (0: none set)."""
    return statement_s + DB_CLIENT_GRACE_S if statement_s > 0 else DB_CLIENT_UNSET_S


def _seconds(env: Mapping[str, str], name: str, default: float, *, zero_ok: bool, zero: str = "the server's setting") -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        allowed = f"0 or more (0: {zero})" if zero_ok else "more than 0"
        raise CacheError(
            f"{name}={raw!r} is not a timeout: expected seconds, {allowed}, e.g. {name}={default:g}"
        )
    return value


def timeouts(env: Mapping[str, str] | None = None) -> Timeouts:
    """The bounds the environment sets (``os.environ`` unless ``env`` is given), each
    defaulting to :class:`Timeouts`'; a malformed value is a :class:`CacheError`."""
    env = os.environ if env is None else env
    d = Timeouts()
    retries = _seconds(env, ENVIRONMENT["blob_retries"], d.blob_retries, zero_ok=False)
    if retries != int(retries):
        raise CacheError(
            f"{ENVIRONMENT['blob_retries']}={env[ENVIRONMENT['blob_retries']]!r} is not a "
            f"count: expected a whole number of attempts, 1 or more, e.g. 3"
        )
    return Timeouts(
        db_connect_s=_seconds(env, ENVIRONMENT["db_connect_s"], d.db_connect_s, zero_ok=False),
        db_statement_s=_seconds(env, ENVIRONMENT["db_statement_s"], d.db_statement_s, zero_ok=True),
        blob_connect_s=_seconds(env, ENVIRONMENT["blob_connect_s"], d.blob_connect_s, zero_ok=False),
        blob_read_s=_seconds(env, ENVIRONMENT["blob_read_s"], d.blob_read_s, zero_ok=False),
        blob_retries=int(retries),
        stats_exit_s=_seconds(env, ENVIRONMENT["stats_exit_s"], d.stats_exit_s, zero_ok=True, zero="drop at once"),
        worker_stopped_s=_seconds(env, ENVIRONMENT["worker_stopped_s"], d.worker_stopped_s, zero_ok=False),
    )
