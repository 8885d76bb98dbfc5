"""Compile with aot.Cache and serve with aot.load on the accelerator, in one process.

Only one process at a time may hold a TPU chip, so everything here compiles and serves
in the pytest process itself. Every test is skipped on CPU (CI), with the reason shown
by ``-ra``; nothing opens a device at collection time. On the chip::

    JAX_PLATFORMS=tpu python3 -P -m pytest -q --import-mode=append tests/accelerator

(``-P`` and ``--import-mode=append``: the installed ``aot`` wins over the checkout's
``aot/`` folder, which lacks ``aot.cache``; tests/conftest.py pins 8 CPU devices only
when the platform is the CPU.) About a minute on a TPU v5e chip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import aot
from aot.artifact import EXECUTABLE
from aot.cache.storage.content import compress

pytestmark = pytest.mark.accelerator

SKIP_REASON = (
    "needs an accelerator: jax.devices()[0] is a CPU device (on a TPU host, run with "
    "JAX_PLATFORMS=tpu; see this module's docstring)"
)


@pytest.fixture(autouse=True)
def _on_an_accelerator() -> None:
    # At run time, not at collection: collecting must not open a device.
    if jax.devices()[0].platform == "cpu":
        pytest.skip(SKIP_REASON)


# ---------------------------------------------------------------- programs


def affine(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w) * 2.0 + 1.0


def mlp(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ params["w1"] + params["b1"])
    return jax.nn.log_softmax(h @ params["w2"] + params["b2"])


def mlp_specs(batch: int) -> tuple[dict[str, jax.ShapeDtypeStruct], jax.ShapeDtypeStruct]:
    f32 = jnp.float32
    params = {"w1": jax.ShapeDtypeStruct((256, 512), f32), "b1": jax.ShapeDtypeStruct((512,), f32),
              "w2": jax.ShapeDtypeStruct((512, 128), f32), "b2": jax.ShapeDtypeStruct((128,), f32)}
    return params, jax.ShapeDtypeStruct((batch, 256), f32)


def accumulate(acc: jax.Array, x: jax.Array) -> jax.Array:
    return acc + x * 3.0


def random_like(specs: Any, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda s: jnp.asarray(rng.standard_normal(s.shape).astype(np.float32), dtype=s.dtype), specs
    )


def assert_identical(got: Any, want: Any) -> None:
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for a, b in zip(got_leaves, want_leaves):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
        assert a.tobytes() == b.tobytes()  # bit for bit (NaNs, signed zeros)


BUCKETS = (8, 16)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the module: affine (bf16), mlp at batch 8 and 16, accumulate with
    its first argument donated."""
    folder = tmp_path_factory.mktemp("chip") / "cache"
    cache = aot.Cache(str(folder))
    bf16 = jax.ShapeDtypeStruct((128, 256), jnp.bfloat16)
    cache.compile(affine, bf16, jax.ShapeDtypeStruct((256, 128), jnp.bfloat16), name="chip.affine")
    for batch in BUCKETS:
        cache.compile(mlp, *mlp_specs(batch), name="chip.mlp")
    spec = jax.ShapeDtypeStruct((1024,), jnp.float32)
    cache.compile(accumulate, spec, spec, name="chip.accumulate", donate_argnums=(0,))
    cache.close()
    return folder


# ---------------------------------------------------------------- the tests


def test_the_entries_are_for_this_accelerator(cache_dir: Path) -> None:
    cache = aot.Cache(str(cache_dir), read_only=True)
    try:
        entries = cache.entries()
        assert {e.name for e in entries} == {"chip.affine", "chip.mlp", "chip.accumulate"}
        assert len([e for e in entries if e.name == "chip.mlp"]) == len(BUCKETS)
    finally:
        cache.close()


def test_a_small_program_is_bit_identical_to_jit(cache_dir: Path) -> None:
    x = random_like(jax.ShapeDtypeStruct((128, 256), jnp.bfloat16), 1)
    w = random_like(jax.ShapeDtypeStruct((256, 128), jnp.bfloat16), 2)
    served = aot.load("chip.affine", cache=str(cache_dir), strict=True)
    assert_identical(served(x, w), jax.jit(affine)(x, w))


