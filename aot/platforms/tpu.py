"""The TPU: target names (``tpu:v5e:2x2``, ``@CHIPS_PER_HOST``) and the Cloud TPU
accelerator types they answer, the topology call through libtpu (its lock and its
start-up noise), the key's ``libtpu_init_args`` part, the names of an environment's
parts, and the compile step (plain: libtpu tunes as it compiles)."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from aot.errors import DeviceTargetError
from aot.platforms.tuning import Tuning

log = logging.getLogger(__name__)

__all__ = [
    "CAPTURED_CONFIGS", "CHIP_OF_DEVICE_KIND", "COMPILER_ARGS", "DEVICELESS", "KNOWN_TOPOLOGIES", "NAME", "chip_count",
    "compile_step", "environment_parts", "hint", "known_targets", "lowering_error", "parse", "target_name", "target_text",
    "topology_devices",
]

NAME = "tpu"
CAPTURED_CONFIGS = False
DEVICELESS = True
#: libtpu compiles with the flags of the process that compiles: this host's for a device
#: target too. The key part and the variable (aot.environment leaves out the same flags
#: as from XLA_FLAGS, and JAX's launch barrier).
COMPILER_ARGS: tuple[str, str] | None = ("libtpu_init_args", "LIBTPU_INIT_ARGS")

# The chips and grids of Cloud TPU slices jax-aot knows (libtpu accepts these names).
KNOWN_TOPOLOGIES: dict[str, tuple[str, ...]] = {
    "v4": ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8"),
    "v5e": ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    "v5p": ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8"),
    "v6e": ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
}
_DEFAULT_HOST_BOUNDS = (2, 2, 1)
_ALLOW_MULTIPLE = "ALLOW_MULTIPLE_LIBTPU_LOAD"
_GRID = re.compile(r"^\d+(x\d+){1,2}$")


def _dims(grid: str) -> tuple[int, int, int]:
    values = [int(v) for v in grid.split("x")]
    return (values + [1, 1])[:3]  # type: ignore[return-value]


def _chips(grid: str) -> int:
    a, b, c = _dims(grid)
    return a * b * c


def known_targets() -> str:
    return "; ".join(f"tpu:{chip}:{{{','.join(grids)}}}" for chip, grids in KNOWN_TOPOLOGIES.items())


def parse(text: str, fields: list[str], hosts: str) -> tuple[str, str, tuple[int, int, int]] | None:
    """``tpu:CHIP:GRID[@HOSTS]`` -> (chip, grid, chips per host); None when ``fields``
    are not three (the caller's error names the spelling)."""
    if len(fields) != 3 or not all(fields):
        return None
    chip, grid = (f.strip().lower() for f in fields[1:])
    if grid not in KNOWN_TOPOLOGIES.get(chip, ()):
        return None
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
    return chip, grid, tuple(bounds)  # type: ignore[return-value]


def target_text(chip: str, topology: str, host_bounds: tuple[int, int, int]) -> str:
    default = tuple(min(a, b) for a, b in zip(_dims(topology), _DEFAULT_HOST_BOUNDS))
    suffix = "" if host_bounds == default else "@" + "x".join(map(str, host_bounds[:len(topology.split("x"))]))
    return f"{NAME}:{chip}:{topology}{suffix}"


def chip_count(topology: str, host_bounds: tuple[int, int, int]) -> int:
    return _chips(topology)


#: Cloud TPU accelerator types (``v5litepod-4``, ``v4-8``): the chip each names, and
#: what the number counts (v4 and v5p count TensorCores, two per chip).
_ACCELERATOR_TYPES = {"v5litepod": ("v5e", 1), "v5e": ("v5e", 1), "v6e": ("v6e", 1), "v4": ("v4", 2), "v5p": ("v5p", 2)}
_ACCELERATOR_TYPE = re.compile(r"^(?:tpu[:-])?(v5litepod|v5e|v6e|v4|v5p)-(\d+)$")


def hint(text: str) -> str | None:
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


@lru_cache(maxsize=None)
def topology_devices(chip: str, topology: str, host_bounds: tuple[int, int, int], name: str) -> tuple[Any, ...]:
    """The compile-only devices of a TPU slice (JAX's topology API through libtpu)."""
    from jax.experimental import topologies

    from aot.libtpu_log import quiet_libtpu_load

    # libtpu refuses to load while another process holds the host's lock file (a server
    # on the chip, or another warm-up worker), though a topology opens no chip: allowed
    # while it loads for one (on the chip host a server kept running, measured); only
    # for that load, so this process's own backend, if it opens one, stays guarded.
    allowed = os.environ.get(_ALLOW_MULTIPLE)
    os.environ[_ALLOW_MULTIPLE] = "1"
    try:
        with quiet_libtpu_load():
            described = topologies.get_topology_desc(
                f"{chip}:{topology}", NAME, chips_per_host_bounds=host_bounds, num_slices=1,
            )
    except RuntimeError as exc:  # JaxRuntimeError is one
        if "in use by process" in str(exc):  # a chip here, held by a server: libtpu refuses to
            raise  # load (DeviceTarget.devices names the holder: aot.device.device_error)
        if "not installed" in str(exc):
            raise DeviceTargetError(
                f"cannot compile for {name}: the TPU compiler (libtpu) is not installed "
                "here; pip install 'jax-aot[tpu]' (libtpu of the version jax[tpu] pins)"
            ) from None
        raise DeviceTargetError(f"cannot compile for {name}: {exc}") from None
    finally:
        if allowed is None:
            os.environ.pop(_ALLOW_MULTIPLE, None)
        else:
            os.environ[_ALLOW_MULTIPLE] = allowed
    devices = tuple(described.devices)
    log.info("target %s: %d compile-only %s device(s)", name, len(devices), getattr(devices[0], "device_kind", "?"))
    return devices


def environment_parts(devices: Sequence[Any]) -> dict[str, str]:
    """Nothing beyond the platform-neutral parts (``libtpu_init_args``: :data:`COMPILER_ARGS`)."""
    return {}


# The device kind JAX reports -> the chip of a target name. (A v5e reports "TPU v5 lite".)
CHIP_OF_DEVICE_KIND: dict[str, str] = {
    "TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p", "TPU v5p": "v5p",
    "TPU v6 lite": "v6e", "TPU v6e": "v6e",
}
_COORDS = re.compile(r"@\((\d+), (\d+), (\d+)\)")


def target_name(parts: Mapping[str, str]) -> str | None:
    """The TPU target of an environment's parts, read from its device kind and topology
    (the grid spanned by the devices' coordinates, else the known grid of its count)."""
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


def compile_step(devices: Sequence[Any], options: dict[str, Any] | None, compile_fn: Callable[..., Any], name: str) -> tuple[Any, Tuning | None]:
    return compile_fn(options), None


def lowering_error(name: str, target: str, exc: BaseException) -> Exception | None:
    """None: a lowering's failure for this platform's targets is JAX's own."""
    return None
