"""The environment fingerprint the reports compare entries with (ENV, ``--env this``).

Reports never open a device they do not need (a TPU chip may be held by a server):
:func:`aot.fingerprint.known_environment` gives the real fingerprint when this
process's backend is up, else the per-host record (:mod:`aot.env_record`), else the
real one on a CPU-only host, else None: this host's environment is *unknown*, and the
reports say so (:data:`aot.fingerprint.UNKNOWN_ENVIRONMENT_NOTE`). The loader never comes here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aot.fingerprint import Fingerprint, known_environment

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore



def this_environment(cache: ArtifactStore) -> Fingerprint | None:
    """This host's environment fingerprint without opening a device, or None when it
    cannot be known so."""
    return known_environment(lambda: cache.environment)


__all__ = ["this_environment"]
