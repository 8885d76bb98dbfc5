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
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from aot.errors import DeviceTargetError
from aot.libtpu_log import quiet_libtpu_load

log = logging.getLogger(__name__)

__all__ = [
    "CHIP_OF_DEVICE_KIND", "KNOWN_TOPOLOGIES", "DeviceTarget", "compile_only_here", "environment_name", "parse_target",
    "target_name",
]

# The chips and grids of Cloud TPU slices jax-aot knows (libtpu accepts these names).
KNOWN_TOPOLOGIES: dict[str, tuple[str, ...]] = {
    "v4": ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8"),
    "v5e": ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    "v5p": ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8"),
    "v6e": ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
}
_PLATFORMS = ("tpu", "cuda")
_DEFAULT_HOST_BOUNDS = (2, 2, 1)
_ALLOW_MULTIPLE = "ALLOW_MULTIPLE_LIBTPU_LOAD"
_GRID = re.compile(r"^\d+(x\d+){1,2}$")

def _known() -> str:
    from aot import gpu_targets

    tpus = "; ".join(f"tpu:{chip}:{{{','.join(grids)}}}" for chip, grids in KNOWN_TOPOLOGIES.items())
    return tpus + "; " + ", ".join(f"cuda:{name}[:N|:HxN]" for name in gpu_targets.known())


def _dims(grid: str) -> tuple[int, int, int]:
    values = [int(v) for v in grid.split("x")]
    return (values + [1, 1])[:3]  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class DeviceTarget:
    """An accelerator and topology to compile for (``tpu:v5e:2x2``)."""

    platform: str
    chip: str
    topology: str
    host_bounds: tuple[int, int, int]

    @property
    def name(self) -> str:
        if self.platform == "cuda":
            from aot.gpu_targets import shape_text

            shape = shape_text(self.host_bounds[0], self.host_bounds[1])
            return f"cuda:{self.chip}" + (f":{shape}" if shape else "")
        default = tuple(min(a, b) for a, b in zip(_dims(self.topology), _DEFAULT_HOST_BOUNDS))
        suffix = "" if self.host_bounds == default else "@" + "x".join(map(str, self.host_bounds[:len(self.topology.split("x"))]))
        return f"{self.platform}:{self.chip}:{self.topology}{suffix}"

    def __str__(self) -> str:
        return self.name

    @property
    def chip_count(self) -> int:
        if self.platform == "cuda":
            return self.host_bounds[0] * self.host_bounds[1]
        a, b, c = _dims(self.topology)
        return a * b * c

    def devices(self) -> tuple[Any, ...]:
        """The target's compile-only devices (JAX's topology API; needs libtpu)."""
        return _topology_devices(self)

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
    if fields[0].strip().lower() == "gpu":
        fixed = ":".join(["cuda", *fields[1:]])
        raise DeviceTargetError(
            f"target {text!r}: a GPU target's platform is 'cuda', not 'gpu' (as JAX's topology call names it): {fixed}"
        )
    if fields[0].strip().lower() == "cuda" and len(fields) in (2, 3) and all(fields) and not hosts:
        return _gpu_target(text, fields)
    if len(fields) != 3 or not all(fields):
        hint = _accelerator_type_hint(text)
        if hint is not None:
            raise DeviceTargetError(hint)
        raise DeviceTargetError(
            f"target {text!r} is not PLATFORM:CHIP:TOPOLOGY (e.g. tpu:v5e:2x2); known: {_known()}"
        )
    platform, chip, grid = (f.strip().lower() for f in fields)
    if platform not in _PLATFORMS:
        raise DeviceTargetError(
            f"target {text!r}: compiling without the device is supported for {', '.join(_PLATFORMS)} "
            f"(through libtpu and JAX's CUDA plugin), not {platform!r}; compile on a host with that accelerator instead"
        )
    if grid not in KNOWN_TOPOLOGIES.get(chip, ()):
        raise DeviceTargetError(f"unknown target {text!r}; known: {_known()}")
    default = tuple(min(a, b) for a, b in zip(_dims(grid), _DEFAULT_HOST_BOUNDS))
    if hosts:
        if not _GRID.match(hosts.strip()) and not hosts.strip().isdigit():
            raise DeviceTargetError(
                f"target {text!r}: the chips per host after '@' are a grid like 2x4, got {hosts!r}"
            )
        bounds = _dims(hosts.strip()) if "x" in hosts else (int(hosts), 1, 1)
        if any(t % h for t, h in zip(_dims(grid), bounds)):
            raise DeviceTargetError(
                f"target {text!r}: the topology {grid} is not a whole number of {hosts} hosts"
            )
    else:
        bounds = default  # type: ignore[assignment]
    return DeviceTarget(platform, chip, grid, tuple(bounds))  # type: ignore[arg-type]


