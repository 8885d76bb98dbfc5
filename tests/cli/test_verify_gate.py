"""The CI gate: `aot verify --manifest M --strict` lowers every entry and fails when the
code changed since the served entry was compiled (same signatures), until a warm-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.aot.test_targets import needs_libtpu
from tests.cli.helpers import REPO, WITHOUT_LIBTPU

MODEL = '''
import jax

def forward(x):
    return jax.nn.{act}(x) * 2.0
'''

MANIFEST = '''
[[function]]
name = "gate.forward"
function = "gate_model:forward"
args = ["f32[8,784]"]
'''


def _aot(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "AOT_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "aot.cli.main", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_an_activation_change_fails_the_gate_until_warmed(tmp_path: Path) -> None:
    (tmp_path / "gate_model.py").write_text(MODEL.format(act="gelu"))
    (tmp_path / "warmup.toml").write_text(MANIFEST)
    assert _aot(tmp_path, "warmup", "warmup.toml").returncode == 0
    ok = _aot(tmp_path, "verify", "--manifest", "warmup.toml", "--strict")
    assert ok.returncode == 0, ok.stdout + ok.stderr

    (tmp_path / "gate_model.py").write_text(MODEL.format(act="relu"))
    cheap = _aot(tmp_path, "verify", "--manifest", "warmup.toml", "--strict", "--no-lower")
    assert cheap.returncode == 0, cheap.stdout + cheap.stderr  # the specs did not change
    gate = _aot(tmp_path, "verify", "--manifest", "warmup.toml", "--strict")
    assert gate.returncode == 1, gate.stdout + gate.stderr
    assert ("stale: gate.forward (x: f32[8,784]): the code changed since it was compiled "
            "(part stablehlo differs); run aot warmup") in gate.stdout.splitlines()

    assert _aot(tmp_path, "warmup", "warmup.toml").returncode == 0
    after = _aot(tmp_path, "verify", "--manifest", "warmup.toml", "--strict")
    assert after.returncode == 0, after.stdout + after.stderr


# The gate for a device target, on this CPU host (libtpu computes the target's
# environment without the chip): what a CI runner that warms a TPU deployment checks.

TARGET_MANIFEST = '''target = "tpu:v5e:1x1"

[[function]]
name = "gate.forward"
function = "gate_model:forward"
args = ["f32[8]"]

[[function]]
name = "gate.other"
function = "gate_model:other"
args = ["f32[8]"]
'''

TARGET_MODEL = '''
import jax

def forward(x):
    return jax.nn.{act}(x) * 2.0

def other(x):
    return x + 1.0
'''


@needs_libtpu
def test_the_gate_checks_entries_for_their_target_on_a_cpu_host(tmp_path: Path) -> None:
    (tmp_path / "gate_model.py").write_text(TARGET_MODEL.format(act="gelu"))
    (tmp_path / "warmup.toml").write_text(TARGET_MANIFEST)
    warmed = _aot(tmp_path, "warmup", "warmup.toml")
    assert warmed.returncode == 0, warmed.stdout + warmed.stderr

    ok = _aot(tmp_path, "verify", "--manifest", "warmup.toml", "--strict")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "warmup.toml: all 2 entries are stored for tpu:v5e:1x1" in ok.stdout.splitlines()

    # Another target: every entry missing there, named with its target.
    other = _aot(tmp_path, "verify", "--manifest", "warmup.toml", "--strict", "--no-lower",
                 "--target", "tpu:v5e:2x2", "--json")
    assert other.returncode == 1, other.stdout + other.stderr
    coverage = json.loads(other.stdout)["coverage"]
    assert [(m["label"], m["target"]) for m in coverage["missing"]] == [
        ("gate.forward@tpu:v5e:2x2", "tpu:v5e:2x2"), ("gate.other@tpu:v5e:2x2", "tpu:v5e:2x2"),
    ]
    assert "device_count 1 != 4" in coverage["missing"][0]["reason"]
    assert coverage["targets"] == ["tpu:v5e:2x2"] and coverage["host"] is False

    # The code changed: stale for the target, until a warm-up.
    (tmp_path / "gate_model.py").write_text(TARGET_MODEL.format(act="relu"))
    gate = _aot(tmp_path, "verify", "--manifest", "warmup.toml", "--strict")
    assert gate.returncode == 1, gate.stdout + gate.stderr
    assert ("stale: gate.forward@tpu:v5e:1x1 (x: f32[8]): the code changed since it was compiled "
            "(part stablehlo differs); run aot warmup") in gate.stdout.splitlines()
    assert "gate.other" not in gate.stdout

    # An entry removed: missing for the target, with the target's name.
    assert _aot(tmp_path, "rm", "gate.other", "--env", "all", "--yes").returncode == 0
    gone = _aot(tmp_path, "verify", "--manifest", "warmup.toml", "--strict", "--no-lower")
    assert gone.returncode == 1, gone.stdout + gone.stderr
    lines = gone.stdout.splitlines()
    assert "warmup.toml: 1 of 2 entries missing for tpu:v5e:1x1:" in lines
    assert "  gate.other@tpu:v5e:1x1 (warmup.toml:8): f32[8]: not stored (nothing named 'gate.other' is)" in lines


@needs_libtpu
def test_a_gate_for_targets_only_never_starts_this_hosts_backend(tmp_path: Path) -> None:
    """Every entry has a target: coverage is computed from libtpu's topology alone, and
    lowering (for stale entries) runs on the CPU backend, never this host's accelerator."""
    (tmp_path / "gate_model.py").write_text(TARGET_MODEL.format(act="gelu"))
    (tmp_path / "warmup.toml").write_text(TARGET_MANIFEST)
    assert _aot(tmp_path, "warmup", "warmup.toml").returncode == 0
    script = (
        "import os, sys, aot\n"
        "from aot.cache.reports.coverage import check_coverage\n"
        "from aot.cache.warmup.manifest import expand, load_manifest\n"
        "from aot.jaxcompat.runtime import backend_started\n"
        "cache = aot.Cache(os.environ['AOT_CACHE'])\n"
        "items = expand(load_manifest('warmup.toml'))\n"
        "report = check_coverage(cache, items, strict=True)\n"
        "print(report.failed, backend_started())\n"
        "report = check_coverage(cache, items, strict=True, lower=True)\n"
        "print(report.failed, os.environ.get('JAX_PLATFORMS'))\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "AOT_CACHE": str(tmp_path / "cache")}
    env.pop("JAX_PLATFORMS", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["False False", "False cpu"], done.stdout + done.stderr


def test_verify_target_usage_errors(tmp_path: Path) -> None:
    (tmp_path / "gate_model.py").write_text(TARGET_MODEL.format(act="gelu"))
    (tmp_path / "warmup.toml").write_text(TARGET_MANIFEST)
    (tmp_path / "cache").mkdir()
    unknown = _aot(tmp_path, "verify", "--manifest", "warmup.toml", "--target", "tpu:v5e:3x3")
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    assert "unknown target 'tpu:v5e:3x3'; known: tpu:v4:{" in unknown.stderr
    alone = _aot(tmp_path, "verify", "--target", "tpu:v5e:1x1")
    assert alone.returncode == 2 and "give --manifest MANIFEST.toml" in alone.stderr, alone.stderr


def test_without_libtpu_the_target_gate_fails_in_one_line(tmp_path: Path) -> None:
    """No TPU compiler here (JAX's topology API fails as it does without libtpu): the
    gate cannot answer for the target; one line saying what to install, exit 1 (the
    command line was right: no Usage: header)."""
    (tmp_path / "gate_model.py").write_text(TARGET_MODEL.format(act="gelu"))
    (tmp_path / "warmup.toml").write_text(TARGET_MANIFEST)
    script = WITHOUT_LIBTPU
    import aot

    aot.Cache(tmp_path / "cache").close()  # an empty cache: reading never creates one
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "AOT_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script, "verify", "--manifest", "warmup.toml", "--strict"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Usage:" not in done.stderr, done.stdout + done.stderr
    assert ("Error: cannot compile for tpu:v5e:1x1: the TPU compiler (libtpu) is not installed here; "
            "pip install 'jax-aot[tpu]' (libtpu of the version jax[tpu] pins)") in done.stderr.splitlines()
    assert "verified" not in done.stdout  # said before the integrity check


HOST_MANIFEST = '''target = "tpu:v5e:1x1"

[[function]]
name = "canary.tiny"
function = "fixtures.models:tiny"
args = ["f32[8]", "f32[8]"]

[[function]]
name = "canary.donating"
function = "tests.cli.models:donating"
args = ["f32[4]", "f32[4]"]
'''


def test_a_cpu_canary_warmed_for_host_is_gated_for_host(tmp_path: Path, invoke) -> None:
    """`--target host` means this host's environment, for the gate as for the warm-up:
    a CPU canary of a TPU manifest can be warmed and then gated on the CPU runner."""
    manifest = tmp_path / "canary.toml"
    manifest.write_text(HOST_MANIFEST)
    warmed = invoke("warmup", str(manifest), "--target", "host")
    assert warmed.exit_code == 0, warmed.output
    gate = invoke("verify", "--manifest", str(manifest), "--target", "host", "--strict")
    assert gate.exit_code == 0, gate.output
    assert f"{manifest}: all 2 entries are stored for this environment" in gate.stdout.splitlines()

    assert invoke("rm", "canary.donating", "--yes").exit_code == 0
    gone = invoke("verify", "--manifest", str(manifest), "--target", "host", "--strict", "--no-lower")
    assert gone.exit_code == 1, gone.output
    assert gone.stdout.replace(str(tmp_path), "T").splitlines() == [
        "verified 1 entry and 2 blobs in T/cache: PROBLEMS",
        gone.stdout.splitlines()[1],  # the removed entry's ref, dangling (its key)
        "T/canary.toml: 1 of 2 entries missing for this environment:",
        "  canary.donating (T/canary.toml:8): f32[4], f32[4]: not stored (nothing named 'canary.donating' is)",
    ]
    assert gone.stdout.splitlines()[1].startswith("dangling: ref of canary.donating (f32[4], f32[4]) names ")
