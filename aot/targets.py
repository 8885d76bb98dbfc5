"""Device targets: compiling for an accelerator this host does not have.

A target names an accelerator and its topology, ``tpu:v5e:2x2``: platform, chip and
chip grid, optionally the chips per host after an ``@`` (``tpu:v5e:2x4@2x4`` is one
host of eight chips; by default a host holds up to 2x2x1 chips, as on Cloud TPU
v4/v5e/v5p/v6e pods). JAX compiles for it through its topology API
(``jax.experimental.topologies``) with the accelerator's compiler (libtpu, the
``jax-aot[tpu]`` extra) on a host without the accelerator, e.g. a CPU-only CI runner.

The entry's environment is computed from the target's compile-only devices exactly as a
process on that accelerator computes it from ``jax.devices()``
(:func:`aot.environment.environment_parts`): platform, device kind, count, topology
(ids, coordinates, cores), process count and the compiler's platform version (libtpu's
build) all come from the compiler itself. What the compiling host decides: jax and
jaxlib (the serving host needs the same versions, as for any entry), x64 and the XLA
flags of the compiling process.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aot import platforms
from aot.errors import DeviceTargetError
from aot.platforms.tpu import CHIP_OF_DEVICE_KIND, KNOWN_TOPOLOGIES

log = logging.getLogger(__name__)

__all__ = [
    "CHIP_OF_DEVICE_KIND", "KNOWN_TOPOLOGIES", "DeviceTarget", "compile_only_here", "environment_name", "parse_target",
    "target_name",
]


def _known() -> str:
    return "; ".join(known for p in platforms.deviceless() if (known := p.known_targets()))


@dataclass(frozen=True, slots=True)
class DeviceTarget:
    """An accelerator and topology to compile for (``tpu:v5e:2x2``)."""

    platform: str
    chip: str
    topology: str
    host_bounds: tuple[int, int, int]

    @property
    def room(self) -> platforms.Platform:
        """The room of the target's platform (:mod:`aot.platforms`)."""
        room = platforms.of(self.platform)
        assert room is not None, self.platform
        return room

    @property
    def name(self) -> str:
        return self.room.target_text(self.chip, self.topology, self.host_bounds)

    def __str__(self) -> str:
        return self.name

    @property
    def chip_count(self) -> int:
        return self.room.chip_count(self.topology, self.host_bounds)

    def devices(self) -> tuple[Any, ...]:
        """The target's compile-only devices (JAX's topology API through the platform's compiler)."""
        try:
            return self.room.topology_devices(self.chip, self.topology, self.host_bounds, self.name)
        except RuntimeError as exc:  # JaxRuntimeError is one: the compiler refused to load
            from aot.device import device_error

            busy = device_error(exc)  # a device here, held by another process (a server on the chip)
            if busy is None:
                raise
            raise busy from None

    def mesh(self, axes: Any) -> Any:
        """A ``jax.sharding.Mesh`` over the target's devices: ``axes`` is a sequence of
        ``(name, size)`` or a mapping ``{name: size}``, whose sizes multiply to at most
        the number of devices."""
        import numpy as np
        from jax.sharding import Mesh

        pairs = list(axes.items()) if isinstance(axes, dict) else list(axes)
        devices = self.devices()
        count = int(np.prod([size for _, size in pairs]))
        if count > len(devices):
            raise DeviceTargetError(
                f"mesh {','.join(f'{n}={s}' for n, s in pairs)} needs {count} devices; the "
                f"target {self.name} has {len(devices)}; choose a larger topology or a smaller mesh"
            )
        grid = np.asarray(devices[:count], dtype=object).reshape([size for _, size in pairs])
        return Mesh(grid, tuple(name for name, _ in pairs))


def compile_only_here() -> None:
    """Makes the CPU this process's default backend, for a process that compiles only
    for device targets (``aot warmup --target``): it never needs this host's own
    accelerator, and on a TPU host whose chip a server holds, JAX would otherwise try to
    open it (jax.export asks for the default backend). Its worker processes inherit it.
    Does nothing when ``JAX_PLATFORMS`` is set or a backend is already up."""
    if os.environ.get("JAX_PLATFORMS"):
        return
    from aot.jaxcompat.runtime import backend_started

    if "jax" in sys.modules and backend_started():
        return
    os.environ["JAX_PLATFORMS"] = "cpu"
    if "jax" in sys.modules:
        import jax

        jax.config.update("jax_platforms", "cpu")
    log.info("compiling for device targets only: JAX_PLATFORMS=cpu in this process")


def parse_target(text: str | DeviceTarget) -> DeviceTarget:
    """``"tpu:v5e:2x2"`` (optionally ``@CHIPS_PER_HOST``) -> :class:`DeviceTarget`;
    :class:`aot.DeviceTargetError` names the known ones for anything else."""
    if isinstance(text, DeviceTarget):
        return text
    if not isinstance(text, str):
        raise DeviceTargetError(f"a target is a string like 'tpu:v5e:2x2', got {type(text).__name__}")
    spec, _, hosts = text.strip().partition("@")
    fields = spec.split(":")
    room = platforms.target_room(spec)
    if room is not None and room.DEVICELESS:
        parsed = room.parse(text, fields, hosts)
        if parsed is not None:
            chip, topology, bounds = parsed
            return DeviceTarget(room.NAME, chip, topology, bounds)
    if len(fields) != 3 or not all(fields):
        hint = next((h for p in platforms.PLATFORMS if (h := p.hint(text)) is not None), None)
        if hint is not None:
            raise DeviceTargetError(hint)
        raise DeviceTargetError(
            f"target {text!r} is not PLATFORM:CHIP:TOPOLOGY (e.g. tpu:v5e:2x2); known: {_known()}"
        )
    if room is None or not room.DEVICELESS:
        names = ", ".join(p.NAME for p in platforms.deviceless())
        raise DeviceTargetError(
            f"target {text!r}: compiling without the device is supported for {names} "
            f"(through libtpu and JAX's CUDA plugin), not {fields[0].strip().lower()!r}; compile on a host with that "
            "accelerator instead"
        )
    raise DeviceTargetError(f"unknown target {text!r}; known: {_known()}")


# ---------------------------------------------------------------- naming an environment

def target_name(parts: Mapping[str, str]) -> str | None:
    """The device target an environment fingerprint's ``parts`` describe
    (``tpu:v5e:2x2``), read from its platform, device kind and topology (the device
    grid spanned by the devices' coordinates, else the known grid of its device count);
    None when no known target does (a CPU host, an unknown chip or GPU). Pure: listings
    name targets without JAX or libtpu. A GPU is named by its target config's digest
    (:func:`aot.platforms.cuda.gpu_name`: ``cuda:h200:8``)."""
    room = platforms.of(parts.get("platform"))
    return room.target_name(parts) if room is not None else None


def environment_name(parts: Mapping[str, str]) -> str:
    """A short name for an environment: its target's (``tpu:v5e:2x2``), else its
    platform, device kind and count (``cpu x8``, ``gpu NVIDIA H100 x8``)."""
    named = target_name(parts)
    if named is not None:
        return named
    platform = parts.get("platform") or "unknown"
    kind = parts.get("device_kind", "")
    count = parts.get("device_count", "?")
    # A CPU's device kind is "cpu": the platform says it already.
    shown = "" if not kind or kind.lower() == platform else f" {kind}"
    return f"{platform}{shown} x{count}"