@pytest.mark.parametrize("mode", ["default", "lazy", "background", "strict"])
def test_two_buckets_are_bit_identical_to_jit(cache_dir: Path, mode: str) -> None:
    options = {"default": {}, "lazy": {"lazy": True}, "background": {"background": True},
               "strict": {"strict": True}}[mode]
    served = aot.load("chip.mlp", cache=str(cache_dir), **options)
    reference = jax.jit(mlp)
    for batch in BUCKETS:
        params, x = random_like(mlp_specs(batch), batch)
        assert_identical(served(params, x), reference(params, x))
    assert len(served.signatures) == len(BUCKETS)


def test_donation_deletes_the_donated_buffer(cache_dir: Path) -> None:
    served = aot.load("chip.accumulate", cache=str(cache_dir), strict=True)
    acc, x = jnp.arange(1024, dtype=jnp.float32), jnp.ones(1024, jnp.float32)
    want = jax.jit(accumulate)(jnp.arange(1024, dtype=jnp.float32), x)
    got = served(acc, x)
    assert acc.is_deleted() and not x.is_deleted()
    assert_identical(got, want)
    # as under jax.jit with the same donation
    jit_acc = jnp.arange(1024, dtype=jnp.float32)
    jax.jit(accumulate, donate_argnums=(0,))(jit_acc, x)
    assert jit_acc.is_deleted()


