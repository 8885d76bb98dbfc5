"""Shardings as XLA sees them: ``GSPMDSharding``, HLO shardings and their equality.

Wraps ``jax._src.sharding_impls.GSPMDSharding`` (a manifest may record a sharding
that only an HLO sharding describes), the private ``Sharding._to_xla_hlo_sharding``
and ``_device_assignment``, ``xla_client.HloSharding`` and
``op_shardings.are_hlo_shardings_equal`` (two HLO shardings that place data the
same way can differ as text), and ``xla_client.DeviceList``; a one-device sharding
on every release.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax._src import op_shardings
from jax._src.lib import xla_client as xc
from jax._src.sharding_impls import GSPMDSharding


def gspmd_sharding(devices: Sequence[Any], hlo_text: str, memory_kind: str | None) -> Any:
    """A sharding over ``devices`` described by an HLO sharding's text."""
    return GSPMDSharding(tuple(devices), xc.HloSharding.from_string(hlo_text), memory_kind=memory_kind)


def xla_device_list(devices: Sequence[Any]) -> Any:
    """The ``xla_client.DeviceList`` of ``devices``, in this order (what an
    executable is loaded onto)."""
    return xc.DeviceList(tuple(devices))


def hlo_sharding(sharding: Any, ndim: int) -> Any:
    """``sharding`` as XLA's ``HloSharding`` for an array of rank ``ndim``."""
    return sharding._to_xla_hlo_sharding(ndim)


def device_assignment(sharding: Any) -> tuple[Any, ...]:
    """The devices of ``sharding`` in the order its HLO sharding numbers them."""
    return tuple(sharding._device_assignment)


def hlo_sharding_from_proto(op_sharding: Any) -> Any:
    """XLA's ``HloSharding`` of an ``OpSharding`` (what an executable reports)."""
    return xc.HloSharding.from_proto(op_sharding)


def hlo_shardings_equal(left: Any, right: Any) -> bool:
    """True when two HLO shardings place data the same way."""
    return bool(op_shardings.are_hlo_shardings_equal(left, right))


def single_device_sharding(device: Any, memory_kind: str | None = None) -> Any:
    """The sharding that places an array on ``device`` alone."""
    # Release difference "SingleDeviceSharding": JAX 0.12.1 deprecates the public class
    # jax.sharding.SingleDeviceSharding (a warning on each use) for
    # make_single_device_sharding / is_single_device_sharding, which 0.9-0.12.0 lack.
    make = getattr(jax.sharding, "make_single_device_sharding", None)
    if make is not None:
        return make(device, memory_kind=memory_kind)
    return jax.sharding.SingleDeviceSharding(device, memory_kind=memory_kind)


def is_single_device_sharding(sharding: Any) -> bool:
    """Whether ``sharding`` is one :func:`single_device_sharding` makes."""
    check = getattr(jax.sharding, "is_single_device_sharding", None)
    if check is not None:
        return bool(check(sharding))
    return isinstance(sharding, jax.sharding.SingleDeviceSharding)
