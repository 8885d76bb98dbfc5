"""A PostgreSQL index frozen *after* a command connected fails the command within the
client's bound (issue 23, item 1): the statement timeout plus a grace, watched by the
process's watchdog (aot.cache.index.deadlines), and the process exits.

The server's own statement_timeout cannot fire in a stopped server, and its kernel
still acknowledges TCP: before the client-side bound, `aot gc` and `aot compile`
frozen this way waited until the server was thawed. Each test starts its own cluster
(never the shared one), freezes it at a pause point inside the command (the postmaster
and every backend) and always thaws it in a finally.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aot.cache.timeouts import DB_CLIENT_GRACE_S
from tests.reliability.frozen_servers import freeze_tree, postgres_missing, private_postgres, thaw
from tests.reliability.helpers import child_env

HERE = Path(__file__).resolve().parent
WORKER = HERE / "frozen_worker.py"
STATEMENT_S = 1.0
SLACK_S = 5.0  # the CLI's error path and exit on a loaded 2-core machine
GIVE_UP_S = 90.0  # a hung command is killed after this and the test fails

pytestmark = pytest.mark.slow


def _env(tmp_path: Path, point: str) -> dict[str, str]:
    env = child_env()
    env["PYTHONPATH"] = str(HERE.parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(
        AOT_DB_STATEMENT_TIMEOUT=f"{STATEMENT_S:g}", AOT_DB_CONNECT_TIMEOUT="2",
        AOT_STATS_EXIT_TIMEOUT="2",
        AOT_TEST_PAUSE=f"{point}=touch:{tmp_path / 'at'}+wait:{tmp_path / 'go'}",
    )
    return env


def _frozen_mid_command(pg_pid: int, tmp_path: Path, argv: list[str], env: dict[str, str]) -> tuple[int, str, float]:
    """Runs ``aot ARGV``, freezes the server when the command reaches its pause point,
    lets the command go on; the exit code, stderr, and the seconds from the freeze to
    the exit."""
    child = subprocess.Popen([sys.executable, "-m", "aot", *argv], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    frozen: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "at").exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the command never reached its pause point"
            time.sleep(0.02)
        frozen = freeze_tree(pg_pid)
        (tmp_path / "go").touch()
        began = time.monotonic()
        try:
            _, stderr = child.communicate(timeout=GIVE_UP_S)
        except subprocess.TimeoutExpired:
            child.kill()
            _, stderr = child.communicate()
            pytest.fail(f"the command still waited on the frozen index after {GIVE_UP_S:g} s: {stderr[-2000:]}")
        return child.returncode, stderr, time.monotonic() - began
    finally:
        thaw(frozen)
        if child.poll() is None:
            child.kill()
            child.wait()


def _bound() -> float:
    return STATEMENT_S + DB_CLIENT_GRACE_S + SLACK_S


def _orphan_blob(blobs: Path) -> None:
    """A blob no row references, old enough for gc to delete it (a day)."""
    digest = "ab" * 32
    path = blobs / digest[:2] / f"{digest}.zst"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"orphan")
    old = time.time() - 86400
    os.utime(path, (old, old))


@pytest.fixture(scope="module")
def postgres_or_skip() -> None:
    reason = postgres_missing()
    if reason:
        pytest.skip(reason)


@pytest.mark.usefixtures("postgres_or_skip")
def test_gc_on_an_index_frozen_mid_transaction_fails_within_the_bound_and_exits(tmp_path: Path) -> None:
    blobs = str(tmp_path / "blobs")
    with private_postgres() as pg:
        subprocess.run([sys.executable, str(WORKER), "populate", pg.url, blobs], env=child_env(),
                       check=True, timeout=120, capture_output=True)
        _orphan_blob(Path(blobs))
        # gc.locked: inside the deletion transaction, before its next statement.
        code, stderr, seconds = _frozen_mid_command(
            pg.pid, tmp_path, ["--cache", pg.url, "--blobs", blobs, "gc"],
            _env(tmp_path, "gc.locked"),
        )
    assert code == 1, stderr
    assert "Traceback" not in stderr, stderr
    assert "client-side statement timeout" in stderr and "AOT_DB_STATEMENT_TIMEOUT" in stderr, stderr
    assert seconds < _bound(), (seconds, stderr)
    print(f"gc frozen mid-transaction: exit {code} after {seconds:.2f} s (bound {_bound():g} s)")


@pytest.mark.usefixtures("postgres_or_skip")
def test_a_compile_whose_commit_meets_a_frozen_index_fails_within_the_bound(tmp_path: Path) -> None:
    blobs = str(tmp_path / "blobs")
    with private_postgres() as pg:
        # put.before_commit: the row is written, the commit is what waits.
        code, stderr, seconds = _frozen_mid_command(
            pg.pid, tmp_path,
            ["--cache", pg.url, "--blobs", blobs, "compile", "tests.reliability.frozen_worker:scaled",
             "--arg", "f32[3]", "--name", "rel.frozen"],
            _env(tmp_path, "put.before_commit"),
        )
    assert code == 1, stderr
    assert "Traceback" not in stderr, stderr
    assert "client-side statement timeout" in stderr and "AOT_DB_STATEMENT_TIMEOUT" in stderr, stderr
    assert seconds < _bound(), (seconds, stderr)
    print(f"compile frozen at commit: exit {code} after {seconds:.2f} s (bound {_bound():g} s)")
