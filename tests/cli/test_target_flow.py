"""A new user's CI flow for a TPU fleet, from a CPU-only runner, as separate processes:
warm two manifests (one chip, and a 2x2 slice with a mesh) into one release, gate
them, ask whether a replica on each target would hit, promote, ship new code, roll
back, and see that a CPU host refuses to serve the TPU release with advice that keeps
the label's set (issue 43). Every step is the command a CI job would run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.aot.test_targets import needs_libtpu

pytestmark = [needs_libtpu, pytest.mark.slow]

MODEL = '''
import jax.numpy as jnp

def forward(x):
    return jnp.{act}(x) * 2.0 + 1.0
'''

SERVE = '''
target = "tpu:v5e:1x1"

[[function]]
name     = "flow.forward"
function = "flow_model:forward"
args     = ["f32[{batch},128]"]
vary     = { batch = [1, 8] }
'''

SHARDED = '''
[[function]]
name     = "flow.sharded"
function = "flow_model:forward"
target   = "tpu:v5e:2x2"
mesh     = "data=4"
args     = ["f32[32,128]@data,None"]
'''

COMMIT_1 = "1" * 40
COMMIT_2 = "2" * 40


def _aot(tmp_path: Path, *args: str, commit: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "AOT_CACHE": str(tmp_path / "cache")}
    env.pop("AOT_RELEASE", None)
    if commit is not None:
        env["GIT_COMMIT"] = commit
    return subprocess.run([sys.executable, "-m", "aot.cli.main", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _members(tmp_path: Path, label: str) -> dict[tuple[str, str], str]:
    shown = json.loads(_ok(_aot(tmp_path, "release", "show", label, "--json")))
    return {(m["name"], m["signature"]): m["key"] for m in shown["members"]}


def test_ci_gate_release_rollback_for_two_targets(tmp_path: Path) -> None:
    (tmp_path / "flow_model.py").write_text(MODEL.format(act="tanh"))
    (tmp_path / "serve.toml").write_text(SERVE)
    (tmp_path / "sharded.toml").write_text(SHARDED)

    # CI at commit 1: two manifests, one release.
    _ok(_aot(tmp_path, "warmup", "serve.toml", "--release", "candidate", commit=COMMIT_1))
    _ok(_aot(tmp_path, "warmup", "sharded.toml", "--release", "candidate", commit=COMMIT_1))
    first = _members(tmp_path, "candidate")
    assert sorted(name for name, _ in first) == ["flow.forward", "flow.forward", "flow.sharded"], first
    shown = _ok(_aot(tmp_path, "release", "show", "candidate"))
    assert "tpu:v5e:1x1" in shown and "tpu:v5e:2x2" in shown, shown

    # The gate, on the same CPU runner, checks each entry for its own target.
    for manifest in ("serve.toml", "sharded.toml"):
        gate = _aot(tmp_path, "verify", "--manifest", manifest, "--strict")
        assert gate.returncode == 0, gate.stdout + gate.stderr
    # Would a replica on each target hit? (why exits 0 on a hit, 1 on a miss)
    why = _ok(_aot(tmp_path, "why", "flow.forward", "--arg", "f32[8,128]", "--target", "tpu:v5e:1x1"))
    assert "tpu:v5e:1x1" in why, why
    miss = _aot(tmp_path, "why", "flow.forward", "--arg", "f32[8,128]", "--target", "tpu:v5e:2x2")
    assert miss.returncode == 1 and "tpu:v5e:2x2" in miss.stdout, miss.stdout + miss.stderr

    _ok(_aot(tmp_path, "release", "promote", "candidate", "prod"))
    assert _members(tmp_path, "prod") == first

    # New code at commit 2: the gate fails for both targets until the warm-up.
    (tmp_path / "flow_model.py").write_text(MODEL.format(act="sin"))
    for manifest, target in (("serve.toml", "tpu:v5e:1x1"), ("sharded.toml", "tpu:v5e:2x2")):
        stale = _aot(tmp_path, "verify", "--manifest", manifest, "--strict")
        assert stale.returncode == 1, stale.stdout + stale.stderr
        assert "stale" in stale.stdout and target in stale.stdout, stale.stdout
    warmed = _aot(tmp_path, "warmup", "serve.toml", "--release", "prod", commit=COMMIT_2)
    assert "kept" not in _ok(warmed)  # said once, on stderr
    assert warmed.stderr.count("release prod: kept 1 member of its previous set") == 1, warmed.stderr
    sharded = [slot for slot in first if slot[0] == "flow.sharded"]
    assert [_members(tmp_path, "prod")[slot] for slot in sharded] == [first[slot] for slot in sharded]
    _ok(_aot(tmp_path, "warmup", "sharded.toml", "--release", "prod", commit=COMMIT_2))
    second = _members(tmp_path, "prod")
    assert second.keys() == first.keys() and not set(second.values()) & set(first.values())
    for manifest in ("serve.toml", "sharded.toml"):
        _ok(_aot(tmp_path, "verify", "--manifest", manifest, "--strict"))

    # Roll back: prod serves exactly commit 1's set again, both targets.
    _ok(_aot(tmp_path, "release", "rollback", "prod"))
    assert _members(tmp_path, "prod") == first

    # A CPU host cannot serve the TPU release; the advice keeps prod's set.
    serve = subprocess.run(
        [sys.executable, "-c", "import aot; aot.load('flow.forward', release='prod', strict=True)"],
        cwd=tmp_path, env={**os.environ, "AOT_CACHE": str(tmp_path / "cache")},
        capture_output=True, text=True, timeout=300,
    )
    assert serve.returncode != 0
    assert "warmup --release prod" not in serve.stderr, serve.stderr
    assert "tpu:v5e:1x1" in serve.stderr, serve.stderr