def _gpu_target(text: str, fields: list[str]) -> DeviceTarget:
    """``cuda:GPU[:N|:HxN]`` (:mod:`aot.gpu_targets`) -> :class:`DeviceTarget` whose
    ``host_bounds`` are (hosts, GPUs per host, 1)."""
    from aot import gpu_targets

    chip = fields[1].strip().lower()
    hosts, per_host = gpu_targets.parse_shape(text, fields[2].strip().lower() if len(fields) == 3 else "")
    if not gpu_targets.NAME.match(chip):
        raise DeviceTargetError(f"target {text!r}: a GPU's name is lower-case letters, digits, '-' and '_' (cuda:h200)")
    gpu_targets.check_known_gpu(text, chip)
    return DeviceTarget("cuda", chip, f"{hosts}x{per_host}", (hosts, per_host, 1))


#: Cloud TPU accelerator types (``v5litepod-4``, ``v4-8``): the chip each names, and
#: what the number counts (v4 and v5p count TensorCores, two per chip).
_ACCELERATOR_TYPES = {"v5litepod": ("v5e", 1), "v5e": ("v5e", 1), "v6e": ("v6e", 1), "v4": ("v4", 2), "v5p": ("v5p", 2)}
_ACCELERATOR_TYPE = re.compile(r"^(?:tpu[:-])?(v5litepod|v5e|v6e|v4|v5p)-(\d+)$")


def _accelerator_type_hint(text: str) -> str | None:
    """The error for a Cloud TPU accelerator type given as a target: the target it
    names (``v5litepod-4`` -> ``tpu:v5e:2x2``). Not accepted as a second spelling: an
    entry's target is one name, and the type's number is not always chips."""
    match = _ACCELERATOR_TYPE.match(text.strip().lower())
    if match is None:
        return None
    chip, per_chip = _ACCELERATOR_TYPES[match.group(1)]
    count = int(match.group(2))
    chips, odd = divmod(count, per_chip)
    counted = f"{chips} {chip} chip{'s' if chips != 1 else ''}"
    if per_chip > 1:
        counted = f"{count} TensorCores" + ("" if odd else f", {counted}")
    grids = [] if odd else [g for g in KNOWN_TOPOLOGIES[chip] if _chips(g) == chips]
    if not grids:
        return (
            f"target {text!r} is a Cloud TPU accelerator type ({counted}), not PLATFORM:CHIP:TOPOLOGY, "
            f"and no known topology matches it; known: tpu:{chip}:{{{','.join(KNOWN_TOPOLOGIES[chip])}}}"
        )
    return (
        f"target {text!r} is a Cloud TPU accelerator type ({counted}), not PLATFORM:CHIP:TOPOLOGY; "
        f"did you mean tpu:{chip}:{grids[0]}?"
    )


def _topology_devices(target: DeviceTarget) -> tuple[Any, ...]:
    if target.platform == "cuda":  # cached by config there: a new capture of a name is new devices
        from aot.gpu_targets import topology_devices

        return topology_devices(target.chip, target.host_bounds[0], target.host_bounds[1], target.name)
    return _tpu_topology_devices(target)


