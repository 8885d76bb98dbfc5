"""Device targets (aot/targets.py): compiling for a TPU on this CPU-only host.

The environment an entry records for a target must be exactly what a process on that
accelerator computes from ``jax.devices()``; CHIP_PARTS are the parts a process on a real
TPU v5e chip (one chip, jax 0.10.2, libtpu 0.0.42.1) computed, measured through the
``device`` machine (ACCELERATORS.md). They hold for that libtpu: a libtpu of another
build has another platform_version, on the chip and here alike.
"""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aot
from aot.errors import DeviceTargetError, SpecError
from aot.targets import parse_target

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu not installed: compiling for a TPU target needs pip install 'jax-aot[tpu]' (.ci/run installs it)",
)

CHIP_PARTS = {
    "platform": "tpu",
    "device_kind": "TPU v5 lite",
    "device_count": "1",
    "process_count": "1",
    "topology": "0@(0, 0, 0)/0",
}
CHIP_PLATFORM_VERSION = {"0.0.42.1": "PJRT C API\nTFRT TPU v5 lite\nBuilt on Jun 17 2026 11:08:48 (1781719728) cl/933746096"}


def _tanh_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w)


# ---------------------------------------------------------------- parsing (no libtpu)


def test_parse_target_names_chip_topology_and_hosts() -> None:
    t = parse_target("tpu:v5e:2x2")
    assert (t.platform, t.chip, t.topology, t.host_bounds, t.chip_count) == ("tpu", "v5e", "2x2", (2, 2, 1), 4)
    assert parse_target("TPU:v5e:1x1").host_bounds == (1, 1, 1)  # smaller than a host
    assert parse_target("tpu:v5e:2x4@2x4").host_bounds == (2, 4, 1)  # one host of 8 chips
    assert parse_target("tpu:v5e:2x4@2x4").name == "tpu:v5e:2x4@2x4"
    assert parse_target("tpu:v5e:2x4").name == "tpu:v5e:2x4"


@pytest.mark.parametrize("text", ["tpu:v5e:3x3", "tpu:v9:2x2", "v5e:2x2", "tpu:v5e"])
def test_an_unknown_target_lists_the_known_ones(text: str) -> None:
    with pytest.raises(DeviceTargetError) as info:
        parse_target(text)
    message = str(info.value)
    assert repr(text) in message
    assert "tpu:v5e:{1x1,2x2,2x4" in message and "tpu:v4:{2x2x1" in message


def test_a_gpu_target_says_what_it_would_need() -> None:
    with pytest.raises(DeviceTargetError, match="not 'gpu'.*compile on a host with that accelerator"):
        parse_target("gpu:h100:1")


def test_chips_per_host_must_divide_the_topology() -> None:
    with pytest.raises(DeviceTargetError, match="not a whole number"):
        parse_target("tpu:v5e:2x4@3x1")


# ---------------------------------------------------------------- compiling (libtpu)


@needs_libtpu
def test_a_target_environment_is_the_chip_one() -> None:
    comp = aot.lower(_tanh_matmul, "f32[8,128]", "f32[128,128]", name="t.f", target="tpu:v5e:1x1")
    parts = comp.environment_fingerprint.as_dict()
    assert {k: parts[k] for k in CHIP_PARTS} == CHIP_PARTS
    libtpu_version = importlib.metadata.version("libtpu")
    if libtpu_version in CHIP_PLATFORM_VERSION:
        assert parts["platform_version"] == CHIP_PLATFORM_VERSION[libtpu_version]
    assert parts["jax"] == jax.__version__ and "cpu_isa" not in parts
    # This host's own environment is untouched (and differs from the target's).
    assert aot.lower(_tanh_matmul, "f32[8,128]", "f32[128,128]", name="t.f").environment_fingerprint.as_dict()["platform"] == "cpu"


@needs_libtpu
def test_a_four_chip_target_has_four_devices_and_two_hosts_when_asked() -> None:
    comp = aot.lower(_tanh_matmul, "f32[8,128]", "f32[128,128]", name="t.f", target="tpu:v5e:2x2")
    parts = comp.environment_fingerprint.as_dict()
    assert (parts["device_count"], parts["process_count"]) == ("4", "1")
    two_hosts = aot.lower(_tanh_matmul, "f32[8,128]", "f32[128,128]", name="t.f", target="tpu:v5e:4x4")
    assert two_hosts.environment_fingerprint.as_dict()["process_count"] == "4"


