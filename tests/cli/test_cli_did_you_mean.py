""""Did you mean": a mistyped function or module, a manifest's mistyped key, a name
`why` finds nothing under, and a Cloud TPU accelerator type given as a target."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.helpers import Invoke, one_line_error

MODEL = '''
def forward(x):
    return x * 2.0
'''

MANIFEST = '''
[[function]]
name = "dym.forward"
{key} = "dym_model:forward"
args = ["f32[4]"]
'''


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's folder: their model and manifest, the working directory."""
    (tmp_path / "dym_model.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_mistyped_function_or_module(invoke: Invoke, folder: Path) -> None:
    assert one_line_error(invoke("compile", "dym_model:foward", "--arg", "f32[4]")) == (
        "Error: 'dym_model:foward': module 'dym_model' has no attribute 'foward' (did you mean 'forward'?)"
    )
    assert one_line_error(invoke("compile", "dym_modle:forward", "--arg", "f32[4]")) == (
        "Error: cannot import 'dym_modle' for 'dym_modle:forward': no module named 'dym_modle' "
        "(did you mean 'dym_model'?); run from the folder that contains it, or install it"
    )
    # Nothing close: no guess.
    assert one_line_error(invoke("compile", "dym_model:backward_pass", "--arg", "f32[4]")) == (
        "Error: 'dym_model:backward_pass': module 'dym_model' has no attribute 'backward_pass'"
    )


def test_a_mistyped_module_in_a_manifest_of_the_working_directory_is_suggested_once(
    invoke: Invoke, folder: Path,
) -> None:
    # The manifest's folder and the working directory are one: its modules are one list.
    (folder / "m.toml").write_text(MANIFEST.format(key="function").replace("dym_model:", "dym_modle:"))
    output = invoke("warmup", "m.toml").output
    assert "no module named 'dym_modle' (did you mean 'dym_model'?); run from the folder" in output
    assert " or 'dym_model'" not in output


def test_a_mistyped_manifest_key(invoke: Invoke, folder: Path) -> None:
    (folder / "m.toml").write_text(MANIFEST.format(key="fucntion"))
    assert one_line_error(invoke("warmup", "m.toml")) == (
        "Error: m.toml:2: [[function]] #1 ('dym.forward'): unknown key(s) ['fucntion'] (did you mean "
        "'function'?); expected some of ['name', 'function', 'target', 'args', 'args_from', 'kwargs', "
        "'static', 'vary', 'pmap', 'mesh', 'in_shardings', 'out_shardings', 'donate', 'x64']"
    )
    (folder / "m.toml").write_text('targets = "host"\n' + MANIFEST.format(key="function"))
    assert one_line_error(invoke("warmup", "m.toml")) == (
        "Error: m.toml: unknown top-level key(s) ['targets'] (did you mean 'target'?); a manifest holds "
        "[[function]] tables (and optionally a top-level target = \"tpu:v5e:2x2\" or a list of them, and a "
        "[fleet] table of pinned versions)"
    )


def test_why_names_the_stored_names_close_to_an_unknown_one(invoke: Invoke, folder: Path) -> None:
    assert invoke("compile", "dym_model:forward", "--name", "dym.forward", "--arg", "f32[4]").exit_code == 0
    missed = invoke("why", "dym.foward", "--arg", "f32[4]")
    assert (missed.exit_code, missed.stdout) == (
        1, "dym.foward: nothing is stored under this name (did you mean 'dym.forward'?); compile it first\n"
    )
    (folder / "m.toml").write_text(MANIFEST.format(key="function"))
    assert one_line_error(invoke("why", "--manifest", "m.toml", "dym.foward")) == (
        "Error: m.toml: no entry named 'dym.foward' (did you mean 'dym.forward'?); its names: dym.forward"
    )


@pytest.mark.parametrize("given,meant", [
    ("v5litepod-4", "(4 v5e chips), not PLATFORM:CHIP:TOPOLOGY; did you mean tpu:v5e:2x2?"),
    ("v4-8", "(8 TensorCores, 4 v4 chips), not PLATFORM:CHIP:TOPOLOGY; did you mean tpu:v4:2x2x1?"),
    ("v5p-16", "(16 TensorCores, 8 v5p chips), not PLATFORM:CHIP:TOPOLOGY; did you mean tpu:v5p:2x2x2?"),
    ("v6e-8", "(8 v6e chips), not PLATFORM:CHIP:TOPOLOGY; did you mean tpu:v6e:2x4?"),
])
def test_a_cloud_tpu_accelerator_type_names_its_target(invoke: Invoke, folder: Path, given: str, meant: str) -> None:
    (folder / "m.toml").write_text(MANIFEST.format(key="function"))
    said = f"target '{given}' is a Cloud TPU accelerator type {meant}"
    result = invoke("warmup", "m.toml", "--target", given)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1] == f"Error: Invalid value for '--target': {said}"
    (folder / "m.toml").write_text(f'target = "{given}"\n' + MANIFEST.format(key="function"))
    assert one_line_error(invoke("warmup", "m.toml")) == f"Error: m.toml: the top-level target: {said}"


def test_an_accelerator_type_no_topology_matches(invoke: Invoke, folder: Path) -> None:
    (folder / "m.toml").write_text(MANIFEST.format(key="function"))
    result = invoke("warmup", "m.toml", "--target", "v5litepod-3")
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1] == (
        "Error: Invalid value for '--target': target 'v5litepod-3' is a Cloud TPU accelerator type (3 v5e "
        "chips), not PLATFORM:CHIP:TOPOLOGY, and no known topology matches it; known: "
        "tpu:v5e:{1x1,2x2,2x4,4x4,4x8,8x8,8x16,16x16}"
    )
