"""Fixtures of tests/jax_upgrade: this release's Python and another release's
(tests/jax_upgrade/helpers.py says where it comes from)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import jax
import pytest

from tests.cli.helpers import REPO
from tests.jax_upgrade.helpers import OTHER_PYTHON_ENV, RELEASE_PYTHONS_ENV, from_release_pythons, run


@pytest.fixture(scope="session")
def other_python() -> tuple[str, str]:
    """(python, jax version) of another JAX release; skips when none is given."""
    python = os.environ.get(OTHER_PYTHON_ENV, "").strip() or from_release_pythons()
    if not python:
        pytest.skip(f"neither {OTHER_PYTHON_ENV} nor {RELEASE_PYTHONS_ENV} names another JAX release's "
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
