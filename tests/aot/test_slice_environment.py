"""A multi-host TPU target (``tpu:v5e:4x4``: 4 hosts of 2x2 chips) against libtpu's
topology description, deviceless: every host of the slice computes the environment
that the target's entry carries, so one artifact serves every host, whatever order its
runtime lists the devices in (libtpu's topology lists them host by host: 0,1,4,5,2,3,...).

What a process on host ``p`` of the slice computes (:func:`aot.environment.environment_parts`
with the default backend) is read from ``jax.devices()``, the whole slice's devices in
and ``jax.process_count()``; nothing of it is the host's own (its local devices, its
process index). Here each host's view is built from the topology's devices.
"""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aot
from aot.environment import environment_parts
from aot.fingerprint import ENVIRONMENT_KIND, Fingerprint
from aot.targets import environment_name, parse_target

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu not installed: compiling for a TPU target needs pip install 'jax-aot[tpu]' (.ci/run installs it)",
)


def _step(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w).sum(axis=0)


def _host_views(devices: tuple, host: int) -> tuple[list[list], list]:
    """The orders in which a process on ``host`` may list the slice's devices
    (``jax.devices()``: libtpu's own order, host by host; by id; its own first), and its
    local devices (``jax.local_devices()``: those of its process index)."""
    local = [d for d in devices if d.process_index == host]
    orders = [list(devices), sorted(devices, key=lambda d: d.id), local + [d for d in devices if d not in local]]
    return orders, local


@needs_libtpu
def test_every_host_of_a_4_host_slice_computes_the_targets_environment(tmp_path) -> None:
    target = parse_target("tpu:v5e:4x4")
    devices = target.devices()
    assert len(devices) == 16 and sorted({d.process_index for d in devices}) == [0, 1, 2, 3]

    mesh = target.mesh({"data": 16})
    x = jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    cache = aot.Cache(tmp_path / "c")
    entry = cache.compile(_step, x, "f32[128,128]", name="slice.step", mesh=mesh, target=target)
    stored = cache.artifact(entry).manifest.environment
    cache.close()
    assert stored.as_dict()["process_count"] == "4" and stored.as_dict()["device_count"] == "16"
    assert environment_name(stored.as_dict()) == "tpu:v5e:4x4"  # aot ls's TARGET column

    seen = set()
    for host in range(4):
        orders, local = _host_views(devices, host)
        assert len(local) == 4  # a v5e host: 2x2 chips, its own
        for everyone in orders:
            parts = environment_parts(devices=everyone)
            assert parts == stored.as_dict(), f"host {host} computes another environment"
            seen.add(Fingerprint.of(ENVIRONMENT_KIND, parts).digest)
        # The host's own devices alone (a process that did not join the slice) are
        # another environment: one host, 4 chips; the entry is not its own.
        alone = environment_parts(devices=local)
        assert (alone["device_count"], alone["process_count"]) == ("4", "1")
    assert seen == {stored.digest} == {entry.env_fp}