@needs_libtpu
def test_cache_compile_for_a_target_stores_an_entry_this_host_does_not_load(tmp_path) -> None:
    cache = aot.Cache(tmp_path / "c")
    entry = cache.compile(_tanh_matmul, "f32[8,128]", "f32[128,128]", name="t.f", target="tpu:v5e:1x1")
    assert entry.platform == "tpu" and entry.exe_digest is not None and entry.hlo_digest is not None
    assert entry.key == aot.lower(_tanh_matmul, "f32[8,128]", "f32[128,128]", name="t.f", target="tpu:v5e:1x1").fingerprint
    # Again: a hit that neither loads nor quarantines what this host cannot run.
    result = cache.compile_entry(_tanh_matmul, "f32[8,128]", "f32[128,128]", name="t.f", target="tpu:v5e:1x1")
    assert result.hit and result.executable is None
    assert [e.state for e in cache.entries("t.f")] == ["ok"]
    assert cache.verify().ok
    cache.close()


@needs_libtpu
def test_a_mesh_over_a_multi_chip_target(tmp_path) -> None:
    target = aot.parse_target("tpu:v5e:2x2")
    mesh = target.mesh({"data": 4})
    sharded = jax.ShapeDtypeStruct((16, 128), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    cache = aot.Cache(tmp_path / "c")
    entry = cache.compile(_tanh_matmul, sharded, "f32[128,128]", name="t.sharded", mesh=mesh, target=target)
    manifest = cache.artifact(entry).manifest
    assert manifest.device_ids == (0, 1, 2, 3)
    assert manifest.environment.as_dict()["device_count"] == "4"
    cache.close()


@needs_libtpu
def test_a_mesh_of_this_host_is_refused_for_a_target() -> None:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
    with pytest.raises(SpecError, match="not the target tpu:v5e:2x2's"):
        aot.lower(_tanh_matmul, "f32[8,128]", "f32[128,128]", name="t.f", mesh=mesh, target="tpu:v5e:2x2")


@needs_libtpu
def test_a_mesh_larger_than_the_target_is_refused() -> None:
    with pytest.raises(DeviceTargetError, match="needs 8 devices; the target tpu:v5e:2x2 has 4"):
        aot.parse_target("tpu:v5e:2x2").mesh({"data": 8})


@needs_libtpu
def test_an_executable_compiled_for_a_target_says_where_it_runs() -> None:
    exe = aot.lower(_tanh_matmul, "f32[8,128]", "f32[128,128]", name="t.f", target="tpu:v5e:1x1").compile()
    assert exe.info.device_ids == (0,)
    with pytest.raises(DeviceTargetError, match="compiled for tpu:v5e:1x1 without the device and runs only there"):
        exe(np.ones((8, 128), np.float32), np.ones((128, 128), np.float32))


def test_a_target_only_process_makes_the_cpu_its_backend() -> None:
    """aot warmup --target on a TPU host whose chip a server holds must not open it
    (jax.export asks for the default backend): the CPU becomes the default, before or
    after JAX is imported, unless JAX_PLATFORMS says otherwise."""
    import os
    import subprocess
    import sys

    script = (
        "import os, sys\n"
        "if sys.argv[1] == 'after': import jax\n"
        "from aot.targets import compile_only_here\n"
        "compile_only_here()\n"
        "import jax\n"
        "print(os.environ['JAX_PLATFORMS'], jax.config.jax_platforms)\n"
        "if os.environ['JAX_PLATFORMS'] == 'cpu': print(jax.default_backend())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    for when in ("before", "after"):
        done = subprocess.run([sys.executable, "-c", script, when], env=env, capture_output=True, text=True, timeout=120)
        assert done.stdout.split() == ["cpu", "cpu", "cpu"], done.stderr
    env["JAX_PLATFORMS"] = "cpu,tpu"  # the user's word stands
    done = subprocess.run([sys.executable, "-c", script, "before"], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["cpu,tpu", "cpu,tpu"], done.stderr
