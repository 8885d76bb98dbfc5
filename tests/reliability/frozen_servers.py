"""Servers the frozen-dependency tests start themselves, to SIGSTOP them (never the
shared ones): a PostgreSQL cluster (initdb + pg_ctl as the postgres user, like
.ci/postgres.sh) and a moto S3 server, each on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return True
        time.sleep(0.1)
    return False


@dataclass
class Frozen:
    """A server process the test may freeze (SIGSTOP) and thaw (SIGCONT)."""

    pid: int
    url: str

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)


def postgres_bindir() -> Path | None:
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if all((d / b).exists() for b in ("initdb", "pg_ctl", "postgres")):
            return d
    return None


def postgres_missing() -> str | None:
    """Why a private PostgreSQL cannot be started here (None: it can)."""
    if postgres_bindir() is None:
        return "PostgreSQL binaries (/usr/lib/postgresql/*/bin/initdb, pg_ctl) are not installed"
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return "starting a private PostgreSQL needs root and runuser (to run as the postgres user)"
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        return "the postgres system user does not exist"
    return None


@contextlib.contextmanager
def private_postgres() -> Iterator[Frozen]:
    """A throw-away cluster; the postmaster is what a test freezes (a backend serving a
    connection is a child of it: both are stopped, see freeze_tree)."""
    bindir = postgres_bindir()
    assert bindir is not None
    base = Path(tempfile.mkdtemp(prefix="aot-frozen-pg-", dir="/var/tmp"))
    shutil.chown(base, "postgres", "postgres")
    data, port = base / "data", free_port()

    def as_pg(*cmd: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *cmd], cwd="/", check=True,
                       capture_output=True, timeout=120)

    started = False
    try:
        as_pg(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
              "--encoding=UTF8", "--locale=C")
        as_pg(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(base / "log"), "-w", "-t", "60",
              "-o", f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={base}"
              " -c fsync=off", "start")
        started = True
        pid = int((data / "postmaster.pid").read_text().split()[0])
        yield Frozen(pid, f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres")
    finally:
        if started:
            for p in [pid, *children(pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGCONT)
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                as_pg(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(base, ignore_errors=True)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (PostgreSQL's backends)."""
    out = []
    for status in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = status.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(status.parent.name))
    return out


def freeze_tree(pid: int) -> list[int]:
    """SIGSTOPs ``pid`` and its children; returns them, to thaw in a finally."""
    frozen = [pid, *children(pid)]
    for p in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGSTOP)
    return frozen


def thaw(pids: list[int]) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGCONT)


def moto_missing() -> str | None:
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return "moto[server] is not installed (the test extras)"
    return None


@contextlib.contextmanager
def private_moto() -> Iterator[Frozen]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        assert _wait_port(port, 30), "the private moto server did not listen within 30 s"
        endpoint = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(endpoint + "/moto-api/", timeout=15):
            pass
        yield Frozen(proc.pid, endpoint)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=30)
