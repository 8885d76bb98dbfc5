"""The one mapping of platform names: what JAX calls a device's platform (``gpu``,
``cuda``, ``rocm``, ``tpu``, ``cpu``) -> the room of :mod:`aot.platforms` that knows it
(``cuda`` for a GPU: JAX's topology call and our target names say ``cuda``, a device
says ``gpu``), and how a message names it. Imports nothing: :mod:`aot.device` reads it
below the rooms, which import it."""

from __future__ import annotations

__all__ = ["ROOM_OF", "label", "room_name"]

#: JAX's platform name (a device's ``platform``, a backend's name) -> the room's name.
#: (ROCm has no room: JAX's ``rocm`` devices are named a GPU in messages, and compiled for
#: on their host only.)
ROOM_OF: dict[str, str] = {"cpu": "cpu", "tpu": "tpu", "gpu": "cuda", "cuda": "cuda"}
_LABELS = {"gpu": "GPU", "cuda": "GPU", "rocm": "GPU"}


def room_name(platform: str) -> str | None:
    """The room of ``platform`` (any spelling JAX or a target uses), or None."""
    return ROOM_OF.get(platform.strip().lower())


def label(platform: str) -> str:
    """How a message names the device of ``platform``: ``GPU`` for every GPU spelling,
    else its name in capitals (``TPU``)."""
    return _LABELS.get(platform.strip().lower(), platform.upper())
