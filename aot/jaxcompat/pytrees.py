"""Pytree serialization: the registries behind
``jax.export.register_pytree_node_serialization``
(``jax._src.export._export.serialization_registry`` and
``deserialization_registry``), and jaxlib's ``Traceback``.

Treedefs are stored as JSON, and a node a library registered for ``jax.export``
serialization is stored through its own serializer; JAX publishes the registration
but not the lookup by class or by name.
"""

from __future__ import annotations

from typing import Any


def node_serializer(cls: type) -> tuple[str, Any] | None:
    """``(name, serialize)`` registered for ``cls``, or None."""
    from jax._src.export import _export

    return _export.serialization_registry.get(cls)


def node_deserializer(name: str) -> tuple[type, Any] | None:
    """``(cls, deserialize)`` registered under ``name``, or None."""
    from jax._src.export import _export

    registered = _export.deserialization_registry.get(name)
    if registered is None:
        return None
    cls, deserialize, *_ = registered
    return cls, deserialize


def current_traceback() -> Any:
    """A jaxlib ``Traceback`` of the caller (what checkify stores in its errors)."""
    from jax._src.lib import xla_client

    return xla_client.Traceback.get_traceback()


#: Private JAX modules a stored pytree node may name, and the public module whose
#: import defines them (importing it runs the registrations a user's import would).
_PUBLIC_HOMES: dict[str, str] = {
    "jax._src.checkify": "jax.experimental.checkify",
}


def import_jax_module(name: str) -> Any:
    """Imports a module of JAX itself named by a stored pytree node (``jax.*``,
    private ones through their public home); the module, or None if it is not there."""
    import importlib

    if name != "jax" and not name.startswith("jax."):
        return None
    home = _PUBLIC_HOMES.get(name)
    if home is not None:
        importlib.import_module(home)
    return importlib.import_module(name)
