"""aot.ahead: an executable deserialized ahead is handed to one load, for the same digest
onto the same devices of the same backend, and never after it was forgotten."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from aot import ahead

BACKEND = object()
DIGEST = "ab" * 32


@pytest.fixture(autouse=True)
def _empty() -> Iterator[None]:
    assert ahead.pending() == []
    yield
    ahead.forget(ahead.pending())  # a failed test must not leak into the next


def test_a_finished_result_is_taken_once_for_its_digest_devices_and_backend() -> None:
    j = ahead.job(DIGEST, [0])
    assert ahead.plan([j], BACKEND) == [j]
    assert ahead.begin(j)
    ahead.finish(j, "executable")
    assert ahead.take(DIGEST, [1], BACKEND) is None  # other devices
    assert ahead.take(DIGEST, [0], object()) is None  # another backend client
    assert ahead.take("cd" * 32, [0], BACKEND) is None
    assert ahead.take(DIGEST, (0,), BACKEND) == "executable"
    assert ahead.take(DIGEST, [0], BACKEND) is None  # handed out once
    assert ahead.pending() == []


def test_a_load_waits_for_a_running_deserialization() -> None:
    j = ahead.job(DIGEST, [0])
    ahead.plan([j], BACKEND)
    assert ahead.begin(j)
    got: list[object] = []
    taker = threading.Thread(target=lambda: got.append(ahead.take(DIGEST, [0], BACKEND)))
    taker.start()
    time.sleep(0.05)
    assert got == []  # waiting
    ahead.finish(j, "executable")
    taker.join(5)
    assert got == ["executable"]


def test_a_load_that_comes_first_takes_a_planned_job_over() -> None:
    j = ahead.job(DIGEST, [0])
    ahead.plan([j], BACKEND)
    assert ahead.take(DIGEST, [0], BACKEND) is None  # the load deserializes itself
    assert not ahead.begin(j)  # and the reader skips it
    assert ahead.pending() == []


def test_a_failed_deserialization_leaves_the_load_to_xla() -> None:
    j = ahead.job(DIGEST, [0])
    ahead.plan([j], BACKEND)
    ahead.begin(j)
    ahead.finish(j, None)
    assert ahead.take(DIGEST, [0], BACKEND) is None
    assert ahead.pending() == []


def test_forgotten_jobs_are_dropped_and_a_waiting_load_deserializes_itself() -> None:
    j = ahead.job(DIGEST, [0])
    ahead.plan([j], BACKEND)
    ahead.begin(j)
    got: list[object] = []
    taker = threading.Thread(target=lambda: got.append(ahead.take(DIGEST, [0], BACKEND)))
    taker.start()
    time.sleep(0.05)
    ahead.forget([j])
    taker.join(5)
    assert got == [None]
    ahead.finish(j, "executable")  # finished after: dropped
    assert ahead.pending() == []
    assert ahead.take(DIGEST, [0], BACKEND) is None


def test_a_job_planned_by_another_load_is_not_owned_twice() -> None:
    j = ahead.job(DIGEST, [0])
    assert ahead.plan([j], BACKEND) == [j]
    assert ahead.plan([j, ahead.job(DIGEST, [1])], BACKEND) == [ahead.job(DIGEST, [1])]
