"""``aot.distributed_job``: what ``--distributed`` reads from the environment, and the
refusals that need no job (the 2-process runs are in tests/cli/test_distributed_cli.py)."""

from __future__ import annotations

import jax
import pytest

from aot.distributed_job import DEFAULT_TIMEOUT, join, job_timeout, requested
from aot.errors import DistributedJobError


def test_the_environment_variable_asks_as_the_flag_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AOT_DISTRIBUTED", raising=False)
    assert not requested(False) and requested(True)
    monkeypatch.setenv("AOT_DISTRIBUTED", "1")
    assert requested(False)
    monkeypatch.setenv("AOT_DISTRIBUTED", "0")
    assert not requested(False)


def test_the_timeout_is_seconds_and_a_bad_one_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AOT_DISTRIBUTED_TIMEOUT", raising=False)
    assert job_timeout() == DEFAULT_TIMEOUT
    monkeypatch.setenv("AOT_DISTRIBUTED_TIMEOUT", "42.5")
    assert job_timeout() == 42.5
    monkeypatch.setenv("AOT_DISTRIBUTED_TIMEOUT", "soon")
    with pytest.raises(DistributedJobError, match=r"AOT_DISTRIBUTED_TIMEOUT must be a number of seconds > 0, got 'soon'"):
        job_timeout()


def test_joining_after_the_backend_started_is_refused_before_jax_is_asked() -> None:
    jax.devices()  # this process's backend is up (tests/conftest.py)
    with pytest.raises(DistributedJobError, match="backend already started.*fresh process"):
        join(timeout=5)
