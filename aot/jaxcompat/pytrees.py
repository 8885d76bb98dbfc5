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
