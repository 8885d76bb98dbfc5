"""Shardings and avals <-> JSON data, resolved against the live devices by id."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from aot.device import default_devices
from aot.errors import CorruptArtifactError, IncompatibleEnvironmentError
from aot.jaxcompat.shardings import (
    device_assignment, gspmd_sharding, hlo_sharding, is_single_device_sharding, single_device_sharding, xla_device_list,
)
from aot.specs import dtype_to_str, parse_dtype

Devices = Mapping[int, Any]


def spec_to_json(spec: PartitionSpec) -> list[Any]:
    return [list(e) if isinstance(e, tuple) else e for e in spec]


def spec_from_json(data: Sequence[Any]) -> PartitionSpec:
    return PartitionSpec(*(tuple(e) if isinstance(e, list) else e for e in data))


def mesh_to_json(mesh: Mesh) -> dict[str, Any]:
    return {
        "axis_names": list(mesh.axis_names),
        "shape": [int(n) for n in mesh.devices.shape],
        "device_ids": [int(d.id) for d in mesh.devices.flat],
        "axis_types": [str(t).rpartition(".")[2] for t in mesh.axis_types],
    }


def mesh_from_json(data: Mapping[str, Any], devices: Devices) -> Mesh:
    ids = data["device_ids"]
    grid = np.array([_device(devices, i) for i in ids], dtype=object).reshape(data["shape"])
    types = tuple(AxisType[t] for t in data.get("axis_types", []))  # an enum member by name
    return Mesh(grid, tuple(data["axis_names"]), axis_types=types or None)


def _device(devices: Devices, device_id: int) -> Any:
    try:
        return devices[int(device_id)]
    except KeyError:
        raise IncompatibleEnvironmentError(
            f"the artifact needs device id {device_id}, which this runtime does not have "
            f"(devices {sorted(devices)}); load it on a host with the same devices or "
            "recompile it from its portable HLO",
            (f"device {device_id} missing",),
        ) from None


def sharding_to_json(sharding: Any, ndim: int) -> dict[str, Any]:
    memory_kind = getattr(sharding, "memory_kind", None)
    if is_single_device_sharding(sharding):
        (device,) = sharding.device_set
        return {"type": "single", "device": int(getattr(device, "id")), "memory_kind": memory_kind}
    if isinstance(sharding, NamedSharding):
        return {
            "type": "named",
            # A compiled or lowered program's NamedSharding holds a concrete Mesh.
            "mesh": mesh_to_json(cast(Mesh, sharding.mesh)),
            "spec": spec_to_json(sharding.spec),
            "memory_kind": memory_kind,
        }
    device_ids = [int(d.id) for d in device_assignment(sharding)]
    return {
        "type": "gspmd",
        "device_ids": device_ids,
        "hlo": str(hlo_sharding(sharding, ndim)),
        "memory_kind": memory_kind,
    }


def sharding_from_json(data: Mapping[str, Any], devices: Devices) -> Any:
    kind = data.get("type")
    memory_kind = data.get("memory_kind")
    try:
        if kind == "single":
            return single_device_sharding(_device(devices, data["device"]), memory_kind)
        if kind == "named":
            mesh = mesh_from_json(data["mesh"], devices)
            return NamedSharding(mesh, spec_from_json(data["spec"]), memory_kind=memory_kind)
        if kind == "gspmd":
            assigned = tuple(_device(devices, i) for i in data["device_ids"])
            return gspmd_sharding(assigned, data["hlo"], memory_kind)
    except IncompatibleEnvironmentError:
        raise
    except Exception as exc:  # noqa: BLE001 - jax raises many kinds on bad data
        raise CorruptArtifactError(f"malformed sharding {dict(data)!r}: {exc}") from None
    raise CorruptArtifactError(f"unknown sharding type {kind!r} in manifest")


def aval_to_json(aval: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "shape": [int(d) for d in aval.shape],
        "dtype": dtype_to_str(aval.dtype),
    }
    if getattr(aval, "weak_type", False):
        out["weak_type"] = True
    sharding = getattr(aval, "sharding", None)
    if sharding is not None and any(
        t == AxisType.Explicit for t in getattr(sharding.mesh, "axis_types", ())
    ):
        out["spec"] = spec_to_json(sharding.spec)
    return out


def aval_from_json(data: Mapping[str, Any], sharding: Any = None) -> jax.core.ShapedArray:
    try:
        shape = tuple(int(d) for d in data["shape"])
        dtype = parse_dtype(str(data["dtype"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptArtifactError(f"malformed aval {dict(data)!r}: {exc}") from None
    weak = bool(data.get("weak_type", False))
    if "spec" in data and isinstance(sharding, NamedSharding):
        abstract = NamedSharding(sharding.mesh.abstract_mesh, spec_from_json(data["spec"]))
        return jax.core.ShapedArray(shape, dtype, weak_type=weak, sharding=abstract)
    return jax.core.ShapedArray(shape, dtype, weak_type=weak)


def live_devices(backend: str | None = None) -> dict[int, Any]:
    return {int(d.id): d for d in default_devices(backend)}


def device_list(ids: Sequence[int], devices: Devices) -> Any:
    """The XLA device list of ``ids``; names a device id this runtime lacks."""
    return xla_device_list([_device(devices, i) for i in ids])
