"""GPU targets (aot/platforms/cuda.py): names, keys, deviceless compiles for an H100 and an
H200 through JAX's CUDA plugin on this CPU-only host, captured GPUs and autotune results.

The compiles need ``jax-aot[cuda12]`` (the plugin and ptxas): CI runs this file again in
a venv that has it (.ci/run); without it they skip and the refusal is tested instead.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import aot
from aot.platforms import cuda as gpu_targets
from aot.build import serialize_executable
from aot.jaxcompat.versions import release_tuple
from aot.targets import environment_name, target_name

#: JAX's CUDA plugin of this jaxlib's release is installed (jax-aot[cuda12], or [cuda13] on 0.12.1).
HAS_PLUGIN = gpu_targets.problem_here() is None
needs_plugin = pytest.mark.skipif(not HAS_PLUGIN, reason="needs jax-aot[cuda12] (JAX's CUDA plugin and ptxas)")

#: What a deviceless compile for the shipped H200 config records (checked below): its
#: client's platform version says "PJRT C API" on 0.10.2, "cuda 0" (kept as "cuda") on 0.12.
H200_PARTS = {
    "platform": "gpu", "device_kind": "NVIDIA H200", "device_count": "1", "process_count": "1",
    "topology": "0/p0", "gpu_compute_capability": "9.0",
    "platform_version": "cuda" if release_tuple(gpu_targets.jaxlib_version()) >= (0, 12) else "PJRT C API",
    "cuda_versions": "runtime=unknown cudnn=unknown cublas=unknown nccl=unknown",
}


@pytest.fixture(autouse=True)
def _own_target_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No captured GPU leaks between tests (aot.Cache.use_targets puts them in use)."""
    gpu_targets.use_captured(None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    yield
    gpu_targets.use_captured(None)


@pytest.mark.parametrize("text,name,count", [
    ("cuda:h100", "cuda:h100", 1), ("cuda:h200", "cuda:h200", 1), ("CUDA:H200:8", "cuda:h200:8", 8),
    ("cuda:h200:2x8", "cuda:h200:2x8", 16), ("cuda:h200:1x8", "cuda:h200:8", 8), ("cuda:h200:1", "cuda:h200", 1),
])
def test_gpu_target_names(text: str, name: str, count: int) -> None:
    target = aot.parse_target(text)
    assert (target.platform, target.name, target.chip_count) == ("cuda", name, count)
    assert aot.parse_target(target.name) == target


@pytest.mark.parametrize("text,message", [
    ("cuda:a100", "unknown GPU target 'cuda:a100'; known: cuda:h100, cuda:h200"),
    ("cuda:h200:0", "target 'cuda:h200:0': after the GPU comes its GPUs per host (cuda:h200:8) or hosts x GPUs "
                    "per host (cuda:h200:2x8), got '0'"),
    ("cuda:h200:2x", "got '2x'"),
    ("gpu:h200:8", "target 'gpu:h200:8': a GPU target's platform is 'cuda', not 'gpu' (as JAX's topology call "
                   "names it): cuda:h200:8"),
])
def test_unknown_gpu_targets_are_refused(text: str, message: str) -> None:
    with pytest.raises(aot.DeviceTargetError) as info:
        aot.parse_target(text)
    assert message in str(info.value)


def test_the_config_digest_ignores_comments_and_layout() -> None:
    shipped = gpu_targets.config_for("h200")
    assert shipped is not None and shipped.source == "shipped" and shipped.device_kind() == "NVIDIA H200"
    relaid = "\n".join("   " + line.split("#")[0] + "  # note" for line in shipped.text.splitlines() if line.strip())
    assert gpu_targets.config_digest(relaid) == shipped.digest
    assert gpu_targets.config_digest(shipped.text.replace("core_count: 132", "core_count: 114")) != shipped.digest


def test_listings_name_gpu_entries_from_their_parts() -> None:
    digest = gpu_targets.config_for("h200").digest  # type: ignore[union-attr]
    parts = {**H200_PARTS, "gpu_target_config": digest}
    assert target_name(parts) == "cuda:h200"
    assert target_name({**parts, "device_count": "16", "process_count": "2"}) == "cuda:h200:2x8"
    assert target_name({**parts, "device_count": "8"}) == "cuda:h200:8"
    # A GPU whose config is no known one (compiled on a GPU never captured): by device.
    other = {**parts, "gpu_target_config": "sha256:" + "0" * 64}
    assert target_name(other) is None and environment_name(other) == "gpu NVIDIA H200 x1"


@pytest.mark.skipif(HAS_PLUGIN or bool(gpu_targets.cuda_plugins()), reason="a CUDA plugin is installed here")
def test_without_the_plugin_a_gpu_target_is_one_line_saying_what_to_install() -> None:
    import jaxlib

    with pytest.raises(aot.GpuCompilerMissingError) as info:
        aot.lower(lambda x: x * 2, "f32[8]", name="double", target="cuda:h200")
    release = jaxlib.__version__
    major, ptxas = ("13", "'nvidia-cuda-nvcc>=13,<14'") if release == "0.12.1" else ("12", "nvidia-cuda-nvcc-cu12")
    assert str(info.value) == (
        f"cannot compile for cuda:h200: JAX's CUDA plugin is not installed here; pip install "
        f"'jax[cuda{major}-local]=={release}' {ptxas} (the CUDA plugin of jaxlib {release}, and ptxas)"
    )


#: What :func:`_fake_plugin` installs, as the refusals name it.
FAKE_PLUGINS = ("jax-cuda12-pjrt 0.10.1, jax-cuda12-plugin 0.10.1, jax-cuda13-pjrt 0.10.1, "
                "jax-cuda13-plugin 0.10.1")


def _fake_plugin(folder: Path, version: str) -> None:
    """Distributions of JAX's CUDA plugins (12 and 13) of ``version`` (metadata only),
    ahead of any installed one on sys.path: what pip leaves after `pip install
    jax-cuda12-plugin==V` beside another jaxlib."""
    for major in ("12", "13"):
        for kind in ("plugin", "pjrt"):
            info = folder / f"jax_cuda{major}_{kind}-{version}.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: jax-cuda{major}-{kind}\nVersion: {version}\n")


