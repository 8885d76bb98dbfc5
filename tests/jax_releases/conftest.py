"""Processes of two JAX releases on one cache: this one's Python and another release's,
named by ``AOT_TEST_OTHER_JAX_PYTHON`` (a venv's ``bin/python`` holding another jax and
jaxlib, and this checkout installed with ``pip install --no-deps -e .``; the CI version
suite makes one per release). Without it these tests skip and say why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import jax
import pytest

from tests.cli.helpers import REPO

OTHER_PYTHON_ENV = "AOT_TEST_OTHER_JAX_PYTHON"
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
    """tests/jax_releases/release_worker.py under ``python``: its JSON line."""
    done = run(python, ["-m", "tests.jax_releases.release_worker", *args])
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def other_python() -> tuple[str, str]:
    """(python, jax version) of another JAX release; skips when none is given."""
    python = os.environ.get(OTHER_PYTHON_ENV, "").strip()
    if not python:
        pytest.skip(f"{OTHER_PYTHON_ENV} not set: the cross-release tests need another JAX release's "
                    "venv (its bin/python, this checkout installed with --no-deps -e .)")
    if not Path(python).exists():
        pytest.fail(f"{OTHER_PYTHON_ENV}={python}: no such file")
    probe = run(python, ["-c", "import jax, aot, json; print(json.dumps([jax.__version__, aot.__file__]))"])
    version, aot_file = json.loads(probe.stdout.strip().splitlines()[-1])
    if version == jax.__version__:
        pytest.fail(f"{OTHER_PYTHON_ENV}={python} runs jax {version}, this release: give another one")
    if not Path(aot_file).resolve().is_relative_to(REPO):
        pytest.fail(f"{OTHER_PYTHON_ENV}={python} imports aot from {aot_file}, not this checkout ({REPO}): "
                    "install it there with pip install --no-deps -e .")
    return python, version


@pytest.fixture
def this_python() -> str:
    return sys.executable
