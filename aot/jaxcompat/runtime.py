"""The state of JAX's distributed runtime (``jax._src.distributed.global_state``).

Read through ``sys.modules`` only: asking must not import the module (nor JAX).
"""

from __future__ import annotations

import sys


def distributed_client_active() -> bool:
    """True when ``jax.distributed.initialize`` has connected this process."""
    distributed = sys.modules.get("jax._src.distributed")
    state = getattr(distributed, "global_state", None)
    return getattr(state, "client", None) is not None