@lru_cache(maxsize=None)
def _tpu_topology_devices(target: DeviceTarget) -> tuple[Any, ...]:
    from jax.experimental import topologies

    from aot.device import device_error

    # libtpu refuses to load while another process holds the host's lock file (a server
    # on the chip, or another warm-up worker), though a topology opens no chip: allowed
    # while it loads for one (on the chip host a server kept running, measured); only
    # for that load, so this process's own backend, if it opens one, stays guarded.
    allowed = os.environ.get(_ALLOW_MULTIPLE)
    os.environ[_ALLOW_MULTIPLE] = "1"
    try:
        with quiet_libtpu_load():
            topology = topologies.get_topology_desc(
                f"{target.chip}:{target.topology}", target.platform,
                chips_per_host_bounds=target.host_bounds, num_slices=1,
            )
    except RuntimeError as exc:  # JaxRuntimeError is one
        busy = device_error(exc) if "in use by process" in str(exc) else None
        if busy is not None:  # a chip here, held by a server: libtpu refuses to load
            raise busy from None
        if "not installed" in str(exc):
            raise DeviceTargetError(
                f"cannot compile for {target.name}: the TPU compiler (libtpu) is not installed "
                "here; pip install 'jax-aot[tpu]' (libtpu of the version jax[tpu] pins)"
            ) from None
        raise DeviceTargetError(f"cannot compile for {target.name}: {exc}") from None
    finally:
        if allowed is None:
            os.environ.pop(_ALLOW_MULTIPLE, None)
        else:
            os.environ[_ALLOW_MULTIPLE] = allowed
    devices = tuple(topology.devices)
    log.info("target %s: %d compile-only %s device(s)", target.name, len(devices), getattr(devices[0], "device_kind", "?"))
    return devices


# ---------------------------------------------------------------- naming an environment

# The device kind JAX reports -> the chip of a target name. (A v5e reports "TPU v5 lite".)
CHIP_OF_DEVICE_KIND: dict[str, str] = {
    "TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p", "TPU v5p": "v5p",
    "TPU v6 lite": "v6e", "TPU v6e": "v6e",
}
_COORDS = re.compile(r"@\((\d+), (\d+), (\d+)\)")


def target_name(parts: Mapping[str, str]) -> str | None:
    """The device target an environment fingerprint's ``parts`` describe
    (``tpu:v5e:2x2``), read from its platform, device kind and topology (the device
    grid spanned by the devices' coordinates, else the known grid of its device count);
    None when no known target does (a CPU host, an unknown chip or GPU). Pure: listings
    name targets without JAX or libtpu. A GPU is named by its target config's digest
    (:func:`aot.gpu_targets.gpu_name`: ``cuda:h200:8``)."""
    if parts.get("platform") == "gpu":
        return _gpu_target_name(parts)
    if parts.get("platform") != "tpu":
        return None
    chip = CHIP_OF_DEVICE_KIND.get(parts.get("device_kind", ""))
    grids = KNOWN_TOPOLOGIES.get(chip or "", ())
    if not grids:
        return None
    coords = [tuple(int(v) for v in m.groups()) for m in _COORDS.finditer(parts.get("topology", ""))]
    if coords:
        extent = [max(c[i] for c in coords) + 1 for i in range(3)]
        for grid in grids:
            if list(_dims(grid)) == extent:
                return f"tpu:{chip}:{grid}"
        return None
    # A topology too long to store whole (a digest): the count picks the grid.
    count = parts.get("device_count", "")
    by_count = [g for g in grids if count.isdigit() and _chips(g) == int(count)]
    return f"tpu:{chip}:{by_count[0]}" if len(by_count) == 1 else None


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


def _gpu_target_name(parts: Mapping[str, str]) -> str | None:
    from aot.gpu_targets import gpu_name, shape_text

    name = gpu_name(dict(parts))
    count, processes = parts.get("device_count", ""), parts.get("process_count", "1")
    if name is None or not count.isdigit() or not processes.isdigit() or int(count) % int(processes):
        return None
    shape = shape_text(int(processes), int(count) // int(processes))
    return f"cuda:{name}" + (f":{shape}" if shape else "")


def _chips(grid: str) -> int:
    a, b, c = _dims(grid)
    return a * b * c