def test_a_plugin_of_another_release_is_refused_in_one_line_naming_both(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """The issue's 0.9.2 case the other way round: a plugin whose release is not
    jaxlib's is never used to compile (a GPU host of this jaxlib runs its own)."""
    import jaxlib

    release = jaxlib.__version__
    _fake_plugin(tmp_path, "0.10.1")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(aot.GpuCompilerMissingError) as info:
        aot.lower(lambda x: x * 2, "f32[8]", name="double", target="cuda:h100")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"cannot compile for cuda:h100: the CUDA plugin here is {FAKE_PLUGINS} "
        f"and jaxlib is {release}; a GPU compile needs the plugin of jaxlib's release"
    ), message
    assert "pip install 'jax[cuda" in message and f"-local]=={release}'" in message


@pytest.mark.parametrize("jaxlib,plugins,expected", [
    ("0.10.2", {"jax-cuda12-plugin": "0.10.2", "jax-cuda12-pjrt": "0.10.2"}, None),
    ("0.12.1", {"jax-cuda13-plugin": "0.12.1", "jax-cuda13-pjrt": "0.12.1",
                "jax-cuda12-plugin": "0.12.0.1", "jax-cuda12-pjrt": "0.12.0.1"}, None),
    ("0.9.2", {"jax-cuda12-plugin": "0.9.2", "jax-cuda12-pjrt": "0.9.2"},
     "GPU targets need jaxlib 0.10.2 or later (older CUDA plugins cannot read the GPU target configs jax-aot "
     "ships), and jaxlib here is 0.9.2; compile GPU targets with jax 0.10.2 or later"),
    ("0.10.2", {"jax-cuda12-plugin": "0.10.2", "jax-cuda12-pjrt": "0.10.1"},
     "the CUDA plugin here is jax-cuda12-pjrt 0.10.1, jax-cuda12-plugin 0.10.2 and jaxlib is 0.10.2; a GPU "
     "compile needs the plugin of jaxlib's release (a GPU host on jaxlib 0.10.2 runs that one, and it is part "
     "of the key): pip install 'jax[cuda12-local]==0.10.2' nvidia-cuda-nvcc-cu12 (the CUDA plugin of jaxlib "
     "0.10.2, and ptxas)"),
    ("0.12.1", {"jax-cuda12-plugin": "0.12.0.1", "jax-cuda12-pjrt": "0.12.0.1"},  # no cuda12 0.12.1 exists
     "the CUDA plugin here is jax-cuda12-pjrt 0.12.0.1, jax-cuda12-plugin 0.12.0.1 and jaxlib is 0.12.1; a GPU "
     "compile needs the plugin of jaxlib's release (a GPU host on jaxlib 0.12.1 runs that one, and it is part "
     "of the key): pip install 'jax[cuda13-local]==0.12.1' 'nvidia-cuda-nvcc>=13,<14' (the CUDA plugin of "
     "jaxlib 0.12.1, and ptxas)"),
    ("0.12.0.1", {}, "JAX's CUDA plugin is not installed here; pip install 'jax[cuda12-local]==0.12.0.1' "
                     "nvidia-cuda-nvcc-cu12 (the CUDA plugin of jaxlib 0.12.0.1, and ptxas)"),
    ("0.11.2", {"jax-cuda13-plugin": "0.11.1", "jax-cuda13-pjrt": "0.11.1"},
     "the CUDA plugin here is jax-cuda13-pjrt 0.11.1, jax-cuda13-plugin 0.11.1 and jaxlib is 0.11.2; a GPU "
     "compile needs the plugin of jaxlib's release (a GPU host on jaxlib 0.11.2 runs that one, and it is part "
     "of the key): pip install 'jax[cuda13-local]==0.11.2' 'nvidia-cuda-nvcc>=13,<14' (the CUDA plugin of "
     "jaxlib 0.11.2, and ptxas)"),
])
def test_the_compiler_is_the_plugin_of_jaxlibs_release(
    jaxlib: str, plugins: dict[str, str], expected: str | None,
) -> None:
    problem = gpu_targets.compiler_problem(jaxlib, plugins, importable=True)
    assert (problem[1] if problem else None) == expected


