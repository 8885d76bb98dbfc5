"""Label moves (declare, promote, rollback) are serialized per label and atomic with
their members, on SQLite and PostgreSQL (issue 38, items 1 and 2).

Races are forced: one mover is held inside its transaction right after it read the
label's current set (a wrapper of ``IndexRefs._current_set``) while the other runs.
A correct mover holds the label's lock there, so the other waits for it; the join
timeout only bounds how long the test lets the other try to finish first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from aot.cache import pauses
from aot.cache.index.refs import RefOrigin
from aot.cache.index.refs_sql import IndexRefs
from aot.cache.index.sql import Index
from aot.cache.warmup.run import declare
from aot.errors import CacheError

ENV = "env-cpu-1"


def origin(source: str = "test") -> RefOrigin:
    return RefOrigin(source, host="h", user="u")


def result(name: str, key: str) -> SimpleNamespace:
    """What :func:`declare` reads of a warm-up's ItemResult."""
    return SimpleNamespace(ok=True, name=name, signature="x: f32[8]", env_fp=ENV, key=key)


def keys(index: Index, label: str) -> list[str]:
    release = index.release_set(label)
    assert release is not None
    return sorted(m.key for m in release.members)


def declare_set(index: Index, label: str, *pairs: tuple[str, str], run: str | None = None) -> None:
    declare(SimpleNamespace(index=index), [result(n, k) for n, k in pairs], origin(), release=label, run=run)


@contextmanager
def held_after_read(monkeypatch: pytest.MonkeyPatch, thread_name: str) -> Iterator[tuple[threading.Event, threading.Event]]:
    """(read, go): the thread named ``thread_name`` signals ``read`` after its first
    read of a label's current set, inside its transaction, and waits for ``go``."""
    read, go = threading.Event(), threading.Event()
    real = IndexRefs._current_set

    def current_set(self: IndexRefs, conn: Any, label: str) -> Any:
        row = real(self, conn, label)
        if threading.current_thread().name == thread_name and not read.is_set():
            read.set()
            assert go.wait(60)
        return row

    monkeypatch.setattr(IndexRefs, "_current_set", current_set)
    try:
        yield read, go
    finally:
        go.set()


def race(monkeypatch: pytest.MonkeyPatch, first: Callable[[], Any], second: Callable[[], Any]) -> dict[str, Any]:
    """Runs ``first`` until it has read the label's current set, then ``second``
    (given up to 2 s to finish while ``first`` is held), then lets ``first`` go on.
    Returns each one's result or exception."""
    out: dict[str, Any] = {}

    def run(name: str, fn: Callable[[], Any]) -> None:
        try:
            out[name] = fn()
        except Exception as e:  # noqa: BLE001  (reported to the test)
            out[name] = e

    with held_after_read(monkeypatch, "first") as (read, go):
        a = threading.Thread(target=run, args=("first", first), name="first")
        a.start()
        assert read.wait(30), "the first mover never read the label"
        b = threading.Thread(target=run, args=("second", second), name="second")
        b.start()
        b.join(2.0)  # a serialized second mover is still waiting for the first's lock
        go.set()
        a.join(60)
        b.join(60)
    assert not a.is_alive() and not b.is_alive()
    return out


def test_a_promotion_racing_a_rollback_ends_in_a_serial_order(index: Index, monkeypatch: pytest.MonkeyPatch) -> None:
    declare_set(index, "prod", ("m", "k1"))
    declare_set(index, "prod", ("m", "k2"))
    declare_set(index, "cand", ("m", "k3"))
    out = race(monkeypatch, lambda: index.rollback("prod", origin("rollback"), require_stored=False),
               lambda: index.promote("cand", "prod", origin("promote")))
    assert not any(isinstance(v, Exception) for v in out.values()), out
    # rollback then promote: cand's k3; promote then rollback: k2 again. Never k1.
    assert keys(index, "prod") in (["k3"], ["k2"])
    index.rollback("prod", origin(), require_stored=False)  # and one step back is the state before the last move
    assert keys(index, "prod") in (["k1"], ["k3"])


