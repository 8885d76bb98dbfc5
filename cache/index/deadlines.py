"""A client-side bound on every round trip to a PostgreSQL server: a frozen server
fails the call instead of hanging the process.

A server stopped *after* a connection was made (SIGSTOP, a hung VM) never answers,
and nothing on the client notices: the server's ``statement_timeout`` cannot fire in
a stopped process, its kernel still acknowledges TCP (so keep-alives and
``tcp_user_timeout`` see a live peer), and libpq waits in ``poll`` for ever. So each
round trip of an index engine gets a deadline: the statement timeout plus a grace
(:attr:`aot.cache.timeouts.Timeouts.db_client_bound_s`). One watchdog thread per
process holds the deadlines in a heap (not a thread or a timer per statement); when
one passes with its round trip still running, it shuts the connection's socket down
(on a duplicate of the descriptor, closed at once), libpq's wait returns at once, and
the call fails with an ``OperationalError`` whose message says the statement timeout
was passed (:func:`aot.cache.index.advice.advice_for` then names
``AOT_DB_STATEMENT_TIMEOUT``). The connection is discarded from the pool, never reused.

How it is hooked: :func:`bound_round_trips` wraps the methods of the engine's own
dialect instance that talk to the server (``do_execute``, ``do_executemany``,
``do_execute_no_params``, ``do_commit``, ``do_rollback``, ``do_ping``), and a
``handle_error`` listener marks the error a disconnect so that SQLAlchemy invalidates
that one connection. Why there and not in ``before/after_cursor_execute`` and
``commit``/``rollback`` events: those events fire only *before* a commit or a
rollback, never after, so a deadline armed there could not be disarmed when the
commit returns; and the pool's reset-on-return rollback and the idle ping run no
event at all. The dialect's methods are the one place every round trip passes, with
a start and an end, on public SQLAlchemy API, only on the PostgreSQL engines the
index creates (a psycopg connection subclass would need a custom ``creator`` and its
own cursor class for the same coverage).

Cost: arming and disarming take a lock, a heap push and a dictionary update; the
watchdog wakes only when the earliest deadline passes or a nearer one arrives
(measured in docs/reliability.md).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

logger = logging.getLogger(__name__)

__all__ = ["Watchdog", "bound_round_trips", "watchdog"]


class Watchdog:
    """Deadlines on file descriptors, watched by one daemon thread (started on first use).

    :meth:`arm` returns a token; :meth:`disarm` returns True when the deadline passed
    first, in which case the descriptor's socket was shut down (both directions). Both
    run under one lock, so a socket is never shut down after its round trip was
    disarmed, and a descriptor is live while it is armed (its connection is in use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._heap: list[tuple[float, int]] = []  # (deadline, token); disarmed ones linger
        self._armed: dict[int, tuple[int, int]] = {}  # token -> (fd, the socket's inode)
        self._fired: set[int] = set()
        self._tokens = itertools.count(1)
        self._thread: threading.Thread | None = None
        self.shut_down = 0  # sockets shut down so far (for tests and logs)

    def arm(self, fd: int, seconds: float) -> int:
        deadline = time.monotonic() + seconds
        inode = _inode(fd)
        with self._lock:
            token = next(self._tokens)
            self._armed[token] = (fd, inode)
            nearest = not self._heap or deadline < self._heap[0][0]
            heapq.heappush(self._heap, (deadline, token))
            if len(self._heap) > 2 * len(self._armed) + 64:
                # Disarmed entries wait for their deadline in the heap; drop them in
                # bulk so a busy process keeps the heap the size of what is armed.
                self._heap = [e for e in self._heap if e[1] in self._armed]
                heapq.heapify(self._heap)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="aot-db-watchdog", daemon=True)
                self._thread.start()
            elif nearest:
                self._wake.notify()
        return token

    def disarm(self, token: int) -> bool:
        with self._lock:
            if self._armed.pop(token, None) is not None:
                return False
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def _run(self) -> None:
        with self._lock:
            while True:
                now = time.monotonic()
                while self._heap and (self._heap[0][1] not in self._armed or self._heap[0][0] <= now):
                    _, token = heapq.heappop(self._heap)
                    armed = self._armed.pop(token, None)
                    if armed is not None:
                        self._fired.add(token)
                        self._shut(*armed)
                self._wake.wait(self._heap[0][0] - now if self._heap else None)

    def _shut(self, fd: int, inode: int) -> None:
        """Shuts the socket of ``fd`` down through a duplicate (the connection's own
        descriptor stays open, owned by libpq, which then sees end of file), unless
        ``fd`` now names another file than the one armed (closed, and its number
        reused by another connection): that one is never touched."""
        if _inode(fd) != inode:
            logger.debug("watchdog: descriptor %d was closed or reused since it was armed", fd)
            return
        try:
            dup = os.dup(fd)
        except OSError as e:
            logger.debug("watchdog: descriptor %d already closed (%s)", fd, e)
            return
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
            self.shut_down += 1
        except OSError as e:
            logger.debug("watchdog: shutting descriptor %d down failed: %s", fd, e)
        finally:
            sock.close()

    def _after_fork(self) -> None:
        """A forked child has no watchdog thread and none of the parent's round trips."""
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._heap, self._armed, self._fired, self._thread = [], {}, set(), None