def _flip_executable_byte(cache: Any, name: str) -> Any:
    """A flipped byte of the stored executable, recompressed: only the digest tells."""
    (entry,) = cache.entries(name)
    digest = entry.manifest_dict()["blobs"][EXECUTABLE]["digest"]
    data = bytearray(cache.blobs.get(digest))
    data[len(data) // 3] ^= 0x01
    cache.blobs.store.write(digest, compress(bytes(data)))
    return entry


def test_a_corrupted_executable_is_refused_under_strict_and_healed_otherwise(tmp_path: Path) -> None:
    folder = str(tmp_path / "cache")
    cache = aot.Cache(folder)
    spec = jax.ShapeDtypeStruct((128, 256), jnp.float32)
    w_spec = jax.ShapeDtypeStruct((256, 128), jnp.float32)
    cache.compile(affine, spec, w_spec, name="chip.victim")
    entry = _flip_executable_byte(cache, "chip.victim")
    x, w = random_like(spec, 3), random_like(w_spec, 4)
    want = jax.jit(affine)(x, w)

    with pytest.raises(aot.CorruptArtifactError):
        served = aot.load("chip.victim", cache=folder, strict=True)
        served(x, w)  # a background load raises at the first call
    assert cache.index.get(entry.key).ok  # strict never writes

    served = aot.load("chip.victim", cache=folder)  # recompiles from the portable HLO
    assert_identical(served(x, w), want)
    healed = cache.index.get(entry.key)
    assert healed is not None and healed.ok
    assert cache.blobs.check(healed.exe_digest) is None
    assert_identical(aot.load("chip.victim", cache=folder, strict=True)(x, w), want)
    cache.close()


def test_a_named_sharding_over_a_mesh_of_the_devices(tmp_path: Path) -> None:
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    replicated = NamedSharding(mesh, PartitionSpec())
    batch = 8 * len(devices)
    x_spec = jax.ShapeDtypeStruct((batch, 256), jnp.float32, sharding=rows)
    w_spec = jax.ShapeDtypeStruct((256, 128), jnp.float32, sharding=replicated)
    folder = str(tmp_path / "cache")
    cache = aot.Cache(folder)
    cache.compile(affine, x_spec, w_spec, name="chip.sharded", mesh=mesh, in_shardings=(rows, replicated))
    cache.close()
    x = jax.device_put(random_like(jax.ShapeDtypeStruct((batch, 256), jnp.float32), 5), rows)
    w = jax.device_put(random_like(jax.ShapeDtypeStruct((256, 128), jnp.float32), 6), replicated)
    got = aot.load("chip.sharded", cache=folder, strict=True)(x, w)
    want = jax.jit(affine, in_shardings=(rows, replicated))(x, w)
    assert_identical(got, want)
    assert got.sharding.is_equivalent_to(want.sharding, got.ndim)


# ---------------------------------------------------------------- one program, one key (issue 43)

PARITY_TARGET = "tpu:v5e:1x1"


def parity_programs() -> dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """name -> (function, specs, lower keywords): bf16, a pytree, a donated argument.
    Also imported by the deviceless compile below, in a process of its own."""
    bf16 = jnp.bfloat16
    vector = jax.ShapeDtypeStruct((1024,), jnp.float32)
    return {
        "parity.affine": (affine, (jax.ShapeDtypeStruct((128, 256), bf16), jax.ShapeDtypeStruct((256, 128), bf16)), {}),
        "parity.mlp": (mlp, mlp_specs(8), {}),
        "parity.accumulate": (accumulate, (vector, vector), {"donate_argnums": (0,)}),
    }


# Run by a process of its own that never opens the chip (JAX_PLATFORMS=cpu, no TPU_*
# variable: a CPU CI runner's environment): compiles every parity program for the
# target into the cache, prints each one's fingerprints as JSON.
_DEVICELESS = """
import importlib.util, json, sys
import aot
spec = importlib.util.spec_from_file_location("on_chip_programs", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
cache = aot.Cache(sys.argv[2])
found = {}
for name, (fn, specs, kwargs) in module.parity_programs().items():
    comp = aot.lower(fn, *specs, name=name, target=sys.argv[3], **kwargs)
    entry = cache.put(comp)
    found[name] = {"key": comp.fingerprint, "stored": entry.key, "platform": entry.platform,
                   "program": comp.program_fingerprint.as_dict(),
                   "environment": comp.environment_fingerprint.as_dict()}
cache.close()
print(json.dumps(found))
"""


def _cpu_runner_environment() -> dict[str, str]:
    """This process's environment as a CPU-only CI runner's: the chip host carries TPU_*
    variables (and import jax here set more), a CPU runner has none, and JAX sees no chip."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_") and k != "LIBTPU_INIT_ARGS"}
    env["JAX_PLATFORMS"] = "cpu"
    # Without it, libtpu asks the cloud metadata server for the TPU's shape; the chip
    # machine reaches no server, and libtpu's retries hung the compile for minutes. A
    # CPU runner gets the same answer either way: the target names the topology.
    env["TPU_SKIP_MDS_QUERY"] = "true"
    return env


def _compile_deviceless(folder: Path) -> dict[str, Any]:
    import json
    import subprocess
    import sys

    env = _cpu_runner_environment()
    done = subprocess.run(
        [sys.executable, "-P", "-c", _DEVICELESS, str(Path(__file__).resolve()), str(folder), PARITY_TARGET],
        env=env, cwd=str(folder.parent), capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_a_program_compiled_deviceless_and_on_the_chip_has_one_key(tmp_path: Path) -> None:
    """The same program compiled for tpu:v5e:1x1 on a CPU (deviceless, in a process that
    never opens the chip) and on the chip itself: one program fingerprint, one key, and
    the chip's compile finds the deviceless entry; served, both give the same bits (TPU
    executables are not byte-deterministic, so outputs are compared, not bytes)."""
    folder = tmp_path / "cache"
    deviceless = _compile_deviceless(folder)
    cache = aot.Cache(str(folder))
    try:
        for seed, (name, (fn, specs, kwargs)) in enumerate(parity_programs().items()):
            stored = deviceless[name]
            assert stored["platform"] == "tpu" and stored["stored"] == stored["key"]
            on_chip = aot.lower(fn, *specs, name=name, **kwargs)
            program = on_chip.program_fingerprint.as_dict()
            assert {k: (v, stored["program"].get(k)) for k, v in program.items() if stored["program"].get(k) != v} == {}
            assert program == stored["program"]
            environment = on_chip.environment_fingerprint.as_dict()
            assert {k: (v, stored["environment"].get(k)) for k, v in environment.items()
                    if stored["environment"].get(k) != v} == {}
            assert on_chip.fingerprint == stored["key"]
            # Compiling here is a hit on the entry the CPU compiled: one key, one entry.
            result = cache.compile_entry(fn, *specs, name=name, **kwargs)
            assert result.hit and result.entry.key == stored["key"]
            assert [e.key for e in cache.entries(name)] == [stored["key"]]

            served = aot.load(name, cache=str(folder), strict=True)
            chip_exe = on_chip.compile_fresh()  # compiled on the chip itself
            inputs = random_like(specs, 10 + seed)
            want = chip_exe(*jax.tree_util.tree_map(jnp.copy, inputs))
            assert_identical(served(*jax.tree_util.tree_map(jnp.copy, inputs)), want)
            assert_identical(jax.jit(fn)(*inputs), want)
    finally:
        cache.close()


# ---------------------------------------------------------------- parity: deviceless == on chip

DEVICELESS_COMPILE = '''
import sys
import jax
import jax.numpy as jnp
import aot

def affine(x, w):
    return jnp.tanh(x @ w) * 2.0 + 1.0

def scanned(xs):
    return jax.lax.scan(lambda c, x: (c * 0.5 + x, c.sum()), xs[0], xs)[1]

assert jax.devices()[0].platform == "cpu"  # deviceless: the chip is not opened
cache = aot.Cache(sys.argv[1])
cache.compile(affine, "f32[8,128]", "f32[128,128]", name="parity.affine", target="tpu:v5e:1x1")
cache.compile(affine, "bf16[16,128]", "bf16[128,128]", name="parity.affine", target="tpu:v5e:1x1")
cache.compile(scanned, "f32[6,32]", name="parity.scan", target="tpu:v5e:1x1")
cache.close()
'''


def test_a_deviceless_compile_is_what_the_chip_compiles(tmp_path: Path) -> None:
    """Compile for tpu:v5e:1x1 in a process that sees only the CPU (as a CI runner
    does), then `aot verify --recompile` here, on the chip: each stored executable must
    be what the chip compiles from the stored HLO (same optimized HLO, bit-identical
    outputs on generated inputs). This is the README's deviceless == on-chip proof."""
    import json
    import subprocess
    import sys

    from click.testing import CliRunner

    from aot.cli.main import cli

    script = tmp_path / "deviceless_compile.py"
    script.write_text(DEVICELESS_COMPILE)
    env = {**_cpu_runner_environment()}
    env.pop("AOT_CACHE", None)
    done = subprocess.run([sys.executable, "-P", str(script), str(tmp_path / "c")], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]

    result = CliRunner().invoke(cli, ["--cache", str(tmp_path / "c"), "--json", "verify", "--recompile"])
    data = json.loads(result.output)
    statuses = {(e["name"], e["signature"]): (e["status"], e["method"], e["detail"]) for e in data["recompile"]["entries"]}
    assert len(statuses) == 3, statuses
    assert all(status == "OK" for status, _, _ in statuses.values()), statuses
    assert result.exit_code == 0, result.output
    print("deviceless == on chip:", json.dumps(data["recompile"]["entries"]))  # the figures for the README