def test_two_rollbacks_at_once_go_back_two_steps(index: Index, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("k1", "k2", "k3"):
        declare_set(index, "prod", ("m", key))
    out = race(monkeypatch, lambda: index.rollback("prod", origin("a"), require_stored=False), lambda: index.rollback("prod", origin("b"), require_stored=False))
    assert not isinstance(out["first"], Exception), out
    if isinstance(out["second"], CacheError):  # refused cleanly: one step back
        assert keys(index, "prod") == ["k2"]
    else:
        assert not isinstance(out["second"], Exception), out
        assert keys(index, "prod") == ["k1"]


def test_shards_of_one_run_declaring_at_once_land_in_one_set(index: Index, monkeypatch: pytest.MonkeyPatch) -> None:
    declare_set(index, "cand", ("old", "k0"))
    run = "abc:0123"
    out = race(
        monkeypatch,
        lambda: declare_set(index, "cand", ("a", "ka"), ("b", "kb"), run=run),
        lambda: declare_set(index, "cand", ("c", "kc"), ("d", "kd"), run=run),
    )
    assert not any(isinstance(v, Exception) for v in out.values()), out
    assert keys(index, "cand") == ["ka", "kb", "kc", "kd"]
    assert sorted(r.key for r in index.refs()) == ["k0", "ka", "kb", "kc", "kd"]


def test_two_runs_declaring_at_once_never_drop_each_others_members(
    index: Index, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each warm-up read the label before compiling (it was empty); the members are
    # carried under the lock, so whichever declares second keeps the other's.
    def warm(name: str, key: str, run: str) -> None:
        declare(SimpleNamespace(index=index), [result(name, key)], origin(), release="cand", run=run,
                covered=lambda m: m.name == name)

    out = race(monkeypatch, lambda: warm("a", "ka", "r1"), lambda: warm("b", "kb", "r2"))
    assert not any(isinstance(v, Exception) for v in out.values()), out
    assert keys(index, "cand") == ["ka", "kb"]
    assert len(index.release_history("cand")) == 2
    assert sorted(r.key for r in index.refs()) == ["ka", "kb"]


def test_a_declaration_that_fails_leaves_the_label_on_its_set(index: Index) -> None:
    declare_set(index, "prod", ("m", "k1"), ("n", "n1"))
    before = index.release_set("prod")

    def fail(point: str) -> None:
        if point == "refs.recorded":
            raise CacheError("statement timeout (simulated)")

    previous = pauses.set_hook(fail)
    try:
        with pytest.raises(CacheError, match="statement timeout"):
            declare_set(index, "prod", ("m", "k2"), ("n", "n2"))
    finally:
        pauses.set_hook(previous)
    after = index.release_set("prod")
    assert after is not None and before is not None
    assert (after.id, keys(index, "prod")) == (before.id, ["k1", "n1"])
    assert sorted(r.key for r in index.refs()) == ["k1", "n1"]


KILLED_DECLARATION = """
import sys
from types import SimpleNamespace
from aot.cache.index.refs import RefOrigin
from aot.cache.index.sql import Index
from aot.cache.warmup.run import declare
index = Index(sys.argv[1])
results = [SimpleNamespace(ok=True, name=n, signature="x: f32[8]", env_fp="env-cpu-1", key=k)
           for n, k in (("m", "k2"), ("n", "n2"))]
declare(SimpleNamespace(index=index), results, RefOrigin("warmup v2"), release="prod")
"""


def test_a_declaration_killed_at_refs_recorded_leaves_the_label_on_its_set(index: Index, index_url: str) -> None:
    declare_set(index, "prod", ("m", "k1"), ("n", "n1"))
    before = index.release_set("prod")
    env = {**os.environ, pauses.ENV: "refs.recorded=kill"}
    proc = subprocess.run([sys.executable, "-c", KILLED_DECLARATION, index_url], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    after = index.release_set("prod")
    assert after is not None and before is not None
    assert (after.id, keys(index, "prod")) == (before.id, ["k1", "n1"])
    assert len(index.release_history("prod")) == 1
