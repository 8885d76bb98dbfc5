"""``aot warmup --target`` / ``aot compile --target`` on this CPU-only host: entries for
a TPU that ``ls``, ``show`` and ``verify`` then report for that accelerator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.aot.test_targets import CHIP_PARTS, needs_libtpu
from tests.cli.helpers import WITHOUT_LIBTPU, Invoke, one_line_error

SMALL = """
[[function]]
name     = "mlp.forward"
function = "fixtures.models:mlp_forward"
args     = ["@fixtures.models:mlp_param_specs", "f32[{batch},784]"]
vary     = { batch = [1, 8] }

[[function]]
name     = "tiny"
function = "fixtures.models:tiny"
args     = ["f32[8]", "f32[8]"]
"""


def _manifest(tmp_path: Path, head: str = "", body: str = SMALL) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(head + body, encoding="utf-8")
    return path


@pytest.mark.version_suite
@needs_libtpu
def test_warmup_for_two_targets_then_ls_show_verify(invoke: Invoke, tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    result = invoke("warmup", manifest, "--target", "tpu:v5e:1x1", "--target", "tpu:v5e:2x2", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    labels = sorted(r["label"] for r in report["results"])
    assert labels == sorted(
        f"{label}@{t}" for t in ("tpu:v5e:1x1", "tpu:v5e:2x2")
        for label in ("mlp.forward[batch=1]", "mlp.forward[batch=8]", "tiny")
    )
    assert {r["status"] for r in report["results"]} == {"compiled"}

    listing = json.loads(invoke("ls", "--env", "all", "--json").stdout)
    rows = listing["entries"] if isinstance(listing, dict) else listing
    assert len(rows) == 6 and not any(r["this_environment"] for r in rows)
    table = invoke("ls", "--env", "all").stdout
    # The ENV column names the accelerator (8 CPU devices here: the counts differ too).
    assert table.count("TPU v5 lite x1 +") == 3 and table.count("TPU v5 lite x4 +") == 3, table
    assert "no entries" in invoke("ls", "--env", "this").stdout or "0 entries" in invoke("ls", "--env", "this").stdout

    verified = invoke("verify")
    assert verified.exit_code == 0 and verified.stdout.rstrip().endswith(": ok"), verified.output

    # Again: every entry is a hit, nothing is loaded (or quarantined) on this host.
    again = json.loads(invoke("warmup", manifest, "--target", "tpu:v5e:1x1", "--target", "tpu:v5e:2x2", "--json").stdout)
    assert {r["status"] for r in again["results"]} == {"hit"}
    assert invoke("verify").exit_code == 0


@needs_libtpu
def test_the_manifest_names_the_target_and_shards_split_it(invoke: Invoke, tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, head='target = "tpu:v5e:1x1"\n')
    first = json.loads(invoke("warmup", manifest, "--shard", "1/2", "--json").stdout)
    second = json.loads(invoke("warmup", manifest, "--shard", "2/2", "--json").stdout)
    done = [r["label"] for r in first["results"] + second["results"]]
    assert sorted(done) == sorted(["mlp.forward[batch=1]@tpu:v5e:1x1", "mlp.forward[batch=8]@tpu:v5e:1x1", "tiny@tpu:v5e:1x1"])
    assert first["results"] and second["results"]
    shown = json.loads(invoke("show", "tiny", "--json").stdout)
    text = json.dumps(shown)
    for value in CHIP_PARTS.values():
        assert json.dumps(value)[1:-1] in text


@needs_libtpu
def test_compile_for_a_target(invoke: Invoke) -> None:
    args = ("compile", "fixtures.models:tiny", "--name", "tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--target", "tpu:v5e:1x1")
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    assert first.stdout.startswith("miss: compiled tiny for tpu:v5e:1x1 and stored it")
    second = invoke(*args)
    assert second.stdout.startswith("hit: tiny was in the cache"), second.output


@needs_libtpu
def test_a_pmap_entry_fails_alone_for_a_target(invoke: Invoke, tmp_path: Path) -> None:
    body = SMALL + '\n[[function]]\nname = "allreduce"\nfunction = "fixtures.models:allreduce"\nargs = ["f32[8,1024]"]\npmap = "i"\n'
    result = invoke("warmup", _manifest(tmp_path, body=body), "--target", "tpu:v5e:1x1")
    assert result.exit_code == 1
    assert "allreduce@tpu:v5e:1x1" in result.stderr and "lower it with a mesh instead" in result.stderr
    assert "3 compiled" in result.stdout


def test_an_unknown_target_is_a_usage_error(invoke: Invoke, tmp_path: Path) -> None:
    result = invoke("warmup", _manifest(tmp_path), "--target", "tpu:v5e:3x3")
    assert result.exit_code == 2
    assert "unknown target 'tpu:v5e:3x3'; known: tpu:v4:{" in result.output


def test_an_unknown_manifest_target_names_the_file(invoke: Invoke, tmp_path: Path) -> None:
    line = one_line_error(invoke("warmup", _manifest(tmp_path, head='target = "tpu:v7:2x2"\n')))
    assert "m.toml: the top-level target: unknown target 'tpu:v7:2x2'; known:" in line


def test_without_libtpu_a_target_warmup_fails_in_one_line(tmp_path: Path) -> None:
    """No TPU compiler here (JAX's topology API fails as it does without libtpu): one
    line saying what to install, before any entry is tried."""
    import subprocess
    import sys

    from tests.cli.helpers import REPO

    script = WITHOUT_LIBTPU
    manifest = _manifest(tmp_path, head='target = "tpu:v5e:1x1"\n')
    done = subprocess.run(
        [sys.executable, "-c", script, "--cache", str(tmp_path / "c"), "warmup", str(manifest)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert errors == [
        "Error: cannot compile for tpu:v5e:1x1: the TPU compiler (libtpu) is not installed here; "
        "pip install 'jax-aot[tpu]' (libtpu of the version jax[tpu] pins)"
    ], done.stderr
    assert "compiled" not in done.stdout and "FAILED" not in done.stdout


SERVE_AND_MESH = """
[[function]]
name     = "tiny"
function = "fixtures.models:tiny"
args     = ["f32[8]", "f32[8]"]
target   = "tpu:v5e:1x1"

[[function]]
name         = "sharded.matmul"
function     = "fixtures.models:matmul"
args         = ["f32[8,128]", "f32[128,128]"]
mesh         = "data=4"
in_shardings = ["data,None", ""]
target       = ["tpu:v5e:2x2", "tpu:v5e:2x2@2x2"]
"""


@needs_libtpu
def test_one_manifest_with_a_chip_function_and_a_mesh_function(invoke: Invoke, tmp_path: Path, cache_dir: Path) -> None:
    """Serving entries for one chip and a mesh entry for a 2x2 slice, from one manifest,
    on this CPU host: each stored with its own target's environment (the mesh over the
    slice's 4 chips), the 2x2 named twice compiled once."""
    import aot

    manifest = _manifest(tmp_path, body=SERVE_AND_MESH)
    result = invoke("warmup", manifest, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [(r["label"], r["status"]) for r in report["results"]] == [
        ("tiny@tpu:v5e:1x1", "compiled"), ("sharded.matmul@tpu:v5e:2x2", "compiled"),
    ]
    cache = aot.Cache(cache_dir)
    try:
        parts = {
            e.name: cache.artifact(e).manifest.environment.as_dict() for e in cache.entries()
        }
        assert {name: (p["platform"], p["device_kind"], p["device_count"]) for name, p in parts.items()} == {
            "tiny": ("tpu", "TPU v5 lite", "1"), "sharded.matmul": ("tpu", "TPU v5 lite", "4"),
        }
        (mesh_entry,) = cache.entries("sharded.matmul")
        assert cache.artifact(mesh_entry).manifest.device_ids == (0, 1, 2, 3)
    finally:
        cache.close()
    again = json.loads(invoke("warmup", manifest, "--json").stdout)
    assert {r["status"] for r in again["results"]} == {"hit"}


@needs_libtpu
def test_a_target_given_twice_compiles_once(invoke: Invoke, tmp_path: Path) -> None:
    body = '[[function]]\nname = "tiny"\nfunction = "fixtures.models:tiny"\nargs = ["f32[8]", "f32[8]"]\ntarget = "tpu:v5e:2x2"\n'
    result = invoke("warmup", _manifest(tmp_path, body=body), "--target", "tpu:v5e:1x1", "--target", "TPU:v5e:1x1 ", "--json")
    assert result.exit_code == 0, result.output
    # --target replaced the function's own 2x2; the two spellings of 1x1 are one target.
    assert [(r["label"], r["status"]) for r in json.loads(result.stdout)["results"]] == [("tiny@tpu:v5e:1x1", "compiled")]
