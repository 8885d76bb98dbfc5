"""Several processes serving one folder cache keep its index intact (issue 49).

Each round: four replicas serve ``rel.tiny`` for 1 to 4 s with ``aot.load``'s
read-ahead on (the default), their statistics flushed every 0.2 s and at the end, two by
``Cache.close()`` and two at interpreter exit; a fifth is killed inside its statistics
flush (the ``stats.flushing`` pause point: its transaction open, the write lock held).
When the first replica has ended, a late replica starts, and a writer warms an entry
up, removes the previous round's (``aot rm``) and runs ``aot gc``.
After each round: ``PRAGMA integrity_check`` is ok, the statistics count exactly the
calls of the replicas that ended normally (none of the killed one's), and every entry
serves. With the header read by ``open()`` that issue 49 removed, the index broke in
most runs (docs/reliability.md, "Nothing opens the index outside SQLite").
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import aot
from aot.cache.cache import Cache

from tests.reliability.helpers import HERE, TinyArtifacts, child_env

WORKER = HERE / "index_stress_worker.py"
ROUNDS = 3
ENDS = ("close", "exit", "close", "exit")


def _start(*args: str, pause: str | None = None) -> subprocess.Popen[str]:
    env = child_env()
    env.pop("AOT_READ_AHEAD", None)  # on: the default
    env["AOT_STATS_EXIT_TIMEOUT"] = "120"  # a slow machine must not drop a count
    if pause:
        env["AOT_TEST_PAUSE"] = pause
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=HERE.parents[1],
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def _size(signature: str) -> int:
    return int(re.search(r"\[(\d+)\]", signature).group(1))  # type: ignore[union-attr]


def _check(folder: Path, expected: Counter[int]) -> None:
    index = folder / "index.sqlite"
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        rows = conn.execute("SELECT signature, calls FROM call_stats WHERE name = ?", ("rel.tiny",)).fetchall()
    finally:
        conn.close()
    counted: Counter[int] = Counter()
    for signature, calls in rows:
        counted[_size(signature)] += calls
    assert counted == expected
    with Cache(folder, read_only=True) as cache:  # read-only: its own calls are not counted
        assert cache.verify(quarantine=False).ok
        entries = cache.entries("rel.tiny")
        fn = aot.load("rel.tiny", cache=cache, strict=True)
        for entry in entries:
            n = _size(entry.signature)
            out = np.asarray(fn(np.arange(n, dtype=np.float32)))
            np.testing.assert_allclose(out, np.arange(n, dtype=np.float32) * 2.0 + 1.0)
    assert len(entries) == 4  # f32[1..3] and this round's warm-up


@pytest.mark.slow
def test_replicas_writers_and_a_killed_flush_leave_the_index_intact(tmp_path: Path, tiny: TinyArtifacts) -> None:
    folder = tmp_path / "cache"
    with Cache(folder) as cache:
        for n in (1, 2, 3):
            cache.put_artifact(tiny.by_size[n])
    expected: Counter[int] = Counter()
    started = time.monotonic()
    for round_ in range(1, ROUNDS + 1):
        # Staggered: replicas end while others serve and flush, and newcomers (the
        # writer, a late replica) open the index after the first one closed its last
        # connection (which deletes -wal and -shm when it believes it is the last).
        servers = [_start("serve", str(folder), str(seconds), end) for seconds, end in zip((1, 2, 3, 4), ENDS)]
        killed = _start("serve", str(folder), str(0.5 * round_), "kill", pause="stats.flushing=kill")
        deadline = time.monotonic() + 300
        while servers[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        servers.append(_start("serve", str(folder), "2", "close"))
        writer = _start("write", str(folder), str(round_))
        for proc in servers:
            code, out, err = _finish(proc)
            assert code == 0, err[-3000:]
            calls = json.loads(out.strip().splitlines()[-1])
            expected.update({int(n): c for n, c in calls.items()})
        code, _, err = _finish(killed)
        assert code == -9, err[-3000:]  # SIGKILL inside its flush
        code, _, err = _finish(writer)
        assert code == 0, err[-3000:]
        _check(folder, expected)
    print(f"{ROUNDS} rounds in {time.monotonic() - started:.1f} s")
