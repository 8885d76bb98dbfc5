"""Keeping compile claims alive: :class:`ClaimHeartbeat`.

A claim (``jit_claims``, :meth:`aot.cache.index.jit.IndexJit.jit_claim`) lasts
``seconds``; a holder whose compile takes longer extends it from a small thread, so a
long compile is not compiled twice, while a killed holder's claims still expire. No
SQLAlchemy here: a warm-up of a folder cache imports this module without it.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aot.cache.index.jit import IndexJit

logger = logging.getLogger(__name__)

__all__ = ["ClaimHeartbeat"]


class ClaimHeartbeat:
    """Keeps a holder's compile claims alive while it compiles: a daemon thread that
    extends every claim :meth:`hold` s every ``seconds / 3`` (a compile longer than
    ``seconds`` is then not compiled twice; a killed holder's claims still expire
    ``seconds`` after its last beat). Use as a context manager."""

    def __init__(self, index: IndexJit, holder: str, seconds: float) -> None:
        self.index = index
        self.holder = holder
        self.seconds = seconds
        self.beats = 0  # extensions made (that held at least one claim)
        self._keys: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._run, name="aot-claim-heartbeat", daemon=True)

    def __enter__(self) -> ClaimHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def hold(self, key: str) -> None:
        with self._lock:
            self._keys.add(key)

    def drop(self, key: str) -> None:
        with self._lock:
            self._keys.discard(key)

    def wait_beats(self, count: int, timeout: float) -> bool:
        """Waits until ``count`` beats were made (tests, diagnostics); False on timeout."""
        with self._beat:
            return self._beat.wait_for(lambda: self.beats >= count, timeout)

    def _run(self) -> None:
        while not self._stop.wait(max(self.seconds / 3.0, 0.05)):
            with self._lock:
                keys = set(self._keys)
            if not keys:
                continue
            held = self.index.jit_claim_extend(keys, self.holder, self.seconds)
            lost = keys - held
            if lost:
                logger.warning("compile claims of %s expired before their heartbeat: %s", self.holder, sorted(lost))
            with self._beat:
                if held:
                    self.beats += 1
                self._beat.notify_all()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
