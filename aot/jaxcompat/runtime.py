"""The state of JAX's distributed runtime (``jax._src.distributed.global_state``).

Read through ``sys.modules`` only: asking must not import the module (nor JAX).
"""

from __future__ import annotations

import sys

from aot.jaxcompat.distributed import client

#: The logger through which JAX reports a plugin (JAX's CUDA plugin) that failed to start.
BACKEND_LOGGER = "jax._src.xla_bridge"


def distributed_client_active() -> bool:
    """True when ``jax.distributed.initialize`` has connected this process."""
    return client() is not None


def backend_started() -> bool:
    """True when JAX has initialised a backend in this process (asking again then opens
    nothing: the device, if any, is this process's already). False when JAX is not
    imported, or its private ``xla_bridge.backends_are_initialized`` moved."""
    bridge = sys.modules.get(BACKEND_LOGGER)  # the logger is named for its module
    started = getattr(bridge, "backends_are_initialized", None)
    return bool(started()) if callable(started) else False


def distributed_process() -> tuple[int, int] | None:
    """(process id, process count) given to ``jax.distributed.initialize``, without
    starting a backend; None when this process has not joined a job."""
    if client() is None:
        return None
    state = sys.modules["jax._src.distributed"].global_state
    return int(state.process_id), int(state.num_processes)
