"""aot.slices in one process: the bound's setting, and nothing to coordinate. The
multi-process protocol is tested in tests/distributed/test_slice.py."""

from __future__ import annotations

import jax
import pytest

from aot import slices
from aot.errors import UsageError


def test_the_wait_bound_comes_from_its_variable(monkeypatch) -> None:
    monkeypatch.delenv(slices.ENV_WAIT, raising=False)
    assert slices.wait_seconds() == slices.WAIT_SECONDS == 600
    monkeypatch.setenv(slices.ENV_WAIT, "2.5")
    assert slices.wait_seconds() == 2.5


@pytest.mark.parametrize("raw", ["0", "-3", "soon"])
def test_a_wait_bound_that_is_not_a_positive_number_is_refused(monkeypatch, raw: str) -> None:
    monkeypatch.setenv(slices.ENV_WAIT, raw)
    with pytest.raises(UsageError, match=f"AOT_SLICE_WAIT_SECONDS={raw!r}: expected a positive number"):
        slices.wait_seconds()


def test_one_process_is_no_slice_and_just_does_the_work() -> None:
    assert slices.slice_of(jax.devices()) is None  # no jax.distributed here
    calls = []
    result = slices.once_per_slice(
        "k", jax.devices(), lead=lambda: calls.append("lead") or 1, follow=lambda _: calls.append("follow") or 2,
    )
    assert (result, calls) == (1, ["lead"])
