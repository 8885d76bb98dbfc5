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
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["KeyValueTimeout", "KeyValueUnavailable", "client", "get", "put"]


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