def _matmul(a, b):  # noqa: ANN001, ANN202
    import jax.numpy as jnp

    return jnp.tanh(a @ b)


@needs_plugin
def test_deviceless_compiles_for_an_h100_and_an_h200() -> None:
    computations = {
        t: aot.lower(_matmul, "f32[256,256]", "f32[256,256]", name="matmul", target=t)
        for t in ("cuda:h100", "cuda:h200")
    }
    h200 = computations["cuda:h200"].environment_fingerprint.as_dict()
    assert {k: h200[k] for k in H200_PARTS} == H200_PARTS
    assert h200["gpu_target_config"] == gpu_targets.config_for("h200").digest  # type: ignore[union-attr]
    release = gpu_targets.jaxlib_version()  # the plugin of jaxlib's release, no other
    assert h200["gpu_plugin"] in (f"jax-cuda{m}-pjrt={release} jax-cuda{m}-plugin={release}" for m in ("12", "13"))
    h100 = computations["cuda:h100"].environment_fingerprint.as_dict()
    assert h100["device_kind"] == "NVIDIA H100 80GB HBM3"
    # One program, two GPUs: the same program fingerprint, two keys.
    assert computations["cuda:h100"].program_fingerprint == computations["cuda:h200"].program_fingerprint
    assert computations["cuda:h100"].key != computations["cuda:h200"].key
    for target, computation in computations.items():
        executable = computation.compile()
        assert executable.info.autotune == "defaults"  # no results for a shipped config
        assert target_name(computation.environment_fingerprint.as_dict()) == target
        assert "__triton" in executable.compiled.as_text()  # a Triton GEMM, XLA's default config
        assert len(serialize_executable(executable)) > 1000


