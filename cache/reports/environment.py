"""The environment fingerprint the reports compare entries with (ENV, ``--env this``).

Reports never open a device they do not need (a TPU chip may be held by a server):

- a process whose JAX backend is already up uses the real one (:attr:`Cache.environment`);
- otherwise the per-host record (:mod:`aot.env_record`), keyed so that it is only
  found when it is fresh;
- without a record, a CPU-only host computes the real one (importing JAX, which writes
  the record: nothing there can be held); a host with a device runtime (libtpu, a
  CUDA/ROCm plugin, ``JAX_PLATFORMS`` naming one) does not: this host's environment is
  *unknown* (``None``) and the reports say so (:data:`UNKNOWN_NOTE`).

The loader never comes here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aot.device import accelerator_runtime
from aot.errors import DeviceUnavailableError
from aot.fingerprint import Fingerprint, recorded_environment
from aot.jaxcompat.runtime import backend_started

if TYPE_CHECKING:
    from aot.cache.cache import Cache

log = logging.getLogger(__name__)

#: Shown under a listing whose ENV column could not say "this".
UNKNOWN_NOTE = (
    "this host's environment is not recorded yet, so no entry is shown as 'this': any aot "
    "command that opens the device while it is free records it (aot doctor, aot.load, a compile)"
)


def this_environment(cache: Cache) -> Fingerprint | None:
    """This host's environment fingerprint without opening a device, or None when it
    cannot be known so (see the module's docstring)."""
    if backend_started():
        return cache.environment  # type: ignore[no-any-return]
    recorded = recorded_environment()
    if recorded is not None:
        return recorded
    runtime = accelerator_runtime()
    if runtime is not None:
        log.debug("this host's environment is not recorded and %s is installed: not opening the device", runtime)
        return None
    try:
        return cache.environment  # type: ignore[no-any-return]
    except DeviceUnavailableError as exc:  # a CPU backend that cannot start: say unknown
        log.info("this host's environment is unknown: %s", exc)
        return None


__all__ = ["UNKNOWN_NOTE", "this_environment"]
