"""The Pythons of the other supported JAX releases, for cross-release tests.

.ci/run builds a venv per release (.ci/version-suite.sh RELEASE --build) and exports
``AOT_TEST_JAX_PYTHONS`` = ``"RELEASE=PYTHON RELEASE=PYTHON ..."`` (the newest
release's is the full suite's venv). A test that runs a process of another release
takes its Python from :func:`release_pythons`, and skips, saying why, where it is unset.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "AOT_TEST_JAX_PYTHONS"


def release_pythons() -> dict[str, Path]:
    """``{release: python}`` from ``AOT_TEST_JAX_PYTHONS``; empty when unset."""
    found = {}
    for item in os.environ.get(ENV, "").split():
        release, _, python = item.partition("=")
        if release and python:
            found[release] = Path(python)
    return found


def other_release_python(*, not_release: str) -> tuple[str, Path]:
    """``(release, python)`` of a release other than ``not_release`` (the oldest one
    listed); skips the test when there is none."""
    others = {r: p for r, p in release_pythons().items() if r != not_release and p.exists()}
    if not others:
        pytest.skip(f"{ENV} names no venv of a JAX release other than {not_release} (.ci/run builds them)")
    from aot.jaxcompat.versions import release_tuple

    release = min(others, key=release_tuple)
    return release, others[release]