def _inode(fd: int) -> int:
    """The inode of ``fd``'s open file (-1: not open): what tells a socket from another
    one given the same descriptor number after the first was closed."""
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return -1


#: The process's watchdog.
watchdog = Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=watchdog._after_fork)


_STATEMENT_PARTS = ("do_execute", "do_executemany", "do_execute_no_params")
_CONNECTION_PARTS = ("do_commit", "do_rollback", "do_ping")


def _fd_of(dbapi_conn: Any) -> int | None:
    try:
        return int(dbapi_conn.fileno())
    except Exception:  # noqa: BLE001 - closed or broken: nothing to wait on
        return None


def bound_round_trips(engine: Engine, seconds: float, why: str, *, ping_seconds: float | None = None) -> None:
    """Every round trip of ``engine`` (a psycopg engine) to its server fails after
    ``seconds`` with an ``OperationalError`` saying ``why`` (the bound and where it
    comes from), and that connection is discarded. The idle ping at checkout gets
    ``ping_seconds`` when given (a pooled connection that answers a ping slower than a
    new connection would connect is replaced; the replacement's connect is bounded by
    libpq)."""
    dialect = engine.dialect
    error_type = dialect.loaded_dbapi.OperationalError
    message = f"no answer from the server within the client-side statement timeout: {why}; the connection was closed"

    def bounded(call: Callable[..., Any], conn_of: Callable[[Any], Any], seconds: float = seconds) -> Callable[..., Any]:
        def run(target: Any, *args: Any, **kwargs: Any) -> Any:
            fd = _fd_of(conn_of(target))
            if fd is None:
                return call(target, *args, **kwargs)
            token = watchdog.arm(fd, seconds)
            try:
                result = call(target, *args, **kwargs)
            except BaseException as e:
                if watchdog.disarm(token):
                    raise error_type(message) from e
                raise
            if watchdog.disarm(token):  # answered as the socket went down: it is gone
                raise error_type(message)
            return result

        run.__wrapped__ = call  # type: ignore[attr-defined]
        run.bound_s = seconds  # type: ignore[attr-defined]
        return run

    for name in _STATEMENT_PARTS:
        setattr(dialect, name, bounded(getattr(dialect, name), lambda cursor: cursor.connection))
    for name in _CONNECTION_PARTS:
        bound = ping_seconds if name == "do_ping" and ping_seconds is not None else seconds
        setattr(dialect, name, bounded(getattr(dialect, name), lambda conn: conn, bound))

    @event.listens_for(engine, "handle_error")
    def _discard(context: Any) -> None:
        if message in str(context.original_exception):
            context.is_disconnect = True  # this connection is invalidated, not pooled
            context.invalidate_pool_on_disconnect = False  # the others are checked at checkout
