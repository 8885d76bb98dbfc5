"""Statistics never hold a lock a call needs while the index is written (issue 23)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from aot.cache import stats_recorder as stats_mod
from aot.cache.stats_recorder import StatsRecorder, exit_timeout
from aot.errors import CacheError


class _FrozenSink:
    """A sink whose write blocks until released: a frozen index."""

    location = "frozen://index"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.rows: list[dict[str, Any]] = []

    def write(self, rows: list[dict[str, Any]], touches: Any) -> None:
        self.entered.set()
        assert self.release.wait(30), "never released"
        self.rows.extend(rows)


class _Entry:
    name, signature, compile_seconds = "frozen.f", "f32[1]", 0.5


@pytest.fixture(autouse=True)
def _no_background_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats_mod, "FLUSH_SECONDS", None)


def test_recording_never_waits_on_a_write_and_close_drops_after_its_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = _FrozenSink()
    recorder = StatsRecorder("frozen://index", lambda: sink)
    recorder.missed("env", "frozen.f", "f32[9]", "not found")
    flusher = threading.Thread(target=recorder.flush, daemon=True)
    flusher.start()
    try:
        assert sink.entered.wait(10)
        # The write hangs; recording and reporting go on, at once.
        began = time.monotonic()
        for _ in range(100):
            recorder.loaded("env", _Entry(), 0.01)
            recorder.missed("env", "frozen.f", "f32[9]", "not found")
        report = recorder.report()
        assert time.monotonic() - began < 1.0
        (row,) = [r for r in report.rows if r.signature == "f32[9]"]
        assert row.misses == 101  # the one being written is still reported
        assert recorder.unflushed() == 201
        with caplog.at_level(logging.WARNING, logger=stats_mod.__name__):
            began = time.monotonic()
            assert recorder.close(timeout=0.3) is False
            closed_in = time.monotonic() - began
        assert closed_in < 2.0
        warnings = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        assert len(warnings) == 1 and "dropped 201 unflushed" in warnings[0], warnings
    finally:
        sink.release.set()
        flusher.join(10)
    assert [r["misses"] for r in sink.rows] == [1]  # the write under way finished later


def test_a_healthy_close_writes_everything() -> None:
    sink = _FrozenSink()
    sink.release.set()
    recorder = StatsRecorder("frozen://index", lambda: sink)
    recorder.missed("env", "frozen.f", "f32[9]", "not found")
    assert recorder.close(timeout=5.0) is True
    assert [r["misses"] for r in sink.rows] == [1]


def test_the_exit_timeout_comes_from_the_environment() -> None:
    assert exit_timeout({}) == 5.0
    assert exit_timeout({"AOT_STATS_EXIT_TIMEOUT": "0.5"}) == 0.5
    with pytest.raises(CacheError, match="AOT_STATS_EXIT_TIMEOUT='soon' is not a timeout"):
        exit_timeout({"AOT_STATS_EXIT_TIMEOUT": "soon"})
