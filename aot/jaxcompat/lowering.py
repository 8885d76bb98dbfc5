"""Tracing configuration while lowering (``jax._src.config``).

JAX offers the ``jax_traceback_in_locations_limit`` flag publicly only as a global
setting; its context manager, which sets it for one trace and thread, is private.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from jax._src import config


def no_traceback_locations() -> AbstractContextManager[Any]:
    """Exports without Python tracebacks in the module's locations, so that the
    portable HLO does not depend on where it was exported from."""
    return config.traceback_in_locations_limit(0)
