"""``aot.distributed_job``: what ``--distributed`` reads from the environment, and the
refusals that need no job (the 2-process runs are in tests/cli/test_distributed_cli.py)."""

from __future__ import annotations

import jax
import pytest

from aot.distributed_job import DEFAULT_TIMEOUT, join, job_timeout, not_joined, requested
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


def test_who_did_not_join_is_named_from_each_side() -> None:
    # Process 0 hosts the coordinator: the others are the ones missing.
    line = not_joined(0, 4, "10.0.0.2:1234", 20.0)
    assert line.startswith(
        "process 0 of 4 waited 20 s (AOT_DISTRIBUTED_TIMEOUT) for the multi-process job to start: one or more "
        "of processes 1, 2, 3 did not connect to this process, the job's coordinator at 10.0.0.2:1234. "
    ), line
    assert "(JAX_PROCESS_ID 0 to 3)" in line and "\n" not in line
    # Another process cannot tell the coordinator's absence from another process's.
    line = not_joined(2, 4, "10.0.0.2:1234", 7.5)
    assert "process 2 of 4 waited 7.5 s" in line
    assert "the coordinator at 10.0.0.2:1234 (process 0) or another process of the job did not join" in line
    # Cluster detection that never answered: nothing known but the bound.
    assert not_joined(None, None, None, 5).startswith("this process waited 5 s (AOT_DISTRIBUTED_TIMEOUT)")
