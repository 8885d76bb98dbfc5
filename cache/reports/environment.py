"""The environment fingerprint the reports compare entries with (ENV, ``--env this``).

A process that has imported JAX uses the real one (:attr:`Cache.environment`); one
that has not (``aot ls``, ``show``, ``stats``, ``rm``, completion) reads the per-host
record (:mod:`aot.env_record`), keyed so that it is only found when it is fresh, and
computes the real one (importing JAX, which writes the record) when there is none.
The loader never comes here.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from aot.fingerprint import Fingerprint, recorded_environment

if TYPE_CHECKING:
    from aot.cache.cache import Cache


def this_environment(cache: Cache) -> Fingerprint:
    """This host's environment fingerprint, without JAX when a fresh record has it."""
    if "jax" not in sys.modules:
        recorded = recorded_environment()
        if recorded is not None:
            return recorded
    return cache.environment  # type: ignore[no-any-return]
