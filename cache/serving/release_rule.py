"""Which release a replica serves: the one rule of ``aot.load``, ``aot why``, ``aot
show`` and ``aot ls``. Its own module, light to import (no JAX), so that the listing
commands follow it without starting JAX."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore

__all__ = ["RELEASE_ENV", "served_release"]

#: The environment variable naming the release a replica serves.
RELEASE_ENV = "AOT_RELEASE"


def served_release(cache: ArtifactStore, release: str | None) -> str | None:
    """The release a replica of ``cache`` serves: ``release``, else ``$AOT_RELEASE``,
    else the cache's declared default (``aot release default``); None: the refs. The
    one rule of ``aot.load``, ``aot why``, ``aot show`` and ``aot ls``."""
    if release is None:
        release = os.environ.get(RELEASE_ENV, "").strip() or None
    if release is None:
        release = cache.default_release()
    return release
