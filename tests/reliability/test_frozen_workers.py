"""A stopped (SIGSTOP) warm-up worker does not hang `aot warmup` (issue 23, item 1).

The parent waited on each worker's pipe without a bound: a worker stopped mid-item
kept the warm-up waiting for ever. Compile time stays unbounded (a compile may take
minutes); a worker seen *stopped* longer than AOT_WORKER_STOPPED_TIMEOUT is killed, its
entry fails with the reason, and the others are stored.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.reliability.helpers import child_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to see a stopped process"),
]

STOPPED_S = 2.0
GIVE_UP_S = 120.0


def test_a_stopped_worker_is_killed_after_the_bound_and_only_its_entry_fails(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "stopmod.py").write_text(textwrap.dedent(f'''
        import os, time
        from pathlib import Path

        def traced(x):
            # Says which process traces which bucket; slow enough that the parent
            # and the worker each take items (this process alone would need 8 s: its
            # worker is ready sooner).
            Path({str(marks)!r}, f"{{os.getpid()}}-{{x.shape[0]}}").touch()
            time.sleep(1.0)
            return x * 2.0
    '''))
    manifest = tmp_path / "warmup.toml"
    manifest.write_text(textwrap.dedent('''
        [[function]]
        name     = "stop"
        function = "stopmod:traced"
        args     = ["f32[{n}]"]
        vary     = { n = [1, 2, 3, 4, 5, 6, 7, 8] }
    '''))
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["AOT_WORKER_STOPPED_TIMEOUT"] = f"{STOPPED_S:g}"
    cache = str(tmp_path / "cache")
    cli = subprocess.Popen(
        [sys.executable, "-m", "aot", "--cache", cache, "warmup", str(manifest), "--jobs", "2"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    stopped: tuple[int, str] | None = None
    try:
        deadline = time.monotonic() + GIVE_UP_S
        while stopped is None:
            assert cli.poll() is None, cli.communicate()
            assert time.monotonic() < deadline, "no worker traced an item"
            for mark in marks.iterdir():
                pid, bucket = mark.name.split("-")
                if int(pid) != cli.pid:
                    os.kill(int(pid), signal.SIGSTOP)  # the worker, inside its item
                    stopped = int(pid), bucket
                    break
            time.sleep(0.01)
        began = time.monotonic()
        try:
            stdout, stderr = cli.communicate(timeout=GIVE_UP_S)
        except subprocess.TimeoutExpired:
            cli.kill()
            stdout, stderr = cli.communicate()
            pytest.fail(f"aot warmup still waited on the stopped worker after {GIVE_UP_S:g} s: {stderr[-2000:]}")
        seconds = time.monotonic() - began
    finally:
        if stopped is not None:
            try:
                os.kill(stopped[0], signal.SIGCONT)
                os.kill(stopped[0], signal.SIGKILL)
            except ProcessLookupError:
                pass
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert stopped is not None
    pid, bucket = stopped
    assert cli.returncode == 1, (stdout, stderr)
    assert f"worker {pid} was stopped (SIGSTOP) for {STOPPED_S:g} s; killed" in stdout + stderr, (stdout, stderr)
    listed = subprocess.run([sys.executable, "-m", "aot", "--cache", cache, "ls", "--json"], env=env,
                            capture_output=True, text=True, timeout=120, check=True)
    signatures = sorted(e["signature"] for e in json.loads(listed.stdout)["entries"])
    assert len(signatures) == 7 and not any(f"f32[{bucket}]" in s for s in signatures), signatures
    # The bound, then the rest of the manifest (a new worker or this process compiles it).
    assert seconds < STOPPED_S + 30.0, (seconds, stderr)
    print(f"stopped worker {pid} (bucket {bucket}): warm-up exited 1 after {seconds:.1f} s "
          f"(bound {STOPPED_S:g} s)")
