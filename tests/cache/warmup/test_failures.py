"""Failures as text (aot.cache.warmup.failures): the whole message and the user's own line."""

from __future__ import annotations

import os

import jax
import pytest

import aot
from aot.cache.warmup.failures import Failure

HERE = os.path.relpath(__file__)  # frames are shown relative to the working directory


def _user_function(x):  # noqa: ANN001, ANN202
    if x > 0:  # a traced value in a Python condition
        return x
    return -x


def test_a_trace_error_keeps_jaxs_whole_message_and_the_users_line() -> None:
    with pytest.raises(Exception) as info:
        aot.lower(_user_function, "f32[]")
    failure = Failure.of(info.value)
    assert failure.type == "TracerBoolConversionError" and not failure.expected
    text = failure.describe()
    assert text.startswith("TracerBoolConversionError: Attempted boolean conversion of traced array")
    assert "The error occurred while tracing the function _user_function at " in text
    assert "depends on the value of the argument x" in text
    assert text.splitlines()[-1] == (
        f"  at {HERE}:17 in _user_function: if x > 0:  # a traced value in a Python condition"
    )
    assert "Traceback (most recent call last)" in failure.traceback


def test_jax_aot_errors_are_shown_as_they_are() -> None:
    error = aot.SpecError("malformed spec 'x'")
    failure = Failure.of(error)
    assert failure.expected and failure.frame is None
    assert failure.describe() == "malformed spec 'x'"


def test_no_user_frame_inside_libraries() -> None:
    with pytest.raises(Exception) as info:
        jax.numpy.zeros((2, 3)).reshape((4, 4))
    # The innermost frame outside jax, numpy and jax-aot is this test's line.
    assert Failure.of(info.value).frame.startswith(f"{HERE}:")
