"""A warm-up as a multi-process job (``aot warmup --distributed``): process 0 compiles
and stores, the others follow it and compile nothing.

Every process of a slice runs the warm-up (a mesh that spans the processes needs every
process's devices). Process 0 runs :func:`~aot.cache.warmup.run.run_warmup` with a
:class:`WarmupLeader`, which publishes in JAX's distributed key-value store first the
manifest positions it runs (its shard; the cache is open then), then each item's
outcome as it completes: the key it stored or hit, or its error. The others run
:func:`~aot.cache.warmup.run.follow_warmup` (a :class:`WarmupFollower`) on the same cache opened read-only: each item is lowered (every
process checks that it lowers what process 0 lowers), loaded when stored, and
otherwise waited for (``AOT_SLICE_WAIT_SECONDS``, :func:`aot.slices.wait_seconds`)
and loaded once process 0 stored it. A follower compiles only what the shared cache
cannot give it: a program of its own devices only, or an entry process 0 stored in
another cache (hosts that do not share one), and stores nothing.

The keys are ``aot/warmup/N/...``, N counting the warm-ups of this process: every
process of the job runs the same warm-ups in the same order.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable

from aot.errors import SliceError, SliceTimeoutError
from aot.jaxcompat import distributed as kv
from aot.slices import ENV_WAIT, wait_seconds
from aot.cache.warmup.steps import ItemResult

log = logging.getLogger(__name__)

__all__ = ["WarmupFollower", "WarmupLeader"]

_OK = "ok:"
_ERROR = "error:"
_count = 0
_count_lock = threading.Lock()


def _next_token() -> str:
    global _count
    with _count_lock:
        _count += 1
        return f"aot/warmup/{_count}"


def _put(key: str, value: str) -> None:
    try:
        kv.put(key, value)
    except kv.KeyValueUnavailable as exc:  # the others find out themselves, bounded
        log.warning("could not tell the job %s: %s", key, exc)


class WarmupLeader:
    """Process 0's side of a warm-up that the job's other processes follow."""

    def __init__(self) -> None:
        self._token = _next_token()
        self._planned: list[int] | None = None
        self._published: set[int] = set()

    def plan(self, positions: Iterable[int]) -> None:
        """The manifest positions this warm-up runs (the cache is open)."""
        self._planned = list(positions)
        _put(f"{self._token}/plan", _OK + json.dumps(self._planned))

    def publish(self, result: ItemResult) -> None:
        """One item's outcome: the key stored (or hit), or why it failed."""
        if result.ok:
            value = _OK + (result.key or "")
        else:
            value = _ERROR + " ".join((result.error or "failed").split())[:2000]
        _put(f"{self._token}/{result.index}", value)
        self._published.add(result.index)

    def abort(self, reason: str) -> None:
        """The warm-up stopped: every outcome not published yet is ``reason`` (the
        others stop waiting at once)."""
        reason = _ERROR + " ".join(reason.split())[:2000]
        if self._planned is None:
            _put(f"{self._token}/plan", reason)
            return
        for position in self._planned:
            if position not in self._published:
                _put(f"{self._token}/{position}", reason)


def _wait(key: str, what: str) -> str:
    """Process 0's value of ``key``; its error, its silence and its death raise."""
    bound = wait_seconds()
    try:
        value = kv.get(key, bound)
    except kv.KeyValueTimeout:
        raise SliceTimeoutError(
            f"waited {bound:g} s for process 0 to warm up {what}, and it did not: it froze, or its "
            f"compile takes longer. Set {ENV_WAIT} above the compile time",
            key=key, process=0,
        ) from None
    except kv.KeyValueUnavailable as exc:
        raise SliceError(
            f"lost the job's coordination service while process 0 warmed up {what} (that process "
            f"died, or this one was cut off: {' '.join(str(exc).split())[:300]}); restart the job",
            key=key, process=0,
        ) from None
    if value.startswith(_ERROR):
        raise SliceError(f"process 0 failed to warm up {what}: {value[len(_ERROR):]}", key=key, process=0)
    return value[len(_OK):]


class WarmupFollower:
    """A process other than 0's side: what process 0 runs, and the key it stored for
    each item (:func:`~aot.cache.warmup.run.follow_warmup` loads it)."""

    def __init__(self) -> None:
        self._token = _next_token()

    def plan(self) -> list[int]:
        """The manifest positions process 0 runs (waits for it: its cache is open then)."""
        return [int(p) for p in json.loads(_wait(f"{self._token}/plan", "the manifest"))]

    def key_of(self, position: int, label: str) -> str:
        """The key process 0 stored (or hit) for the item at ``position``; waits for it,
        and raises its error."""
        return _wait(f"{self._token}/{position}", label)
