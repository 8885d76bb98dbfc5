"""Helpers of tests/jax_upgrade: processes of two JAX releases on one cache, this
one's Python and another release's: ``AOT_TEST_OTHER_JAX_PYTHON`` (a venv's ``bin/python`` holding another jax and jaxlib,
and this checkout installed with ``pip install --no-deps -e .``), else the oldest other
release of ``AOT_TEST_JAX_PYTHONS`` (``"RELEASE=PYTHON ..."``: the venvs .ci/run builds
for the version suite). Without either these tests skip and say why."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import jax

from tests.cli.helpers import REPO

OTHER_PYTHON_ENV = "AOT_TEST_OTHER_JAX_PYTHON"
RELEASE_PYTHONS_ENV = "AOT_TEST_JAX_PYTHONS"
#: Bound on one process of either release (an import of JAX, a few compiles).
PROCESS_SECONDS = 300


def run(python: str, args: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` from the repository root, with this process's environment (its
    8 CPU devices, no environment records)."""
    done = subprocess.run(
        [python, *args], cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=PROCESS_SECONDS,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{python} {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def aot_cli(python: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The ``aot`` command of ``python``'s release."""
    return run(python, ["-c", "from aot.cli.main import main; main()", *args], check=check)


def worker(python: str, *args: str) -> dict[str, object]:
    """tests/jax_upgrade/release_worker.py under ``python``: its JSON line."""
    done = run(python, ["-m", "tests.jax_upgrade.release_worker", *args])
    return json.loads(done.stdout.strip().splitlines()[-1])


def release_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3] if p.isdigit())


def from_release_pythons() -> str:
    """The oldest release of ``AOT_TEST_JAX_PYTHONS`` other than this one ("": none)."""
    found = {}
    for item in os.environ.get(RELEASE_PYTHONS_ENV, "").split():
        release, _, python = item.partition("=")
        if release and python and release != jax.__version__ and Path(python).exists():
            found[release] = python
    return found[min(found, key=release_tuple)] if found else ""
