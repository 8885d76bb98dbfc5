"""How long the cache waits on the network: every wait has a bound.

A frozen database or object store (a stopped process, a dropped route, a proxy that
accepts and never answers) must fail a call in seconds, so that a replica falls back
to its local tier or reports the outage, instead of hanging a request for minutes.
The defaults suit a serving fleet. Each bound comes from the first of:

1. ``aot.Cache(..., timeouts=Timeouts(...))`` (also ``aot.load(..., timeouts=)`` and
   ``aot.jax_cache.install(..., timeouts=)``): the object given is used whole;
2. the environment (``timeouts=None``, the default), read when an index engine or an
   object-store filesystem is created and at the last statistics flush;
3. for the command line only, the ``[tool.aot]`` table of ``pyproject.toml``
   (:mod:`aot.cache.config`; the key is the variable's name, lowercased, without
   ``AOT_``): the environment beats the file;
4. the defaults below.

=========================  ====================  =======  ====================================
Variable                   ``Timeouts`` field    Default  Bounds
=========================  ====================  =======  ====================================
AOT_DB_CONNECT_TIMEOUT     ``db_connect_s``      5        opening a PostgreSQL connection
                                                          (rounded up to whole seconds)
AOT_DB_STATEMENT_TIMEOUT   ``db_statement_s``    30       one SQL statement on PostgreSQL
                                                          (0: the server's); the client
                                                          gives up at this + 5 s (0: 600 s)
AOT_BLOB_CONNECT_TIMEOUT   ``blob_connect_s``    5        opening a connection to the object
                                                          store (S3)
AOT_BLOB_READ_TIMEOUT      ``blob_read_s``       10       waiting for bytes from the object
                                                          store (S3)
AOT_BLOB_RETRIES           ``blob_retries``      3        attempts of one object-store request
                                                          (S3)
AOT_STATS_EXIT_TIMEOUT     ``stats_exit_s``      5        the last statistics flush, at close
                                                          and exit (0: drop at once)
AOT_WORKER_STOPPED_TIMEOUT ``worker_stopped_s``  10       a warm-up worker process stopped
                                                          (SIGSTOP, state T): then killed
=========================  ====================  =======  ====================================

A partial override: ``Timeouts(blob_read_s=1)`` is a complete set of bounds (the
fields not given are the defaults above, whatever the environment says);
``Timeouts.from_environment(blob_read_s=1)`` keeps the environment's other bounds.

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
from dataclasses import dataclass, fields, replace
from typing import Any

from aot.errors import CacheError

__all__ = [
    "DB_CLIENT_GRACE_S", "DB_CLIENT_UNSET_S", "DEFAULTS", "ENVIRONMENT", "Timeouts", "check_bound",
    "db_client_bound", "timeouts",
]

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

#: What 0 means for the bounds that accept it (the others must be more than 0).
_ZERO = {"db_statement_s": "the server's setting", "stats_exit_s": "drop at once"}


def check_bound(field: str, value: Any, where: str, example: str) -> float | int:
    """``value`` as the bound ``field`` (a :class:`Timeouts` field name), or a
    :class:`CacheError` that quotes ``where`` (e.g. ``AOT_BLOB_RETRIES='x'``), says
    what was expected, and gives ``example``."""
    number: float
    if isinstance(value, bool):
        number = math.nan
    elif isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = math.nan
    else:
        number = math.nan
    if field == "blob_retries":
        if not (math.isfinite(number) and number >= 1 and number == int(number)):
            raise CacheError(
                f"{where} is not a count: expected a whole number of attempts, 1 or more, "
                f"e.g. {example}"
            )
        return int(number)
    zero = _ZERO.get(field)
    if not math.isfinite(number) or number < 0 or (number == 0 and zero is None):
        allowed = f"0 or more (0: {zero})" if zero is not None else "more than 0"
        raise CacheError(f"{where} is not a timeout: expected seconds, {allowed}, e.g. {example}")
    return number


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The network bounds in seconds (``blob_retries``: attempts per request).

    Given to ``aot.Cache(..., timeouts=...)`` it is used whole: a field not given is
    its default here, not the environment's value (use :meth:`from_environment` for
    that). A value that is not a bound is a :class:`CacheError`."""

    db_connect_s: float = 5.0
    db_statement_s: float = 30.0  # 0: not set, the server's (or role's) setting applies
    blob_connect_s: float = 5.0
    blob_read_s: float = 10.0  # between bytes, not for a whole blob: x retries per request
    blob_retries: int = 3
    stats_exit_s: float = 5.0  # past it, unflushed statistics are dropped with a warning
    worker_stopped_s: float = 10.0  # a warm-up worker stopped this long is killed

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            checked = check_bound(
                f.name, value, f"Timeouts({f.name}={value!r})", f"Timeouts({f.name}={f.default!r})"
            )
            object.__setattr__(self, f.name, checked)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Timeouts:
        """The bounds the environment sets (``os.environ`` unless ``env`` is given),
        each defaulting to the class's; ``overrides`` (field names) replace some:
        ``Timeouts.from_environment(blob_read_s=1)``."""
        return replace(timeouts(env), **overrides) if overrides else timeouts(env)

    @property
    def db_connect_timeout(self) -> int:
        """libpq takes whole seconds: round up, so a bound is never shorter than asked."""
        return max(1, math.ceil(self.db_connect_s))

    @property
    def db_statement_timeout_ms(self) -> int:
        return max(0, math.ceil(self.db_statement_s * 1000))

    def to_dict(self) -> dict[str, float | int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: The default of each bound, by field name.
DEFAULTS: dict[str, float | int] = Timeouts().to_dict()
DEFAULTS_TEXT = {name: f"{value:g}" for name, value in DEFAULTS.items()}


def db_client_bound(statement_s: float) -> float:
    """The client's bound on one PostgreSQL round trip for a statement timeout of
    ``statement_s`` seconds (0: none set)."""
    return statement_s + DB_CLIENT_GRACE_S if statement_s > 0 else DB_CLIENT_UNSET_S


def timeouts(env: Mapping[str, str] | None = None) -> Timeouts:
    """The bounds the environment sets (``os.environ`` unless ``env`` is given), each
    defaulting to :class:`Timeouts`'; a malformed value is a :class:`CacheError`."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for field, variable in ENVIRONMENT.items():
        raw = env.get(variable, "").strip()
        if raw:
            values[field] = check_bound(
                field, raw, f"{variable}={env[variable]!r}", f"{variable}={DEFAULTS_TEXT[field]}"
            )
    return Timeouts(**values)

