"""The CI gate: `aot verify --manifest M --strict` lowers every entry and fails when the
code changed since the served entry was compiled (same signatures), until a warm-up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
