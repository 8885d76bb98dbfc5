"""What the call-statistics recorder tells the world beyond the index: JAX's own
monitoring events, and listeners (the Prometheus exporter, :mod:`aot.cache.serving.metrics`).

The recorder (:mod:`aot.cache.stats_recorder`) already sees every slow-path event of
serving (a load, a miss, a recompile, a quarantine) and, at each flush or scrape, the
calls counted since the last; it hands each to :func:`notify` once, so nothing is
counted twice and nothing happens per call.

**JAX's monitoring events.** A dashboard that counts JAX's persistent cache counts
jax-aot too, because a load from the cache records what JAX's ``compiler.py``
(``compile_or_get_cached``, JAX 0.10.2) records for a persistent-cache hit, with the
same public :mod:`jax.monitoring` functions:

==============================================  ====================================  ==============================
event                                           function                              when
==============================================  ====================================  ==============================
``/jax/compilation_cache/compile_requests_use_cache``  ``record_event``               every load, miss, recompile
``/jax/compilation_cache/cache_hits``           ``record_event``                      an executable loaded
``/jax/compilation_cache/compile_time_saved_sec``  ``record_event_duration_secs``     stored compile time - retrieval
``/jax/compilation_cache/cache_retrieval_time_sec``  ``record_event_duration_secs``   blob reads + deserialization
``/jax/compilation_cache/cache_misses``         ``record_event``                      a call no stored executable
                                                                                      served, or a recompile
==============================================  ====================================  ==============================

JAX records ``cache_misses`` when it writes a fresh compile to its cache; jax-aot records
it for each miss and each compile from stored portable HLO (a symbolic program's compile
follows its miss and is not counted again). ``aot.jax_cache`` records nothing itself:
it is JAX's cache backend, so JAX records these events around its ``get``/``put``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

# The names JAX records (jax/_src/compiler.py, jax/_src/compilation_cache.py), kept
# with the other facts of a release in aot.jaxcompat.releases.
from aot.jaxcompat.releases import CACHE_HITS, CACHE_MISSES, COMPILE_REQUESTS, RETRIEVAL_TIME, TIME_SAVED

log = logging.getLogger(__name__)

__all__ = [
    "CACHE_HITS", "CACHE_MISSES", "COMPILE_REQUESTS", "KINDS", "RETRIEVAL_TIME", "TIME_SAVED",
    "StatsEvent", "add_listener", "notify", "remove_listener",
]

#: What happened: an executable ``load``\ ed from the cache; ``calls`` served (``count``
#: of them, since the last report); a ``miss``; a miss ``fallback`` compiled by the
#: fallback function (also a miss); a ``recompile`` from portable HLO; a ``quarantine``
#: (an executable proven corrupt and refused); ``serve``: a dispatcher of the name was
#: created, serving ``release``.
KINDS = ("load", "calls", "miss", "fallback", "recompile", "quarantine", "serve")


@dataclass(frozen=True, slots=True)
class StatsEvent:
    """One event of serving, for listeners.

    ``release``: the release label the name is served from in this process ("" when
    it is served by its refs, or not by a dispatcher: ``cache.get``, ``cache.compile``).
    ``seconds``: a load's or a recompile's time. ``saved_seconds``: a load's stored
    compile time (None: not recorded with the entry). ``counts_miss``: whether JAX's
    miss events are due (False for the compile that follows a counted miss).
    """

    kind: str
    name: str
    release: str = ""
    count: int = 1
    seconds: float = 0.0
    saved_seconds: float | None = None
    counts_miss: bool = True


Listener = Callable[[StatsEvent], None]
_LISTENERS: list[Listener] = []
_LOCK = threading.Lock()


def add_listener(listener: Listener) -> None:
    """Calls ``listener(event)`` for every event from now on (once, however often added)."""
    with _LOCK:
        if listener not in _LISTENERS:
            _LISTENERS.append(listener)


def remove_listener(listener: Listener) -> None:
    with _LOCK:
        if listener in _LISTENERS:
            _LISTENERS.remove(listener)


def _record_jax_events(event: StatsEvent) -> None:
    # Imported here: a process that only lists or reports (the CLI) never needs JAX;
    # one that loads executables has it imported already.
    import jax.monitoring

    if event.kind == "load":
        jax.monitoring.record_event(COMPILE_REQUESTS)
        jax.monitoring.record_event(CACHE_HITS)
        if event.saved_seconds is not None:
            # JAX's formula, unclamped, so that both sources sum alike on one dashboard.
            jax.monitoring.record_event_duration_secs(TIME_SAVED, event.saved_seconds - event.seconds)
        jax.monitoring.record_event_duration_secs(RETRIEVAL_TIME, event.seconds)
    elif event.kind in ("miss", "fallback", "recompile") and event.counts_miss:
        jax.monitoring.record_event(COMPILE_REQUESTS)
        jax.monitoring.record_event(CACHE_MISSES)


def notify(event: StatsEvent) -> None:
    """Records JAX's events for ``event`` and hands it to every listener. Never raises:
    statistics never fail the call that produced them."""
    try:
        _record_jax_events(event)
    except Exception as exc:  # noqa: BLE001 - a listener of JAX's events raised
        log.debug("a jax.monitoring listener failed on %s: %s", event.kind, exc)
    for listener in list(_LISTENERS):
        try:
            listener(event)
        except Exception as exc:  # noqa: BLE001
            log.debug("a serving-events listener failed on %s: %s", event.kind, exc)
