"""Each test of a multi-process job is bounded as a whole (harness.TEST_SECONDS)."""

from __future__ import annotations

import pytest

from tests.distributed import harness


@pytest.fixture(autouse=True)
def _bounded_test():
    harness.start_test_clock()
    yield
    harness.start_test_clock(None)
