"""One room per platform: what jax-aot knows of the CPU (:mod:`aot.platforms.cpu`), the
TPU (:mod:`aot.platforms.tpu`) and NVIDIA's GPUs (:mod:`aot.platforms.cuda`), each behind
the small :class:`Platform` protocol, found through one registry by any name JAX or a
target gives it (:mod:`aot.platforms.names`: a device's ``gpu`` is the room ``cuda``).

Nothing outside this package compares a string naming a platform
(tests/test_architecture.py): :class:`aot.DeviceTarget`, the environment key, the
compile step and the cache ask the room instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from aot.platforms import cpu, cuda, tpu
from aot.platforms.names import label, room_name
from aot.platforms.tuning import Tuning

__all__ = [
    "PLATFORMS", "Platform", "Tuning", "captured_target", "deviceless", "label", "mentions_captured_target", "of", "of_devices",
    "target_room",
]


class Platform(Protocol):
    """A platform's room (each a module: :mod:`aot.platforms.tpu`, ...)."""

    #: The platform's name in targets and in JAX's topology call (``tpu``, ``cuda``).
    NAME: str
    #: Whether its targets are compiled for without the device (a topology).
    DEVICELESS: bool
    #: Whether its targets are named by configs a cache captured (``cuda:NAME``).
    CAPTURED_CONFIGS: bool
    #: The key part and environment variable of its compiler's own flags, or None.
    COMPILER_ARGS: tuple[str, str] | None

    def parse(self, text: str, fields: list[str], hosts: str) -> tuple[str, str, tuple[int, int, int]] | None:
        """(chip, topology, host bounds) of a target ``text`` split at ':' (``hosts``:
        after '@'); None when it is not one of this platform's shapes."""

    def target_text(self, chip: str, topology: str, host_bounds: tuple[int, int, int]) -> str: ...

    def chip_count(self, topology: str, host_bounds: tuple[int, int, int]) -> int: ...

    def topology_devices(self, chip: str, topology: str, host_bounds: tuple[int, int, int], name: str) -> tuple[Any, ...]:
        """The target's compile-only devices (typed errors in one line)."""

    def known_targets(self) -> str: ...

    def hint(self, text: str) -> str | None:
        """The error for a spelling of this platform's that is no target, or None."""

    def environment_parts(self, devices: Sequence[Any]) -> dict[str, str]:
        """The key's parts of ``devices`` beyond the platform-neutral ones."""

    def target_name(self, parts: Mapping[str, str]) -> str | None:
        """The target an environment's ``parts`` describe, or None."""

    def lowering_error(self, name: str, target: str, exc: BaseException) -> Exception | None:
        """The one-line error for lowering ``name`` for ``target`` that failed with
        ``exc`` (something this host lacks), or None: the failure is JAX's own."""

    def compile_step(
        self, devices: Sequence[Any], options: dict[str, Any] | None, compile_fn: Callable[..., Any], name: str,
    ) -> tuple[Any, Tuning | None]:
        """``compile_fn(options)`` as this platform compiles, and the tuning it got."""


#: Every room, in the order messages list them.
PLATFORMS: tuple[Platform, ...] = (cpu, tpu, cuda)  # type: ignore[assignment]
_BY_NAME: dict[str, Platform] = {p.NAME: p for p in PLATFORMS}


def of(platform: str | None) -> Platform | None:
    """The room of ``platform`` in any spelling JAX or a target uses (``gpu`` -> cuda), or None."""
    room = room_name(platform or "")
    return _BY_NAME.get(room) if room is not None else None


def of_devices(devices: Sequence[Any]) -> Platform | None:
    """The room of ``devices``' platform (None for none, or an unknown platform)."""
    return of(getattr(devices[0], "platform", None)) if len(devices) else None


def target_room(text: str) -> Platform | None:
    """The room a target name's platform (before its first ':') names, or None."""
    return of(text.strip().partition(":")[0])


def deviceless() -> tuple[Platform, ...]:
    """The rooms whose targets compile without the device."""
    return tuple(p for p in PLATFORMS if p.DEVICELESS)


def captured_target(text: str) -> bool:
    """Whether ``text`` names a target of a platform whose targets are captured configs
    (``cuda:h200``: the shape of MODULE:FUNCTION too)."""
    room = target_room(text)
    return room is not None and room.CAPTURED_CONFIGS and ":" in text


def mentions_captured_target(text: str) -> bool:
    """Whether ``text`` (a manifest's, or a name) mentions such a target anywhere."""
    lowered = text.lower()
    return any(f"{p.NAME}:" in lowered for p in PLATFORMS if p.CAPTURED_CONFIGS)
