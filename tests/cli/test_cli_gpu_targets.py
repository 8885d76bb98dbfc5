"""GPU targets on the command line (cli/targets.py and --target cuda:...): a warm-up of
fixtures/gpu_target.toml on this CPU-only host, the gate, `why`, `aot target capture`,
and the one-line refusals without JAX's CUDA plugin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aot import gpu_targets
from tests.aot.test_gpu_targets import HAS_PLUGIN, needs_plugin
from tests.cli.helpers import REPO, Invoke, one_line_error

GPU_MANIFEST = REPO / "fixtures" / "gpu_target.toml"


@pytest.fixture(autouse=True)
def _own_target_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(gpu_targets.CONFIGS_ENV, "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


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


@pytest.mark.skipif(HAS_PLUGIN, reason="the CUDA plugin is installed here")
def test_without_the_plugin_a_gpu_compile_and_a_capture_fail_in_one_line(invoke: Invoke) -> None:
    result = invoke("compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--target", "cuda:h200")
    assert one_line_error(result) == (
        "Error: cannot compile for cuda:h200: JAX's CUDA plugin is not installed here; pip install "
        "'jax-aot[cuda12]' (jax-cuda12-plugin and jax-cuda12-pjrt of this jax, and ptxas)"
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
