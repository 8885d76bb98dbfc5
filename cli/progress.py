"""Warm-up progress on stderr: counts, the entry that just finished, and an ETA.

The ETA is the mean time per *finished* entry times the entries left, from the start
of the run. (A rate from the last few updates swings wildly: hits finish in
milliseconds and compiles in seconds, so click's own bar said 4 minutes for a 12 s
run.) Until an entry has been *compiled* there is no ETA: hits and failures finish in
milliseconds, so a mean of those alone promised a second before a long compile.
"""

from __future__ import annotations

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
    """Redraws one line on stderr per finished entry (``\\r``, no newline until done)."""

    BAR_WIDTH = 24

    def __init__(self, total: int, label: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.label = label
        self.done = 0
        self.failed = 0
        self.compiled = 0  # entries compiled by this run: the ones that measure the work
        self._clock = clock
        self._start = clock()
        self._width = 0

    def line(self, last: str = "") -> str:
        filled = self.BAR_WIDTH * self.done // self.total if self.total else self.BAR_WIDTH
        bar = "#" * filled + "-" * (self.BAR_WIDTH - filled)
        eta = None
        if self.compiled:
            eta = eta_seconds(self._clock() - self._start, self.done, self.total)
        text = f"{self.label} [{bar}] {self.done}/{self.total}"
        if self.failed:
            text += f", {self.failed} failed"
        if eta is not None and self.done < self.total:
            text += f", ETA {format_duration(eta)}"
        if last:
            text += f"  {last}"
        return text

    def start(self) -> None:
        self._draw(self.line())

    def update(self, label: str, failed: bool = False, compiled: bool = False) -> None:
        self.done += 1
        self.failed += int(failed)
        self.compiled += int(compiled)
        self._draw(self.line(label))

    def finish(self) -> None:
        click.echo("", err=True)

    def _draw(self, text: str) -> None:
        padding = " " * max(0, self._width - len(text))
        self._width = len(text)
        click.echo(f"\r{text}{padding}", err=True, nl=False)
