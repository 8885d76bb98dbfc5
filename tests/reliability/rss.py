"""Run a Python script in a fresh process whose peak RSS (``ru_maxrss``) starts from
its own size, not its parent's.

Linux carries ``ru_maxrss`` across ``exec``: a child forked straight from pytest (with
JAX loaded: hundreds of MB) starts with pytest's peak, which hides any growth below
it. Forking from a small ``sh`` first gives the child a fresh count.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

# `; exit $?` keeps sh from exec-ing the command in place: it forks it.
_FORK_FROM_SH = ["sh", "-c", '"$@"; exit $?', "sh"]


def run_measured(script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> dict[str, Any]:
    """Runs ``python -c script args...``; the JSON object its last stdout line prints."""
    done = subprocess.run(
        [*_FORK_FROM_SH, sys.executable, "-c", script, *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))
