"""GPU targets on the command line (cli/targets.py and --target cuda:...): a warm-up of
fixtures/gpu_target.toml on this CPU-only host, the gate, `why`, `aot target capture`,
and the one-line refusals without JAX's CUDA plugin."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aot.platforms import cuda as gpu_targets
from tests.aot.test_gpu_targets import FAKE_PLUGINS, HAS_PLUGIN, _fake_plugin, needs_plugin
from tests.cli.helpers import REPO, Invoke, one_line_error

GPU_MANIFEST = REPO / "fixtures" / "gpu_target.toml"


@pytest.fixture(autouse=True)
def _own_target_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    gpu_targets.use_captured(None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    yield
    gpu_targets.use_captured(None)


@needs_plugin
def test_warmup_for_h200s_then_ls_verify_why(invoke: Invoke) -> None:
    result = invoke("warmup", GPU_MANIFEST, "--json")
    assert result.exit_code == 0, result.output
    labels = sorted(r["label"] for r in json.loads(result.stdout)["results"])
    assert labels == ["matmul@cuda:h200", "mlp.forward[batch=1]@cuda:h200", "mlp.forward[batch=32]@cuda:h200",
                      "tiny@cuda:h200", "tiny@cuda:h200:8"]
    rows = json.loads(invoke("ls", "--json").stdout)["entries"]
    assert sorted((r["name"], r["target"], r["autotune"]) for r in rows) == [
        ("matmul", "cuda:h200", "defaults"), ("mlp.forward", "cuda:h200", "defaults"),
        ("mlp.forward", "cuda:h200", "defaults"), ("tiny", "cuda:h200", "defaults"), ("tiny", "cuda:h200:8", "defaults"),
    ]
    assert "cuda:h200:8 defaults" in invoke("ls").stdout

    gate = invoke("verify", "--manifest", GPU_MANIFEST, "--strict")
    assert gate.exit_code == 0, gate.output
    assert f"{GPU_MANIFEST}: all 5 entries are stored for cuda:h200 and cuda:h200:8" in gate.stdout
    # No GPU results were captured: the gate that requires tuned entries fails, one line each.
    tuned = invoke("verify", "--manifest", GPU_MANIFEST, "--strict", "--require-tuned")
    assert tuned.exit_code == 1
    untuned = [line for line in tuned.stdout.splitlines() if line.startswith("untuned: ")]
    assert len(untuned) == 5 and untuned[0].endswith(
        "compiled with XLA's default autotune configs, not the GPU's (capture its results: "
        "aot target capture NAME --autotune FILE, then compile it again)"
    )
    # The gate for another GPU: nothing is stored for an H100.
    h100 = invoke("verify", "--manifest", GPU_MANIFEST, "--strict", "--target", "cuda:h100")
    assert h100.exit_code == 1 and "missing" in h100.stdout

    why = invoke("why", "tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--target", "cuda:h200:8")
    assert why.exit_code == 0, why.output
    assert why.stdout.startswith("tiny@cuda:h200:8 (x: f32[8], y: f32[8]): hit, key ")
    miss = invoke("why", "tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--target", "cuda:h100")
    assert miss.exit_code == 1


@needs_plugin
def test_capture_from_a_file_then_compile_for_it(invoke: Invoke, tmp_path: Path) -> None:
    config = tmp_path / "fleet.txtpb"
    config.write_text(gpu_targets.config_for("h200").text.replace("1.98", "1.755"))  # type: ignore[union-attr]
    captured = invoke("target", "capture", "fleet", "--from-file", config)
    assert captured.exit_code == 0, captured.output
    assert captured.stdout.startswith("captured cuda:fleet: NVIDIA H200, config ")
    assert captured.stdout.rstrip().endswith("versions unknown, no autotune results")
    listing = invoke("target", "ls").stdout.splitlines()
    assert listing[0].split() == ["TARGET", "DEVICE", "CONFIG", "AUTOTUNE", "CAPTURED", "BY"]
    assert listing[1].startswith("cuda:fleet  NVIDIA H200  ")
    compiled = invoke("compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--target", "cuda:fleet")
    assert compiled.exit_code == 0, compiled.output
    assert compiled.stdout.startswith("miss: compiled fixtures.models.tiny for cuda:fleet and stored it\n")
    shown = invoke("show", "fixtures.models.tiny").stdout
    assert "  target       cuda:fleet\n" in shown
    assert "  autotune     defaults (XLA's default configs: no autotune results covered its fusions)\n" in shown


def test_an_unknown_gpu_is_refused_naming_the_known_ones(invoke: Invoke) -> None:
    result = invoke("compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--target", "cuda:b200")
    assert result.exit_code != 0
    assert "unknown GPU target 'cuda:b200'; known: cuda:h100, cuda:h200" in result.output


@pytest.mark.skipif(HAS_PLUGIN or bool(gpu_targets.cuda_plugins()), reason="a CUDA plugin is installed here")
def test_without_the_plugin_a_gpu_compile_and_a_capture_fail_in_one_line(invoke: Invoke) -> None:
    result = invoke("compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--target", "cuda:h200")
    assert one_line_error(result).startswith(
        "Error: cannot compile for cuda:h200: JAX's CUDA plugin is not installed here; pip install 'jax[cuda"
    )
    capture = invoke("target", "capture", "fleet")
    assert one_line_error(capture).startswith(
        "Error: aot target capture records this host's GPU, and this host has none"
    )
    assert invoke("target", "ls").stdout == "no captured GPUs (`aot target capture NAME` on a GPU host records one)\n"


def test_why_with_an_unknown_gpu_is_a_usage_error_not_a_function(invoke: Invoke) -> None:
    result = invoke("why", "tiny", "--arg", "f32[8]", "--target", "cuda:a100")
    assert result.exit_code == 2
    assert "unknown GPU target 'cuda:a100'; known: cuda:h100, cuda:h200" in result.output
    assert "--function" not in result.output


def test_verify_and_why_refuse_a_plugin_of_another_release_in_one_line(
    invoke: Invoke, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """The gate never passes on entries compiled by a plugin a GPU host of this jaxlib
    does not run: exit 1 in one line (not a usage error: no Usage: header)."""
    import jaxlib

    import aot

    aot.Cache(tmp_path / "cache").close()  # verify reads a cache: never creates one
    _fake_plugin(tmp_path / "site", "0.10.1")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    expected = (
        f"Error: cannot compile for cuda:h200: the CUDA plugin here is {FAKE_PLUGINS} and jaxlib is "
        f"{jaxlib.__version__}; a GPU compile needs the plugin of jaxlib's release"
    )
    verify = invoke("verify", "--manifest", GPU_MANIFEST, "--strict", "--target", "cuda:h200")
    assert one_line_error(verify).startswith(expected), verify.output
    assert "Usage:" not in verify.output
    why = invoke("why", "tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--function", "fixtures.models:tiny",
                 "--target", "cuda:h200")
    assert one_line_error(why).startswith(expected), why.output
    warmup = invoke("warmup", GPU_MANIFEST)
    assert warmup.exit_code == 1 and "5 compiled" not in warmup.output and expected[7:] in warmup.output, warmup.output


def test_fleet_pins_the_cuda_plugin_like_libtpu(invoke: Invoke, tmp_path: Path) -> None:
    """A GPU fleet pins its compiler, JAX's CUDA plugin: a runner with another (or none)
    fails its warm-up in one line before compiling anything."""
    from aot.cache.warmup.manifest import installed_version

    here = installed_version("jax-cuda12-plugin") or "not installed"
    path = tmp_path / "fleet.toml"
    path.write_text(GPU_MANIFEST.read_text().replace("\n[[function]]", '\n[fleet]\njax-cuda12-plugin = "0.9.2"\n\n[[function]]', 1))
    result = invoke("warmup", path)
    assert one_line_error(result) == (
        f"Error: {path}: [fleet] pins jax-cuda12-plugin 0.9.2, and this process has another: jax-cuda12-plugin "
        f"0.9.2 != {here} (pinned != installed); entries compiled here would not be the fleet's. Install the "
        "pinned versions (pip install 'jax-cuda12-plugin==0.9.2') or change the pins"
    )


def test_doctor_names_the_gpu_compiler(invoke: Invoke, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import jaxlib

    text = invoke("doctor", "--no-verify").stdout
    assert "\ngpu compiler\n  gpu_compiler " in text, text
    versions = json.loads(invoke("doctor", "--json", "--no-verify").stdout)["versions"]
    if HAS_PLUGIN:
        assert versions["gpu_compiler"] == "ok"
        assert jaxlib.__version__ in {versions.get("jax-cuda12-plugin"), versions.get("jax-cuda13-plugin")}
        assert "nvidia-cuda-nvcc-cu12" in versions or "nvidia-cuda-nvcc" in versions
    elif not gpu_targets.cuda_plugins():
        assert versions["jax-cuda-plugin"] == "not installed"
        assert versions["gpu_compiler"].startswith("JAX's CUDA plugin is not installed here; pip install 'jax[cuda")
    _fake_plugin(tmp_path / "site", "0.10.1")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    versions = json.loads(invoke("doctor", "--json", "--no-verify").stdout)["versions"]
    assert versions["jax-cuda12-plugin"] == "0.10.1"
    assert versions["gpu_compiler"].startswith(f"the CUDA plugin here is {FAKE_PLUGINS} and jaxlib is")


def _aot(tmp_path: Path, *args: str, env: dict[str, str] | None = None, importtime: bool = False) -> Any:
    import os
    import subprocess
    import sys

    base = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "aot", "--cache",
               str(tmp_path / "cache"), *args]
    return subprocess.run(command, cwd=REPO, env={**base, **(env or {})}, capture_output=True, text=True, timeout=300)


def _noise(stderr: str) -> list[str]:
    """The CUDA plugin's start-up lines in a command's stderr (anything else jax-aot
    itself warns about is not this test's)."""
    return [line for line in stderr.splitlines()
            if "absl" in line or "cuda drivers" in line or "plugin configuration error" in line or "Traceback" in line]


@needs_plugin
def test_with_the_plugin_every_command_is_quiet_and_ls_show_do_not_load_it(tmp_path: Path) -> None:
    """On a host without a CUDA driver, JAX's CUDA plugin writes absl's banner and "Could
    not find cuda drivers" to fd 2 as it loads, and JAX logs its failed start with a
    traceback: none of it reaches a command's stderr. ls and show never load it."""
    compiled = _aot(tmp_path, "compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]",
                    "--target", "cuda:h100", "--name", "tiny")
    assert compiled.returncode == 0 and _noise(compiled.stderr) == [], compiled.stderr
    host = _aot(tmp_path, "compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--name", "tiny")
    assert host.returncode == 0 and _noise(host.stderr) == [], host.stderr  # this host's backend: JAX starts the plugin
    warmup = _aot(tmp_path, "warmup", str(GPU_MANIFEST), "--jobs", "2")  # workers: fresh processes
    assert warmup.returncode == 0 and _noise(warmup.stderr) == [], warmup.stderr
    doctor = _aot(tmp_path, "doctor", "--no-verify")
    assert doctor.returncode == 0 and _noise(doctor.stderr) == [], doctor.stderr
    assert "gpu_compiler" in doctor.stdout
    key = json.loads(_aot(tmp_path, "ls", "--json").stdout)["entries"][0]["key"]
    for command in (("ls",), ("show", key[:12])):
        done = _aot(tmp_path, *command, importtime=True)
        assert done.returncode == 0, done.stderr
        loaded = [line for line in done.stderr.splitlines() if "jax_plugins" in line or "jax_cuda" in line]
        assert loaded == [], (command, loaded[:3])
