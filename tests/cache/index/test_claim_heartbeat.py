"""ClaimHeartbeat (aot.cache.index.claim_heartbeat): a beat that fails never ends the
thread, and a claim held ``for_seconds`` stops being renewed after that."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import pytest

from aot.cache.index.claim_heartbeat import ClaimHeartbeat


class FlakyIndex:
    """Raises on its first extension (an unexpected error, not a CacheError), then
    extends whatever it is asked for and remembers it."""

    def __init__(self) -> None:
        self.calls: list[set[str]] = []

    def jit_claim_extend(self, keys: Iterable[str], holder: str, seconds: float) -> set[str]:
        self.calls.append(set(keys))
        if len(self.calls) == 1:
            raise RuntimeError("the connection pool was disposed")
        return set(keys)


def test_a_failing_beat_never_ends_the_heartbeat(caplog: pytest.LogCaptureFixture) -> None:
    index = FlakyIndex()
    with ClaimHeartbeat(index, "holder", 0.3) as beat:  # type: ignore[arg-type]
        beat.hold("k")
        assert beat.wait_beats(2, timeout=30)  # beats again after the failure
        assert beat.running
    assert not beat.running
    assert any("could not extend" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_a_claim_held_for_seconds_is_no_longer_renewed_after_them() -> None:
    index = FlakyIndex()
    with ClaimHeartbeat(index, "holder", 0.15) as beat:  # type: ignore[arg-type]
        beat.hold("bounded", for_seconds=0.3)
        beat.hold("kept")
        time.sleep(1.0)
        assert beat.wait_beats(1, timeout=30)
        recent = index.calls[-1]
    assert recent == {"kept"}
    assert any("bounded" in call for call in index.calls[1:])  # renewed while in its bound