@needs_plugin
def test_a_mesh_over_two_hosts_of_eight_gpus() -> None:
    from jax.sharding import NamedSharding, PartitionSpec

    import jax

    target = aot.parse_target("cuda:h200:2x8")
    mesh = target.mesh({"data": 16})
    spec = jax.ShapeDtypeStruct((64, 256), "float32", sharding=NamedSharding(mesh, PartitionSpec("data")))
    computation = aot.lower(lambda x: x.sum(axis=0), spec, name="total", mesh=mesh, target=target)
    parts = computation.environment_fingerprint.as_dict()
    assert (parts["device_count"], parts["process_count"]) == ("16", "2")
    assert parts["topology"].split(",")[7:9] == ["7/p0", "8/p1"]
    assert "all-reduce" in computation.compile().compiled.as_text()


@pytest.mark.parametrize("text,state,results", [
    ("tuned sha256:ab", "tuned", "sha256:ab"), ("defaults", "defaults", None),
    ("defaults sha256:cd", "defaults", "sha256:cd"), ("measured", "measured", None),
])
def test_a_tuning_reads_and_writes_the_stored_spelling(text: str, state: str, results: str | None) -> None:
    """Tuning is a typed value; manifests and index rows keep the spelling they hold."""
    from aot.platforms.tuning import Tuning

    tuning = Tuning.parse(text)
    assert tuning == Tuning(state, results) and tuning.text == text
    assert tuning.fell_back == (state == "defaults")
    assert Tuning.parse(None) is None and Tuning.parse("") is None and Tuning.parse(3) is None


def test_the_captured_gpus_travel_with_a_warmup_task_not_the_environment(tmp_path: Path) -> None:
    """A warm-up worker compiles for the parent's captured GPUs because each task hands
    them over (aot.platforms.cuda.CapturedConfigs), not because a variable was set: a
    process with none in use (a fresh worker) knows cuda:fleet once it opens the task's cache."""
    import os

    from aot.cache.warmup.steps import task_cache, task_options

    cache = _captured(tmp_path)
    with pytest.raises(aot.DeviceTargetError, match="unknown GPU target 'cuda:fleet'"):
        aot.parse_target("cuda:fleet")
    cache.use_targets()
    assert aot.parse_target("cuda:fleet").name == "cuda:fleet"
    assert not any("TARGET_CONFIGS" in name for name in os.environ)
    options = task_options(cache)
    assert options["captured_gpus"] == gpu_targets.captured_in_use()
    gpu_targets.use_captured(None)  # a fresh worker's process
    with pytest.raises(aot.DeviceTargetError, match="unknown GPU target"):
        aot.parse_target("cuda:fleet")
    opened = task_cache(options, x64=False)
    assert opened.location == cache.location
    assert gpu_targets.config_for("fleet") is not None and gpu_targets.config_for("fleet").source == "captured"  # type: ignore[union-attr]
    cache.close()


def _captured(tmp_path: Path, *, clock: str = "1.755", autotune: str | None = None) -> aot.Cache:
    cache = aot.Cache(tmp_path / "cache")
    config = tmp_path / "fleet.txtpb"
    text = gpu_targets.config_for("h200").text.replace("clock_rate_ghz: 1.98", f"clock_rate_ghz: {clock}")  # type: ignore[union-attr]
    config.write_text(text, encoding="utf-8")
    versions = tmp_path / "versions.json"
    versions.write_text(json.dumps({"runtime": "12080", "cudnn": "91000", "cublas": "120804", "nccl": "2.26.2"}))
    results = None
    if autotune is not None:
        results = tmp_path / "autotune.textproto"
        results.write_text(autotune, encoding="utf-8")
    record = cache.capture_target("fleet", config_file=config, versions_file=versions, autotune_file=results)
    assert record.device_kind == "NVIDIA H200" and record.config_digest == gpu_targets.config_digest(text)
    return cache