# ---------------------------------------------------------------- the CI flow, served (issue 43)

RELEASE_MANIFEST = """
target = "tpu:v5e:1x1"

[[function]]
name     = "flow.tiny"
function = "fixtures.models:tiny"
args     = ["f32[8]", "f32[8]"]

[[function]]
name     = "flow.matmul"
function = "fixtures.models:matmul"
args     = ["bf16[256,512]", "bf16[512,256]"]
"""


def test_a_release_declared_on_a_cpu_runner_is_what_the_chip_serves(tmp_path: Path) -> None:
    """The new-user flow of issue 43 (tests/cli/test_target_flow.py on CPU), ended on the
    chip: a CPU-only runner warms a manifest for tpu:v5e:1x1 into release prod and gates
    it; the chip, naming prod, serves exactly prod's members (strict: no compile here),
    bit-identical to jax.jit on the chip."""
    import json
    import subprocess
    import sys

    from fixtures import models

    repo = Path(__file__).resolve().parents[2]
    manifest = tmp_path / "serve.toml"
    manifest.write_text(RELEASE_MANIFEST)
    folder = tmp_path / "cache"
    run_aot = "import sys; from aot.cli.main import main; sys.argv[0] = 'aot'; main()"
    env = {**_cpu_runner_environment(), "GIT_COMMIT": "1" * 40}
    for args in (("warmup", str(manifest), "--release", "prod"), ("verify", "--manifest", str(manifest), "--strict")):
        done = subprocess.run([sys.executable, "-P", "-c", run_aot, "--cache", str(folder), *args], env=env,
                              cwd=repo, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    cache = aot.Cache(str(folder))
    try:
        members = {(m.name, m.key) for m in cache.release("prod").members}
    finally:
        cache.close()
    assert {name for name, _ in members} == {"flow.tiny", "flow.matmul"}
    bf16 = jnp.bfloat16
    for seed, (name, fn, specs) in enumerate((
        ("flow.tiny", models.tiny, models.tiny_specs()),
        ("flow.matmul", models.matmul, (jax.ShapeDtypeStruct((256, 512), bf16), jax.ShapeDtypeStruct((512, 256), bf16))),
    )):
        served = aot.load(name, cache=str(folder), release="prod", strict=True)
        inputs = random_like(specs, 20 + seed)
        assert_identical(served(*inputs), jax.jit(fn)(*inputs))
    shown = json.dumps(sorted(members))
    print("served on the chip from release prod:", shown)
