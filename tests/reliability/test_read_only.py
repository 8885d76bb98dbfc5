"""Read-only means read-only: a cache another user owns is served.

The CI user writes the cache; a serving user that can read but not write the folder
must be able to serve it with ``read_only=True`` (or with the default, which opens a
folder it cannot write read-only). A read-only open never creates the -wal/-shm files
of the SQLite index and never takes a write lock (docs/reliability.md, "Serving
read-only"). The tests run as root here and in CI, so the reader runs as ``nobody``
(setpriv or runuser); as another user, the folder is made read-only instead.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from aot.cache.cache import Cache

from tests.reliability.helpers import TinyArtifacts, child_env, snapshot

READER = r'''
import json, sys
import numpy as np
import aot
from aot.cache.cache import Cache

location, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def served(**options):
    fn = aot.load("rel.tiny", cache=location, **options)
    out = np.asarray(fn(np.arange(n, dtype=np.float32))).tolist()
    fn.cache.close()
    return out

if mode == "serve":
    result = {"read_only": served(read_only=True), "default": served()}
    with Cache(location, read_only=True) as cache:
        result["entries"] = len(cache.entries())  # the SQLAlchemy index, read-only
        result["verify_ok"] = cache.verify(quarantine=False).ok
    print(json.dumps(result), flush=True)
else:  # "watch": count the rows, wait for the parent, count again, ...
    import itertools
    with Cache(location, read_only=True) as cache:
        for line in itertools.chain(["start"], sys.stdin):
            print(json.dumps({
                "index": len(cache.entries()),
                "reader": len(cache.entries_named("rel.tiny")),
            }), flush=True)
'''


def _as_other_user() -> tuple[list[str] | None, str]:
    """A command prefix that runs this checkout's Python as an unprivileged user (root
    only), and why there is none. The probe imports what the reader imports (numpy and
    aot, from this checkout and its venv, with the reader's environment): a checkout
    in a folder ``nobody`` may not read (``/root``, mode 700; ``mktemp -d``) starts no
    reader, and the tests say so instead of failing."""
    if os.geteuid() != 0:
        return None, "not root"
    candidates = [
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"],
        ["setpriv", "--reuid=nobody", "--regid=nobody", "--clear-groups"],
        ["runuser", "-u", "nobody", "--"],
    ]
    why = "neither setpriv nor runuser can switch to nobody"
    for prefix in candidates:
        if shutil.which(prefix[0]) is None:
            continue
        probe = subprocess.run(
            [*prefix, sys.executable, "-c", "import os, numpy, aot; print(os.geteuid())"],
            capture_output=True, text=True, env=_env(), cwd="/",
        )
        if probe.returncode == 0 and probe.stdout.strip() not in ("", "0"):
            return prefix, ""
        last = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
        if probe.returncode != 0 and "nobody" not in last and "user" not in last.lower():
            why = (
                f"nobody cannot run this checkout's Python and import aot and numpy ({last}): "
                f"{sys.executable} or the checkout lies in a folder nobody may read (such as "
                "/root, mode 700, or a mktemp -d folder); clone it where others can read it "
                "to run this test"
            )
    return None, why


@pytest.fixture
def foreign_owned(tiny: TinyArtifacts) -> Iterator[tuple[Path, list[str]]]:
    """A cache folder this test's reader can read but not write, and how to run it."""
    root = Path(tempfile.mkdtemp(prefix="aot-read-only-", dir="/tmp"))
    try:
        location = root / "cache"
        with Cache(location) as writer:
            for n in (1, 2, 3):
                writer.put_artifact(tiny.by_size[n])
        prefix, why_not = _as_other_user()
        if prefix is not None:  # root owns it, 0755/0644: nobody reads, never writes
            for path in (root, *root.rglob("*")):
                path.chmod(0o755 if path.is_dir() else 0o644)
        elif os.geteuid() == 0:
            pytest.skip(f"running as root, and no reader as another user: {why_not}")
        else:  # another user: take the write permission away
            prefix = []
            for path in (*root.rglob("*"), root):
                path.chmod(0o555 if path.is_dir() else 0o444)
        assert not (location / "index.sqlite-shm").exists()  # the writer closed: no -shm
        yield location, prefix
    finally:
        for path in (root, *root.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        shutil.rmtree(root, ignore_errors=True)


def _env() -> dict[str, str]:
    env = child_env()
    env["HOME"] = "/nonexistent"  # nothing of the reader's may land in a home folder
    return env


def test_a_cache_the_reader_cannot_write_is_served(foreign_owned: tuple[Path, list[str]]) -> None:
    location, prefix = foreign_owned
    before = snapshot(location)
    proc = subprocess.run(
        [*prefix, sys.executable, "-c", READER, str(location), "3", "serve"],
        capture_output=True, text=True, env=_env(), cwd="/", timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = [1.0, 3.0, 5.0]
    assert result == {"read_only": expected, "default": expected, "entries": 3, "verify_ok": True}
    assert snapshot(location) == before  # no -wal, no -shm, no touch of a row


def test_a_reader_follows_a_writer_that_opens_the_cache_later(foreign_owned: tuple[Path, list[str]], tiny: TinyArtifacts) -> None:
    """Opened immutable (no writer), the reader reopens when a writer came and went
    (the file changed) and reads through the writer's -shm while one is open; it sees
    every commit."""
    location, prefix = foreign_owned
    if not prefix:
        pytest.skip("needs a second user: a writer cannot write a folder made read-only")
    reader = subprocess.Popen(
        [*prefix, sys.executable, "-c", READER, str(location), "3", "watch"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(), cwd="/",
    )
    try:
        def count() -> dict[str, int]:
            ready, _, _ = select.select([reader.stdout], [], [], 120)
            assert ready, "the reader did not answer within 120 s"
            line = reader.stdout.readline()
            assert line, reader.stderr.read()[-3000:]
            return json.loads(line)

        def ask() -> None:
            reader.stdin.write("again\n")
            reader.stdin.flush()

        assert count() == {"index": 3, "reader": 3}
        with Cache(location) as writer:  # a writer comes and goes between two reads
            writer.put_artifact(tiny.by_size[4])
        assert not (location / "index.sqlite-shm").exists()
        ask()
        assert count() == {"index": 4, "reader": 4}  # the file changed: reopened
        with Cache(location) as writer:  # the owner writes while the reader is open
            writer.put_artifact(tiny.by_size[5])
            writer.index.count()  # keeps a pooled connection: the -shm stays
            assert (location / "index.sqlite-shm").exists()
            ask()
            assert count() == {"index": 5, "reader": 5}
            writer.put_artifact(tiny.by_size[6])
            ask()
            assert count() == {"index": 6, "reader": 6}
        ask()  # after the writer closed
        assert count() == {"index": 6, "reader": 6}
        reader.stdin.close()
        assert reader.wait(timeout=60) == 0, reader.stderr.read()[-3000:]
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()


@pytest.mark.postgres
def test_a_read_only_postgresql_index_cannot_write_even_by_mistake(postgres_url: str, tiny: TinyArtifacts) -> None:
    """The server refuses writes on a read-only open's connections, whatever code path
    tries (the index refuses them itself before that)."""
    import sqlalchemy as sa

    from aot.cache.index.sql import Index

    with Cache(postgres_url) as writer:
        writer.put_artifact(tiny.by_size[1])
    index = Index(postgres_url, read_only=True)
    try:
        with pytest.raises(sa.exc.InternalError, match="read-only transaction"):
            with index.engine.begin() as conn:
                conn.execute(sa.text("UPDATE artifacts SET hits = hits + 1"))
        assert index.count() == 1
    finally:
        index.close()
