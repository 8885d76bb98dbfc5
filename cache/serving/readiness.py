"""Whether this process serves what it declared: the ``/ready`` endpoint beside
``/metrics`` (:mod:`aot.cache.serving.metrics`), for Kubernetes-style readiness probes.

A process is ready once it serves something and every name it declared is loaded:

- each ``aot.load(name)`` it made has returned, and its background loads
  (``background=True``, the default on an accelerator) have finished; a ``lazy=True``
  load counts once it returned (its signatures load at their first call, by choice);
- each name of ``AOT_READY_NAMES`` (comma-separated) or :func:`expect` has been loaded
  so, so that a probe between two ``aot.load`` calls of a start-up does not pass.

A name whose latest ``aot.load`` raised is not ready (the process serves nothing for
it). A signature whose background load failed does not hold readiness back: the load
finished, and the first call of that signature raises its error (as ``aot.load``
documents). Nothing here runs on the call path: the state is read when probed.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ENV_NAMES", "Load", "NameState", "Readiness", "expect", "readiness", "reset", "started"]

#: Names a process declares before loading them (``AOT_READY_NAMES=mlp.forward,tiny``).
ENV_NAMES = "AOT_READY_NAMES"

#: The states of a name that count as ready.
READY_STATES = ("loaded", "lazy")


@dataclass(frozen=True, slots=True)
class NameState:
    """One name's state: ``loaded``, ``lazy`` (loads each signature at its first call),
    ``loading``, ``loading in background``, ``failed`` (its ``aot.load`` raised) or
    ``not loaded yet`` (declared, not asked for)."""

    name: str
    state: str

    @property
    def ready(self) -> bool:
        return self.state in READY_STATES


@dataclass(frozen=True, slots=True)
class Readiness:
    """The state of every name this process loads or declared, by name."""

    names: tuple[NameState, ...]

    @property
    def ready(self) -> bool:
        return bool(self.names) and all(n.ready for n in self.names)

    def describe(self) -> str:
        """``ready: mlp.forward loaded, tiny loaded`` or ``not ready: ...``; ``not ready:
        nothing loaded yet`` before the first ``aot.load``."""
        if not self.names:
            return "not ready: nothing loaded yet"
        states = ", ".join(f"{n.name} {n.state}" for n in self.names)
        return f"{'ready' if self.ready else 'not ready'}: {states}"


class Load:
    """One ``aot.load`` of a name, from its start (:func:`started`) to its return
    (:meth:`finished`) or error (:meth:`failed`); the dispatcher is held weakly, so a
    load the process dropped holds nothing back."""

    __slots__ = ("name", "state", "dispatcher")

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = "loading"
        self.dispatcher: weakref.ref[Any] | None = None

    def finished(self, dispatcher: Any, *, lazy: bool) -> None:
        self.dispatcher = weakref.ref(dispatcher)
        self.state = "lazy" if lazy else "loaded"

    def failed(self) -> None:
        self.state = "failed"

    def current(self) -> str | None:
        """The state now; None when the dispatcher is gone (the process dropped it)."""
        if self.dispatcher is None:
            return self.state
        dispatcher = self.dispatcher()
        if dispatcher is None:
            return None
        return "loading in background" if dispatcher.loading else self.state


_LOCK = threading.Lock()
_LOADS: dict[str, Load] = {}  # the latest load of each name
_EXPECTED: list[str] = []


def started(name: str) -> Load:
    """Records that an ``aot.load`` of ``name`` started (it replaces an earlier one)."""
    load = Load(name)
    with _LOCK:
        _LOADS[name] = load
    return load


def expect(names: Iterable[str]) -> None:
    """Declares names this process will load: it is not ready until they are (as
    ``AOT_READY_NAMES`` does)."""
    with _LOCK:
        _EXPECTED.extend(n for n in names if n not in _EXPECTED)


def readiness(environ: Mapping[str, str] | None = None) -> Readiness:
    """The state of every name loaded or declared (``environ``: default os.environ)."""
    env = os.environ if environ is None else environ
    declared = [n.strip() for n in env.get(ENV_NAMES, "").split(",") if n.strip()]
    with _LOCK:
        loads = dict(_LOADS)
        expected = [*_EXPECTED, *declared]
    states = {}
    for name, load in loads.items():
        state = load.current()
        if state is not None:
            states[name] = state
    for name in expected:
        states.setdefault(name, "not loaded yet")
    return Readiness(tuple(NameState(name, state) for name, state in sorted(states.items())))


def reset() -> None:
    """Forgets every load and declared name (a process that starts serving over; tests)."""
    with _LOCK:
        _LOADS.clear()
        _EXPECTED.clear()