@needs_plugin
def test_a_captured_gpu_is_compiled_for_exactly(tmp_path: Path) -> None:
    cache = _captured(tmp_path)
    entry = cache.compile(_matmul, "f32[256,256]", "f32[256,256]", name="matmul", target="cuda:fleet")
    parts = json.loads(entry.manifest)["environment"]["parts"]
    assert parts["cuda_versions"] == "runtime=12080 cudnn=91000 cublas=120804 nccl=2.26.2"
    assert parts["gpu_target_config"] == cache.captured_targets()[0].config_digest
    assert target_name(parts) == "cuda:fleet"
    shipped = cache.compile(_matmul, "f32[256,256]", "f32[256,256]", name="matmul", target="cuda:h200")
    assert shipped.key != entry.key
    assert target_name(json.loads(shipped.manifest)["environment"]["parts"]) == "cuda:h200"


@needs_plugin
def test_autotune_results_missing_the_programs_fusions_fall_back_to_defaults(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    # Real results of XLA's format with no entry: the compile loads them, requires them
    # complete, XLA refuses, and it compiles with the default configs, saying so.
    cache = _captured(tmp_path, autotune="version: 3\n")
    with caplog.at_level(logging.WARNING, logger="aot.platforms.cuda"):
        entry = cache.compile(_matmul, "f32[256,256]", "f32[256,256]", name="matmul", target="cuda:fleet")
    digest = cache.captured_targets()[0].autotune_digest
    assert json.loads(entry.manifest)["autotune"] == f"defaults {digest}"  # the results it lacked
    assert "the autotune results captured for cuda:fleet lack some of its fusions" in caplog.text
    assert "NOT_FOUND" in caplog.text


REFUSED = """
import json, sys
from pathlib import Path
import aot
from tests.aot.test_gpu_targets import _captured, _matmul
cache = _captured(Path(sys.argv[1]), autotune="version: 1\\n")
try:
    cache.compile(_matmul, "f32[256,256]", "f32[256,256]", name="matmul", target="cuda:fleet")
except aot.DeviceTargetError as exc:
    print(exc)
"""


@needs_plugin
def test_autotune_results_of_another_version_are_refused(tmp_path: Path) -> None:
    # In a process of its own: XLA keeps the autotune results it loaded for the process.
    import os
    import subprocess
    import sys

    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    done = subprocess.run([sys.executable, "-c", REFUSED, str(tmp_path)], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(
        "matmul: XLA refused the autotune results captured for cuda:fleet (INVALID_ARGUMENT: Version mismatch"
    ), done.stdout


def test_a_capture_refuses_what_is_not_a_gpu_config(tmp_path: Path) -> None:
    cache = aot.Cache(tmp_path / "cache")
    bad = tmp_path / "bad.txtpb"
    bad.write_text("chips: 4\n")
    with pytest.raises(aot.TargetCaptureError) as info:
        cache.capture_target("fleet", config_file=bad)
    assert str(info.value).startswith(f"{bad} is not a GPU target config")
    config = tmp_path / "fleet.txtpb"
    config.write_text(gpu_targets.config_for("h100").text)  # type: ignore[union-attr]
    results = tmp_path / "results.json"
    results.write_text("{}")
    with pytest.raises(aot.TargetCaptureError, match="is not XLA's autotune results"):
        cache.capture_target("fleet", config_file=config, autotune_file=results)
    assert cache.captured_targets() == []


@pytest.mark.skipif(HAS_PLUGIN, reason="the CUDA plugin is installed here")
def test_a_capture_on_a_host_without_a_gpu_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(aot.TargetCaptureError) as info:
        aot.Cache(tmp_path / "cache").capture_target("fleet")
    assert str(info.value) == (
        "aot target capture records this host's GPU, and this host has none (no CUDA plugin of JAX, no "
        "accelerator); run it on a GPU host of the fleet, or record a config written elsewhere with --from-file CONFIG"
    )


@needs_plugin
def test_cudnn_attention_without_cudnn_is_refused_in_one_line() -> None:
    import jax
    import jax.numpy as jnp

    if gpu_targets.live_versions().get("cudnn"):
        pytest.skip("cuDNN loads here")
    qkv = jax.ShapeDtypeStruct((2, 128, 4, 64), jnp.bfloat16)
    with pytest.raises(aot.DeviceTargetError) as info:
        aot.lower(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="cudnn"),
                  qkv, qkv, qkv, name="attention", target="cuda:h200")
    assert str(info.value).startswith(
        "attention: cannot be compiled for cuda:h200 here: it calls cuDNN (cuDNN attention, for one), which JAX "
        "looks up in the compiling process when it lowers (cuDNN not found.)"
    )


@needs_plugin
def test_without_jax_platforms_cpu_the_plugin_cannot_start_and_says_so(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    if gpu_targets.live_versions().get("driver"):
        pytest.skip("a CUDA driver is here: the plugin starts")
    script = (
        "import aot\n"
        "try:\n"
        "    aot.lower(lambda x: x * 2, 'f32[8]', name='double', target='cuda:h200')\n"
        "except aot.GpuCompilerMissingError as exc:\n"
        "    print(exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert done.stdout.strip() == (
        "cannot compile for cuda:h200: JAX's CUDA plugin did not start in this process (a host without a CUDA "
        "driver needs JAX_PLATFORMS=cpu, here unset); set JAX_PLATFORMS=cpu before importing jax (aot "
        "warmup/compile --target set it themselves)"
    ), done.stderr[-2000:]


@needs_plugin
def test_results_captured_later_replace_an_entry_compiled_with_the_defaults(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    from dataclasses import replace

    from aot.artifact import Artifact

    cache = _captured(tmp_path)  # no autotune results yet
    first = cache.compile(_matmul, "f32[256,256]", "f32[256,256]", name="matmul", target="cuda:fleet")
    assert json.loads(first.manifest)["autotune"] == "defaults"
    # Results captured now: the next compile of the same key compiles it again with them
    # (here they lack its fusions: the defaults, recorded with the results' digest) and
    # replaces the row; the one after that is a hit.
    results = tmp_path / "autotune.textproto"
    results.write_text("version: 3\n")
    config = tmp_path / "fleet.txtpb"
    record = cache.capture_target("fleet", config_file=config, versions_file=tmp_path / "versions.json",
                                  autotune_file=results)
    with caplog.at_level(logging.INFO, logger="aot.cache.compiling"):
        again = cache.compile_entry(_matmul, "f32[256,256]", "f32[256,256]", name="matmul", target="cuda:fleet")
    assert not again.hit and again.entry.key == first.key
    assert "stored with XLA's default autotune configs; the GPU's results are captured now" in caplog.text
    assert json.loads(cache.index.get(first.key).manifest)["autotune"] == f"defaults {record.autotune_digest}"
    assert cache.compile_entry(_matmul, "f32[256,256]", "f32[256,256]", name="matmul", target="cuda:fleet").hit
    # A tuned executable of the key (what a GPU's complete results give) replaces it too.
    artifact = cache.artifact(first.key)
    tuned = Artifact(replace(artifact.manifest, autotune=f"tuned {record.autotune_digest}"), dict(artifact.blobs))
    entry, outcome = cache.store_artifact(tuned)
    assert outcome == "stored" and json.loads(entry.manifest)["autotune"].startswith("tuned sha256:")
    assert cache.store_artifact(tuned)[1] == "present"
