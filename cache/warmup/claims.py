"""Compile once across warm-up runners without ``--shard``: compile claims.

Several ``aot warmup`` runners of one manifest into one shared cache each lower every
entry (a warm-up always lowers); before compiling one they claim its key in the
index (:meth:`~aot.cache.index.jit.IndexJit.jit_claim`, the table the jit entries'
compile-once uses). A runner that finds an entry claimed by a live holder moves on,
and comes back at the end to wait for it (:meth:`WarmupClaims.wait_for`: bounded by
``wait_seconds``); a holder's claim lasts ``claim_seconds`` past its last heartbeat
(:class:`~aot.cache.index.claim_heartbeat.ClaimHeartbeat`), so a killed holder's entries are
compiled by the others once it expires.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING

from aot.cache.index.claim_heartbeat import ClaimHeartbeat
from aot.cache.storage.locations import DATABASE, classify_location
from aot.cache.warmup.steps import ItemResult, Lowered, load_stored

if TYPE_CHECKING:
    from aot.cache.cache import Cache

log = logging.getLogger(__name__)

__all__ = ["CLAIM_SECONDS", "WAIT_SECONDS", "WarmupClaims", "claims_default"]

#: How long a claim lasts past its holder's last heartbeat, and the longest a runner
#: waits at the end for entries another runner compiles.
CLAIM_SECONDS = 120.0
WAIT_SECONDS = 1800.0


def claims_default(cache: Cache) -> bool:
    """Claims are on by default for a shared (PostgreSQL) index (a folder cache's
    warm-up does not open SQLAlchemy to find out)."""
    if classify_location(cache.location).kind != DATABASE:
        return False
    return cache.index.dialect == "postgresql"


class WarmupClaims:
    """One runner's compile claims (a context manager: its heartbeat runs inside)."""

    def __init__(
        self, cache: Cache, *, claim_seconds: float = CLAIM_SECONDS, wait_seconds: float = WAIT_SECONDS,
    ) -> None:
        self.cache = cache
        self.claim_seconds = claim_seconds
        self.wait_seconds = wait_seconds
        self.holder = f"warmup {socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.heartbeat = ClaimHeartbeat(cache.index, self.holder, claim_seconds)
        self._held: set[str] = set()

    def __enter__(self) -> WarmupClaims:
        self.heartbeat.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.heartbeat.close()
        self.cache.index.jit_unclaim(self._held, self.holder)
        self._held.clear()

    def _take(self, key: str) -> str | None:
        other = self.cache.index.jit_claim(key, self.holder, self.claim_seconds)
        if other is None:
            self._held.add(key)
            self.heartbeat.hold(key)
        return other

    def claim(self, lowered: Lowered) -> ItemResult | bool:
        """True: claimed, compile it here; False: a live holder compiles it (wait for
        it at the end); a hit: it was stored meanwhile."""
        key = lowered.computation.fingerprint
        other = self._take(key)
        if other is not None:
            log.info("warmup: %s is being compiled by %s; coming back to it at the end", lowered.item.label, other)
            return False
        stored = load_stored(self.cache, lowered)  # stored between our look-up and the claim?
        if stored is not None:
            self.release(lowered)
            return stored
        return True

    def release(self, lowered: Lowered) -> None:
        key = lowered.computation.fingerprint
        if key in self._held:
            self._held.discard(key)
            self.heartbeat.drop(key)
            self.cache.index.jit_unclaim([key], self.holder)

    def wait_for(self, lowered: Lowered) -> ItemResult | None:
        """The entry another runner compiled (a hit, ``waited``), or None: compile it
        here (its holder's claim expired and is now ours, or ``wait_seconds`` passed)."""
        key = lowered.computation.fingerprint
        deadline = time.monotonic() + self.wait_seconds
        delay = 0.1
        while True:
            stored = load_stored(self.cache, lowered, waited=True)
            if stored is not None:
                return stored
            other = self._take(key)
            if other is None:
                stored = load_stored(self.cache, lowered, waited=True)
                if stored is not None:
                    self.release(lowered)
                return stored
            if time.monotonic() >= deadline:
                log.warning("warmup: waited %.0f s for %s to compile %s; compiling it here",
                            self.wait_seconds, other, lowered.item.label)
                return None
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, 2.0)
