"""The libraries whose modules a stored pytree may make the loader import.

A manifest names the modules of its pytree nodes and keys. The loader never imports
the model's own code; it imports JAX's own modules (a checkify error names
``jax._src.checkify``, private ones through :mod:`aot.jaxcompat`) and those of widely
used pytree libraries, so that an entry loads without the user importing them first.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
from typing import Any

from aot.jaxcompat.pytrees import import_jax_module

log = logging.getLogger(__name__)

#: Top-level packages whose modules a stored pytree node may make the loader import:
#: JAX and widely used libraries of pytrees, never the model's own code.
LIBRARY_PACKAGES = frozenset({
    "jax", "flax", "optax", "equinox", "chex", "numpyro", "distrax", "haiku", "jraph",
    "diffrax", "optimistix", "lineax", "blackjax", "brax", "orbax", "jaxtyping",
})

_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def import_library(module_name: str) -> Any:
    """The module ``module_name`` when it is imported, or is one of JAX's or of a
    :data:`LIBRARY_PACKAGES` library and imports here; else None (never raises)."""
    module = sys.modules.get(module_name)
    if module is not None or not _MODULE_NAME.match(module_name):
        return module
    if module_name.partition(".")[0] not in LIBRARY_PACKAGES:
        return None
    try:
        if module_name == "jax" or module_name.startswith("jax."):
            module = import_jax_module(module_name)
        else:
            module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - ImportError, or a library failing to import
        log.info("cannot import %s, named by a stored pytree: %r", module_name, exc)
        return None
    log.debug("imported %s, named by a stored pytree", module_name)
    return module


