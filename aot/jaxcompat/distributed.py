"""JAX's distributed key-value store: the channel of a multi-process job.

``jax.distributed.initialize`` connects every process to a coordination service
(hosted by process 0) whose key-value store JAX itself uses to share a compiled
binary between hosts (``jax_share_binary_between_hosts``,
``jax._src.compiler._compile_and_share_module``). There is no public handle on it.

Private: ``jax._src.distributed.global_state`` (``client``, ``process_id``) and the
client's ``key_value_set(key, value, allow_overwrite)`` and
``blocking_key_value_get(key, timeout_in_ms)``. A get that times out raises XLA's
``DEADLINE_EXCEEDED``; a service that is gone (process 0 died) raises another status:
both are told apart here, so callers never parse XLA's messages.

A join that does not complete in time (a process of the job never started) cannot be
cancelled: the client's ``connect`` blocks in C++ and, at its own deadline, ends the
process with a fatal error. :func:`abandon` takes the connecting client (and the
service process 0 hosts) out of JAX's state, holding them until the process ends, so
that JAX's exit handler does not shut down a client that is still connecting.
Also private: ``global_state.service``, ``coordinator_address``, ``num_processes``.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["KeyValueTimeout", "KeyValueUnavailable", "abandon", "client", "get", "joining", "put"]

#: Clients and services that never connected, kept alive until the process ends:
#: dropping process 0's service would end its connecting client with a fatal error.
_abandoned: list[Any] = []


class KeyValueTimeout(Exception):
    """The key was not set within the timeout."""


class KeyValueUnavailable(Exception):
    """The coordination service did not answer (its process died, or this one was cut off)."""


def client() -> Any | None:
    """The connected distributed client of this process (None: not a multi-process job).
    Read through ``sys.modules``: asking imports nothing."""
    distributed = sys.modules.get("jax._src.distributed")
    state = getattr(distributed, "global_state", None)
    return getattr(state, "client", None)


def joining() -> tuple[int | None, int | None, str | None]:
    """(process id, process count, coordinator address) as ``jax.distributed.initialize``
    has set them so far (None: not yet, or JAX not imported)."""
    state = getattr(sys.modules.get("jax._src.distributed"), "global_state", None)
    if state is None or getattr(state, "coordinator_address", None) is None:
        return None, None, None
    count = vars(state).get("num_processes")  # set on the instance once initialize knows it
    return int(state.process_id), (None if count is None else int(count)), str(state.coordinator_address)


def abandon() -> None:
    """Takes a client that has not connected (and process 0's service) out of JAX's
    state: :func:`client` is None again and JAX's exit handler leaves them alone. They
    are held, not shut down: the process must end soon (the client's own deadline ends
    it otherwise)."""
    state = getattr(sys.modules.get("jax._src.distributed"), "global_state", None)
    if state is None:
        return
    for name in ("client", "service"):
        found = getattr(state, name, None)
        if found is not None:
            _abandoned.append(found)
            setattr(state, name, None)


def put(key: str, value: str) -> None:
    """Sets ``key`` (overwriting: a job may publish the same key again)."""
    found = client()
    if found is None:
        raise KeyValueUnavailable("jax.distributed is not initialized in this process")
    try:
        found.key_value_set(key, value, allow_overwrite=True)
    except Exception as exc:  # jaxlib's runtime error: the service is gone
        raise KeyValueUnavailable(str(exc)) from exc


def get(key: str, timeout_s: float) -> str:
    """The value of ``key``, waiting at most ``timeout_s`` for it to be set."""
    found = client()
    if found is None:
        raise KeyValueUnavailable("jax.distributed is not initialized in this process")
    try:
        return found.blocking_key_value_get(key, max(1, int(timeout_s * 1000)))
    except Exception as exc:  # jaxlib's runtime error, its status in the message
        if "DEADLINE_EXCEEDED" in str(exc) or "timed out" in str(exc).lower():
            raise KeyValueTimeout(str(exc)) from exc
        raise KeyValueUnavailable(str(exc)) from exc
