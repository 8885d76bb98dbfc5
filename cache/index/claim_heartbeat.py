"""Keeping compile claims alive: :class:`ClaimHeartbeat`.

A claim (``jit_claims``, :meth:`aot.cache.index.jit.IndexJit.jit_claim`) lasts
``seconds``; a holder whose compile takes longer extends it from a small thread, so a
long compile is not compiled twice, while a killed holder's claims still expire. No
SQLAlchemy here: a warm-up of a folder cache imports this module without it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aot.cache.index.jit import IndexJit

logger = logging.getLogger(__name__)

__all__ = ["ClaimHeartbeat"]


class ClaimHeartbeat:
    """Keeps a holder's compile claims alive while it compiles: a daemon thread that
    extends every claim :meth:`hold` s every ``seconds / 3`` (a compile longer than
    ``seconds`` is then not compiled twice; a killed holder's claims still expire
    ``seconds`` after its last beat). Use as a context manager, or :meth:`start` and
    :meth:`close`. Never raises from its thread: a beat that fails is logged, and the
    claims it did not extend expire on their own."""

    def __init__(self, index: IndexJit, holder: str, seconds: float) -> None:
        self.index = index
        self.holder = holder
        self.seconds = seconds
        self.beats = 0  # extensions made (that held at least one claim)
        self._keys: dict[str, float | None] = {}  # key -> renewed until (monotonic), None: always
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._run, name="aot-claim-heartbeat", daemon=True)

    def __enter__(self) -> ClaimHeartbeat:
        self.start()
        return self

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def hold(self, key: str, *, for_seconds: float | None = None) -> None:
        """Extends ``key``'s claim at every beat (for at most ``for_seconds`` from now:
        then it is left to expire)."""
        with self._lock:
            self._keys[key] = None if for_seconds is None else time.monotonic() + for_seconds

    def drop(self, key: str) -> None:
        with self._lock:
            self._keys.pop(key, None)

    def wait_beats(self, count: int, timeout: float) -> bool:
        """Waits until ``count`` beats were made (tests, diagnostics); False on timeout."""
        with self._beat:
            return self._beat.wait_for(lambda: self.beats >= count, timeout)

    def _run(self) -> None:
        while not self._stop.wait(max(self.seconds / 3.0, 0.05)):
            now = time.monotonic()
            with self._lock:
                for key in [k for k, until in self._keys.items() if until is not None and until <= now]:
                    del self._keys[key]
                    logger.warning("compile claim of %s on %s: no longer renewed (its bound passed); "
                                   "it expires in %.0f s", self.holder, key, self.seconds)
                keys = set(self._keys)
            if not keys:
                continue
            try:
                held = self.index.jit_claim_extend(keys, self.holder, self.seconds)
            except Exception as e:  # noqa: BLE001 - never end the thread: the claims expire
                logger.warning("compile claims of %s: could not extend them (%s: %s)", self.holder,
                               type(e).__name__, e)
                continue
            lost = keys - held
            if lost:
                logger.warning("compile claims of %s expired before their heartbeat: %s", self.holder, sorted(lost))
            with self._beat:
                if held:
                    self.beats += 1
                self._beat.notify_all()

    def close(self, *, wait: bool = True) -> None:
        """Stops the beats; ``wait=False``: without waiting for a beat under way (at
        exit: the thread is a daemon)."""
        self._stop.set()
        if wait and self._thread.is_alive():
            self._thread.join()
