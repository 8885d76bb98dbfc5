"""Device targets (aot/targets.py): compiling for a TPU on this CPU-only host.

The environment an entry records for a target must be exactly what a process on that
accelerator computes from ``jax.devices()``; CHIP_PARTS are the parts a process on a real
TPU v5e chip (one chip, jax 0.10.2, libtpu 0.0.42.1) computed, measured through the
``device`` machine (ACCELERATORS.md). They hold for that libtpu: a libtpu of another
build has another platform_version, on the chip and here alike.
"""

from __future__ import annotations

import importlib.util
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aot
from aot.errors import DeviceTargetError, SpecError
from aot.libtpu_log import filter_libtpu_stderr, quiet_libtpu_load
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
    # GPU targets are cuda:... (tests/aot/test_gpu_targets.py); JAX's own name is refused
    # with the spelling to use, and another platform with the ones known.
    with pytest.raises(DeviceTargetError, match="platform is 'cuda', not 'gpu' .*: cuda:h100:1$"):
        parse_target("gpu:h100:1")
    with pytest.raises(DeviceTargetError, match="supported for tpu, cuda .*not 'rocm'.*compile on a host with that accelerator"):
        parse_target("rocm:mi300:1")


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


@pytest.mark.version_suite
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


@pytest.mark.version_suite
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


# ---------------------------------------------------------------- one program, one key (issue 43)


def _mlp(params: dict[str, jax.Array], x: jax.Array) -> dict[str, jax.Array]:
    h = jnp.tanh(x @ params["w"] + params["b"])
    return {"out": h, "norm": jnp.sum(h * h)}


def _accumulate(acc: jax.Array, x: jax.Array) -> jax.Array:
    return acc + x * 3.0


def _scaled(x: jax.Array, *, scale: int) -> jax.Array:
    return x * scale


_MLP_PARAMS = {"w": "f32[128,64]", "b": "f32[64]"}
# name -> (function, args, lower keywords): a plain program, pytree in and out, a donated
# argument, a static keyword.
_PROGRAMS = {
    "plain": (_tanh_matmul, ("f32[8,128]", "f32[128,128]"), {}),
    "pytree": (_mlp, (_MLP_PARAMS, "f32[8,128]"), {}),
    "donation": (_accumulate, ("f32[1024]", "f32[1024]"), {"donate_argnums": (0,)}),
    "statics": (_scaled, ("bf16[4,4]",), {"static_argnames": ("scale",), "scale": 3}),
}


@needs_libtpu
@pytest.mark.parametrize("program", sorted(_PROGRAMS))
def test_a_program_lowered_for_a_target_has_the_host_program_fingerprint(program: str) -> None:
    """The chip lowers with unspecified in-shardings, as this host does: lowering for
    tpu:v5e:1x1 here must give the very program (every part, so the same key) that a
    process on the chip computes, while the environment is the target's."""
    fn, args, kwargs = _PROGRAMS[program]
    host = aot.lower(fn, *args, name=f"t.{program}", **kwargs)
    target = aot.lower(fn, *args, name=f"t.{program}", target="tpu:v5e:1x1", **kwargs)
    assert target.program_fingerprint.as_dict() == host.program_fingerprint.as_dict()
    assert target.program_fingerprint == host.program_fingerprint
    assert target.as_text() == host.as_text()
    assert "sdy.sharding" not in target.as_text()
    assert target.environment_fingerprint.as_dict()["platform"] == "tpu"
    assert host.environment_fingerprint.as_dict()["platform"] == "cpu"
    # ... and it still compiles for the chip (device 0 of the target).
    exe = target.compile()
    assert exe.info.device_ids == (0,)
    assert all(s.device_set == {aot.parse_target("tpu:v5e:1x1").devices()[0]} for s in exe.info.in_shardings)
    if program == "donation":
        assert target.donated == (True, False)


@needs_libtpu
def test_a_mesh_program_for_a_target_has_the_host_program_fingerprint_over_the_same_ids() -> None:
    """A mesh over this host's devices 0..3 and one over the target's 0..3 describe the
    same program (shardings are recorded by device id)."""
    host_mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("data",))
    target = aot.parse_target("tpu:v5e:2x2")
    target_mesh = target.mesh({"data": 4})

    def lowered(mesh, device_target=None):
        x = jax.ShapeDtypeStruct((16, 128), jnp.float32, sharding=NamedSharding(mesh, P("data")))
        return aot.lower(_tanh_matmul, x, "f32[128,128]", name="t.mesh", mesh=mesh, target=device_target)

    host, on_target = lowered(host_mesh), lowered(target_mesh, target)
    assert on_target.program_fingerprint.as_dict() == host.program_fingerprint.as_dict()
    assert on_target.environment_fingerprint.as_dict()["device_count"] == "4"


@needs_libtpu
def test_an_explicit_sharding_for_a_target_is_kept() -> None:
    """A spec the user placed (on the target's device 0) keeps its sharding: lowering
    under the target's default device adds nothing, and takes nothing away."""
    device = aot.parse_target("tpu:v5e:1x1").devices()[0]
    placed = jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device))
    comp = aot.lower(_tanh_matmul, placed, "f32[128,128]", name="t.placed", target="tpu:v5e:1x1")
    assert type(comp.in_shardings[0]).__name__ == "SingleDeviceSharding"
    assert type(comp.in_shardings[1]).__name__ == "UnspecifiedValue"
    assert "sdy.sharding" in comp.as_text()


