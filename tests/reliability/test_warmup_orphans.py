"""Warm-up workers do not outlive their parent.

``aot warmup --jobs 2 --isolate`` compiles in spawned worker processes. After ``kill -9`` of
the CLI process they used to keep compiling forever, and the multiprocessing resource
tracker with them (it exits only when every holder of its pipe has). Now each worker
is killed by the kernel when its parent dies (Linux ``PR_SET_PDEATHSIG``) or exits
through a watchdog thread (everywhere), and the tracker follows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.reliability.helpers import child_env

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the processes")


def _children(pid: int) -> dict[int, str]:
    """Live children of ``pid``: pid -> command line."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, ppid = fields[0], int(fields[1])
        if ppid == pid and state != "Z":
            out[int(entry.name)] = cmdline
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def test_workers_and_the_resource_tracker_exit_when_the_warmup_is_killed(tmp_path: Path) -> None:
    (tmp_path / "slowmod.py").write_text(textwrap.dedent('''
        import time

        def slow(x):
            time.sleep(300)  # traced in the worker: the compile never finishes
            return x * 2.0
    '''))
    manifest = tmp_path / "warmup.toml"
    manifest.write_text(textwrap.dedent('''
        [[function]]
        name     = "slow"
        function = "slowmod:slow"
        args     = ["f32[{n}]"]
        vary     = { n = [1, 2] }
    '''))
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cli = subprocess.Popen(
        [sys.executable, "-m", "aot", "--cache", str(tmp_path / "cache"), "warmup", str(manifest), "--jobs", "2", "--isolate"],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    seen: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            seen.update(_children(cli.pid))
            workers = [p for p, cmd in seen.items() if "spawn_main" in cmd]
            if len(workers) >= 2 and any("resource_tracker" in cmd for cmd in seen.values()):
                break
            assert cli.poll() is None, cli.stderr.read().decode() if cli.stderr else ""
            time.sleep(0.2)
        else:
            pytest.fail(f"the warm-up did not start 2 workers and a resource tracker: {seen}")
        time.sleep(2.0)  # the workers import JAX and start tracing the slow function
        seen.update(_children(cli.pid))
        assert all(_alive(p) for p in seen), "a worker died before the parent was killed"

        cli.send_signal(signal.SIGKILL)
        cli.wait(timeout=10)
        start = time.monotonic()
        while time.monotonic() - start < 10 and any(_alive(p) for p in seen):
            time.sleep(0.1)
        left = {p: seen[p][:100] for p in seen if _alive(p)}
        assert not left, f"still running {time.monotonic() - start:.1f}s after kill -9 of the warm-up: {left}"
        print(f"{len(seen)} children of the killed warm-up gone {time.monotonic() - start:.2f}s after kill -9")
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        for pid in seen:  # only the processes this test started
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
