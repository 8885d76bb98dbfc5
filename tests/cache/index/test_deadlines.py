"""The client-side bound on PostgreSQL round trips (aot.cache.index.deadlines): the
watchdog shuts a stalled socket down, a stalled statement fails with the advice naming
AOT_DB_STATEMENT_TIMEOUT, and its connection is discarded, not reused."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import sqlalchemy as sa

from aot.cache.index import engine as engine_module
from aot.cache.index.deadlines import Watchdog
from aot.cache.index.engine import IndexEngine, make_engine
from aot.cache.timeouts import DB_CLIENT_GRACE_S, DB_CLIENT_UNSET_S, db_client_bound
from aot.errors import CacheError


def test_a_wait_past_its_deadline_is_ended_by_a_shutdown() -> None:
    dog = Watchdog()
    a, b = socket.socketpair()
    try:
        token = dog.arm(a.fileno(), 0.2)
        began = time.monotonic()
        assert a.recv(1) == b""  # nothing was ever sent: only the shutdown ends this
        assert time.monotonic() - began < 2.0
        assert dog.disarm(token) is True
        assert dog.shut_down == 1
    finally:
        a.close()
        b.close()


def test_a_round_trip_done_in_time_is_left_alone_and_the_heap_stays_small() -> None:
    dog = Watchdog()
    a, b = socket.socketpair()
    try:
        for _ in range(10_000):
            assert dog.disarm(dog.arm(a.fileno(), 30.0)) is False
        assert len(dog._heap) <= 64 + 2
        token = dog.arm(a.fileno(), 0.05)
        assert dog.disarm(token) is False
        time.sleep(0.2)  # past that deadline: it was disarmed, nothing happens
        b.sendall(b"x")
        assert a.recv(1) == b"x" and dog.shut_down == 0
    finally:
        a.close()
        b.close()


def test_the_nearest_deadline_wakes_the_watchdog_early() -> None:
    dog = Watchdog()
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        far = dog.arm(pairs[0][0].fileno(), 60.0)  # the watchdog sleeps on this one
        near = dog.arm(pairs[1][0].fileno(), 0.1)
        done = threading.Event()
        threading.Thread(target=lambda: (pairs[1][0].recv(1), done.set()), daemon=True).start()
        assert done.wait(2.0)
        assert dog.disarm(near) is True
        assert dog.disarm(far) is False
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_the_client_bound_is_the_statement_timeout_plus_a_grace() -> None:
    assert db_client_bound(30.0) == 30.0 + DB_CLIENT_GRACE_S
    assert db_client_bound(0.0) == DB_CLIENT_UNSET_S  # none set: the client's own


@pytest.mark.postgres
def test_each_round_trip_has_its_bound(postgres_admin_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AOT_DB_STATEMENT_TIMEOUT", "7")
    monkeypatch.setenv("AOT_DB_CONNECT_TIMEOUT", "3")
    engine = make_engine(postgres_admin_url, read_only=True)
    try:
        for name in ("do_execute", "do_executemany", "do_execute_no_params", "do_commit", "do_rollback"):
            assert getattr(engine.dialect, name).bound_s == 7 + DB_CLIENT_GRACE_S, name
        # A pooled connection that answers a ping slower than a new one would connect
        # is replaced.
        assert engine.dialect.do_ping.bound_s == 3
    finally:
        engine.dispose()
    own = sa.make_url(postgres_admin_url).update_query_dict({"options": "-c statement_timeout=2min"})
    engine = make_engine(own, read_only=True)
    try:
        assert engine.dialect.do_commit.bound_s == 120 + DB_CLIENT_GRACE_S  # the URL's own
    finally:
        engine.dispose()
    monkeypatch.setenv("AOT_DB_STATEMENT_TIMEOUT", "0")
    engine = make_engine(postgres_admin_url, read_only=True)
    try:
        assert engine.dialect.do_execute.bound_s == DB_CLIENT_UNSET_S  # none set
    finally:
        engine.dispose()


class _Probe(IndexEngine):
    def __init__(self, url: str) -> None:
        self.read_only, self.url = True, "postgresql://test"
        self._engine = make_engine(url, read_only=True)
        self._autocommit_reads = True


@pytest.mark.postgres
def test_a_stalled_statement_fails_with_the_advice_and_its_connection_is_discarded(
    postgres_admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No server-side timeout, and a client bound of 0.5 s: a statement that takes 5 s
    # looks to the client like one sent to a frozen server.
    monkeypatch.setenv("AOT_DB_STATEMENT_TIMEOUT", "0")
    monkeypatch.setattr(engine_module, "db_client_bound", lambda statement_s: 0.5)
    probe = _Probe(postgres_admin_url)
    try:
        with probe._read("warm") as conn:
            first_pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        began = time.monotonic()
        with pytest.raises(CacheError) as raised:
            with probe._read("sleep") as conn:
                assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() == first_pid
                conn.exec_driver_sql("SELECT pg_sleep(5)")
        assert time.monotonic() - began < 3.0
        message = str(raised.value)
        assert "client-side statement timeout: 0.5 s" in message, message
        assert "AOT_DB_STATEMENT_TIMEOUT" in message, message
        with probe._read("again") as conn:  # a new connection: the broken one was discarded
            assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() != first_pid
            assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
    finally:
        probe.close()


def test_a_descriptor_closed_and_reused_before_its_deadline_is_left_alone() -> None:
    dog = Watchdog()
    a, b = socket.socketpair()
    fd = a.fileno()
    token = dog.arm(fd, 0.2)
    a.close()  # a connection closed while its round trip was armed (a leak) ...
    c, d = socket.socketpair()  # ... and its descriptor number given to another
    try:
        assert c.fileno() == fd or d.fileno() == fd
        reused = c if c.fileno() == fd else d
        other = d if reused is c else c
        time.sleep(0.5)  # past the deadline
        assert dog.shut_down == 0
        other.sendall(b"x")
        assert reused.recv(1) == b"x"  # still open both ways
        dog.disarm(token)
    finally:
        b.close()
        c.close()
        d.close()