@needs_libtpu
def test_cache_compile_for_a_target_stores_the_host_program_key_and_its_portable_hlo(tmp_path) -> None:
    cache = aot.Cache(tmp_path / "c")
    entry = cache.compile(_mlp, _MLP_PARAMS, "f32[8,128]", name="t.mlp", target="tpu:v5e:1x1")
    host = aot.lower(_mlp, _MLP_PARAMS, "f32[8,128]", name="t.mlp")
    assert entry.program_fp == host.program_fingerprint.digest
    manifest = cache.artifact(entry).manifest
    assert manifest.device_ids == (0,)
    assert entry.hlo_digest is not None  # exported under the target's device too
    assert cache.verify().ok
    cache.close()


# ---------------------------------------------------------------- a multi-chip target without a mesh


@needs_libtpu
def test_a_multi_chip_target_without_a_mesh_warns_that_it_runs_on_one_chip(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="aot.lowering"):
        aot.lower(_tanh_matmul, "f32[8,128]", "f32[128,128]", name="t.f", target="tpu:v5e:2x2")
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = record.getMessage()
    assert "t.f: target tpu:v5e:2x2 has 4 chips but no mesh was given" in message
    assert "run on one chip (device 0)" in message
    assert "aot.parse_target('tpu:v5e:2x2').mesh({'data': 4})" in message
    assert 'mesh = "data=4"' in message


@needs_libtpu
def test_one_chip_or_a_mesh_over_all_chips_is_not_warned_about(caplog) -> None:
    target = aot.parse_target("tpu:v5e:2x2")
    mesh = target.mesh({"data": 4})
    x = jax.ShapeDtypeStruct((16, 128), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    with caplog.at_level(logging.WARNING, logger="aot.lowering"):
        aot.lower(_tanh_matmul, "f32[8,128]", "f32[128,128]", name="t.f", target="tpu:v5e:1x1")
        aot.lower(_tanh_matmul, x, "f32[128,128]", name="t.f", mesh=mesh, target=target)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


# ---------------------------------------------------------------- libtpu's start-up noise

_NOISE = (
    "Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type, "
    "please set env var `TPU_ACCELERATOR_TYPE` manually, otherwise libtpu.so may not properly initialize.\n"
    "WARNING: Logging before InitGoogle() is written to STDERR\n"
    "E0000 00:00:1796565107.633362    2049 common_lib.cc:554] INVALID_ARGUMENT: Error: unexpected worker "
    "hostname 'WARNING: could not determine TPU worker hostnames or IP addresses' from env var "
    "TPU_WORKER_HOSTNAMES. Expecting a valid hostname\n"
    "=== Source Location Trace: === \n"
    "learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327\n"
)


@needs_libtpu
def test_loading_a_target_prints_none_of_libtpus_start_up_noise() -> None:
    """A CI log of a deviceless compile shows no 'E0000 ... INVALID_ARGUMENT' line; the
    lines are still there for whoever asks for DEBUG logs."""
    import os
    import subprocess
    import sys

    script = (
        "import logging, sys\n"
        "if sys.argv[1] == 'debug': logging.basicConfig(level=logging.WARNING); logging.getLogger('aot.libtpu_log').setLevel(logging.DEBUG)\n"
        "import aot\n"
        "print(len(aot.parse_target('tpu:v5e:1x1').devices()), len(aot.parse_target('tpu:v5e:2x2').devices()))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
    env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run([sys.executable, "-c", script, "quiet"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "4"]
    for text in ("Failed to find host bounds", "Logging before InitGoogle", "E0000", "INVALID_ARGUMENT",
                 "Source Location Trace", "libtpu_init_utils.cc"):
        assert text not in done.stderr
    debug = subprocess.run([sys.executable, "-c", script, "debug"], env=env, capture_output=True, text=True, timeout=300)
    assert "DEBUG:aot.libtpu_log:libtpu: WARNING: Logging before InitGoogle()" in debug.stderr
    # A host compile where JAX tries the TPU backend (libtpu installed, no JAX_PLATFORMS): as quiet.
    host = "import aot\nprint(aot.lower(lambda x: x + 1, 'f32[4]', name='t.host').environment_fingerprint.as_dict()['platform'])\n"
    env.pop("JAX_PLATFORMS")
    done = subprocess.run([sys.executable, "-c", host], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["cpu"], done.stderr
    assert "E0000" not in done.stderr and "Logging before InitGoogle" not in done.stderr


def test_the_libtpu_filter_drops_only_the_known_noise() -> None:
    unknown = "E0000 00:00:1796565107.1    2049 tpu_compiler.cc:12] INTERNAL: ran out of memory\n"
    trace = "=== Source Location Trace: ===\nthird_party/tpu/compiler.cc:99\n"
    kept, dropped = filter_libtpu_stderr(_NOISE + unknown + trace + "a line of our own\n")
    assert kept == unknown + trace + "a line of our own\n"  # unchanged, trace with its line
    assert len(dropped) == 5 and dropped[-1] == "learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327"
    assert filter_libtpu_stderr("W0000 00:00:1.0 1 x.cc:1] something new\n")[0] == "W0000 00:00:1.0 1 x.cc:1] something new\n"


def test_a_failed_load_writes_every_line_and_keeps_its_error(capfd) -> None:
    import os

    with pytest.raises(RuntimeError, match="^the load failed$"):
        with quiet_libtpu_load():
            os.write(2, _NOISE.encode())
            raise RuntimeError("the load failed")
    assert capfd.readouterr().err == _NOISE
    with quiet_libtpu_load():
        os.write(2, (_NOISE + "something else\n").encode())
    assert capfd.readouterr().err == "something else\n"
