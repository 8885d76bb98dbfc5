"""Warm-up progress on stderr: counts, the entry that just finished, and an ETA.

The ETA is the mean time per *finished* entry times the entries left, from the start
of the run. (A rate from the last few updates swings wildly: hits finish in
milliseconds and compiles in seconds, so click's own bar said 4 minutes for a 12 s
run.) Until an entry has been *compiled* there is no ETA: hits and failures finish in
milliseconds, so a mean of those alone promised a second before a long compile.

The line shows the time elapsed since the start and is redrawn every
:attr:`Progress.TICK_SECONDS` by a small thread between finished entries, so the bar
moves during a compile of many seconds instead of sitting on its last frame.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import click


def eta_seconds(elapsed: float, done: int, total: int) -> float | None:
    """Seconds left, from the mean time of the ``done`` finished entries."""
    if done <= 0 or total <= done:
        return None if done <= 0 else 0.0
    return elapsed / done * (total - done)


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class Progress:
    """Redraws one line on stderr per finished entry (``\\r``, no newline until done),
    and every :attr:`TICK_SECONDS` in between (the elapsed time moves)."""

    BAR_WIDTH = 24
    TICK_SECONDS = 1.0

    def __init__(self, total: int, label: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.label = label
        self.done = 0
        self.failed = 0
        self.compiled = 0  # entries compiled by this run: the ones that measure the work
        self._clock = clock
        self._start = clock()
        self._width = 0
        self._last = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def line(self, last: str = "") -> str:
        filled = self.BAR_WIDTH * self.done // self.total if self.total else self.BAR_WIDTH
        bar = "#" * filled + "-" * (self.BAR_WIDTH - filled)
        eta = None
        if self.compiled:
            eta = eta_seconds(self._clock() - self._start, self.done, self.total)
        text = f"{self.label} [{bar}] {self.done}/{self.total}"
        if self.failed:
            text += f", {self.failed} failed"
        text += f", {format_duration(self._clock() - self._start)} elapsed"
        if eta is not None and self.done < self.total:
            text += f", ETA {format_duration(eta)}"
        if last:
            text += f"  {last}"
        return text

    def start(self) -> None:
        """Draws the first frame and starts redrawing every :attr:`TICK_SECONDS`."""
        self.tick()
        self._ticker = threading.Thread(target=self._tick_until_finished, name="aot-progress", daemon=True)
        self._ticker.start()

    def update(self, label: str, failed: bool = False, compiled: bool = False) -> None:
        with self._lock:
            self.done += 1
            self.failed += int(failed)
            self.compiled += int(compiled)
            self._last = label
            self._draw(self.line(label))

    def tick(self) -> None:
        """Redraws the current line (the elapsed time moves)."""
        with self._lock:
            self._draw(self.line(self._last))

    def finish(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        click.echo("", err=True)

    def _tick_until_finished(self) -> None:
        while not self._stop.wait(self.TICK_SECONDS):
            self.tick()

    def _draw(self, text: str) -> None:
        padding = " " * max(0, self._width - len(text))
        self._width = len(text)
        click.echo(f"\r{text}{padding}", err=True, nl=False)
