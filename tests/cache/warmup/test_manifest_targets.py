"""A manifest's words: ``function`` names the Python function, ``target`` a device target
(top level, or a [[function]]'s own, ``"host"`` for this host); the old
``target = "module:attr"`` is still read, with one warning. Parsing only: no JAX, no libtpu."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import aot
from aot.cache.warmup.manifest import WarmupItem, expand, load_manifest, parse_manifest

SERVE_AND_MESH = """\
target = "tpu:v5e:1x1"

[[function]]
name     = "tiny"
function = "fixtures.models:tiny"
args     = ["f32[8]", "f32[8]"]

[[function]]
name         = "sharded.matmul"
function     = "fixtures.models:matmul"
args         = ["f32[8,128]", "f32[128,128]"]
mesh         = "data=4"
in_shardings = ["data,None", ""]
target       = "tpu:v5e:2x2"

[[function]]
name     = "local"
function = "fixtures.models:tiny"
args     = ["f32[{n}]", "f32[{n}]"]
vary     = { n = [2, 4] }
target   = "host"

[[function]]
name     = "both"
function = "fixtures.models:tiny"
args     = ["f32[3]", "f32[3]"]
target   = ["tpu:v5e:1x1", "host", "tpu:v5e:2x2"]
"""


def _where(items: list[WarmupItem]) -> list[tuple[str, str | None]]:
    return [(item.label.split("@")[0], item.device_target) for item in items]


def test_function_names_the_python_function_and_target_the_device() -> None:
    manifest = parse_manifest(SERVE_AND_MESH, "serve.toml")
    assert manifest.warnings == ()
    assert [f.function for f in manifest.functions] == ["fixtures.models:tiny", "fixtures.models:matmul", "fixtures.models:tiny", "fixtures.models:tiny"]
    assert [f.targets for f in manifest.functions] == [None, ("tpu:v5e:2x2",), ("host",), ("tpu:v5e:1x1", "host", "tpu:v5e:2x2")]
    items = expand(manifest)
    # Grouped by target in the order the targets first appear, file order within each.
    assert _where(items) == [
        ("tiny", "tpu:v5e:1x1"), ("both", "tpu:v5e:1x1"),
        ("sharded.matmul", "tpu:v5e:2x2"), ("both", "tpu:v5e:2x2"),
        ("local[n=2]", None), ("local[n=4]", None), ("both", None),
    ]
    mesh_item = items[2]
    assert mesh_item.label == "sharded.matmul@tpu:v5e:2x2" and mesh_item.source == "serve.toml:8"
    assert mesh_item.to_dict()["function"] == "fixtures.models:matmul"
    assert mesh_item.to_dict()["target"] == "tpu:v5e:2x2" and items[4].to_dict()["target"] is None


def test_without_targets_every_item_is_for_this_host() -> None:
    manifest = parse_manifest('[[function]]\nfunction = "m:f"\nargs = ["f32[2]"]\n', "m.toml")
    (item,) = expand(manifest)
    assert item.name == "m.f" and item.function == "m:f" and item.device_target is None


def test_the_cli_target_replaces_the_top_level_and_each_function_s_own() -> None:
    manifest = parse_manifest(SERVE_AND_MESH, "serve.toml").for_targets(["tpu:v5e:2x2@2x2", "tpu:v5e:2x2"])
    items = expand(manifest)
    assert {item.device_target for item in items} == {"tpu:v5e:2x2"}  # once: one target, two spellings
    assert len(items) == 5  # tiny, sharded.matmul, local x2, both


def test_a_target_named_twice_is_compiled_once() -> None:
    text = (
        'target = ["tpu:v5e:1x1", "TPU:v5e:1x1", "tpu:v5e:2x2@2x2", "tpu:v5e:2x2"]\n'
        '[[function]]\nfunction = "m:f"\nargs = ["f32[2]"]\n'
        '[[function]]\nname = "g"\nfunction = "m:g"\nargs = ["f32[2]"]\ntarget = ["host", "host", "tpu:v5e:1x1"]\n'
    )
    manifest = parse_manifest(text, "twice.toml")
    assert manifest.targets == ("tpu:v5e:1x1", "tpu:v5e:2x2")
    assert manifest.functions[1].targets == ("host", "tpu:v5e:1x1")
    assert _where(expand(manifest)) == [("m.f", "tpu:v5e:1x1"), ("g", "tpu:v5e:1x1"), ("m.f", "tpu:v5e:2x2"), ("g", None)]
    assert parse_manifest(text, "twice.toml").for_targets(["tpu:v5e:1x1"] * 3).targets == ("tpu:v5e:1x1",)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ('"tpu:v5e:3x3"', "twice.toml:3: [[function]] #1 ('f'): 'target': unknown target 'tpu:v5e:3x3'; known: tpu:v4:{"),
        ('"gpu:h100:1x1"', "twice.toml:3: [[function]] #1 ('f'): 'target': target 'gpu:h100:1x1': a GPU target's platform is 'cuda', not 'gpu'"),
        ('"cuda:a100"', "twice.toml:3: [[function]] #1 ('f'): 'target': unknown GPU target 'cuda:a100'; known: cuda:h100, cuda:h200"),
        ('[]', "twice.toml:3: [[function]] #1 ('f'): 'target': a device target string (\"tpu:v5e:2x2\", or \"host\" for this host's devices) or a non-empty list of them is expected, got []"),
        ('"m:g"', "twice.toml:3: [[function]] #1 ('f'): target = 'm:g' looks like a Python function, but 'function' already names 'm:f'"),
    ],
    ids=["unknown topology", "gpu", "unknown gpu", "empty list", "a function as target"],
)
def test_a_bad_device_target_in_a_function_names_file_and_line(target: str, message: str) -> None:
    text = f'# serving\n\n[[function]]\nname = "f"\nfunction = "m:f"\nargs = ["f32[2]"]\ntarget = {target}\n'
    with pytest.raises(aot.ManifestError) as raised:
        parse_manifest(text, "twice.toml")
    assert str(raised.value).startswith(message), str(raised.value)


def test_a_functions_own_gpu_target_is_not_taken_for_a_python_function() -> None:
    # cuda:h200 has the shape of MODULE:ATTRIBUTE, the old spelling of `function`.
    text = ('[[function]]\nname = "f"\nfunction = "m:f"\nargs = ["f32[2]"]\ntarget = "cuda:h200"\n\n'
            '[[function]]\nname = "g"\nfunction = "m:g"\nargs = ["f32[2]"]\ntarget = "CUDA:h200:2x8"\n')
    manifest = parse_manifest(text, "gpu.toml")
    assert manifest.warnings == ()
    assert [f.targets for f in manifest.functions] == [("cuda:h200",), ("cuda:h200:2x8",)]


def test_a_bad_top_level_target_names_the_file() -> None:
    with pytest.raises(aot.ManifestError, match=r"^top\.toml: the top-level target: unknown target 'tpu:v5e:3x3'"):
        parse_manifest('target = "tpu:v5e:3x3"\n[[function]]\nfunction = "m:f"\n', "top.toml")


def test_the_old_spelling_still_works_and_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "old.toml"
    path.write_text(
        'target = "tpu:v5e:1x1"\n\n'
        '[[function]]\nname = "tiny"\ntarget = "fixtures.models:tiny"\nargs = ["f32[8]", "f32[8]"]\n\n'
        '[[function]]\nname = "mm"\ntarget = "fixtures.models:matmul"\nargs = ["f32[2,2]", "f32[2,2]"]\n',
        encoding="utf-8",
    )
    with caplog.at_level(logging.WARNING, logger="aot"):
        manifest = load_manifest(path)
    assert [f.function for f in manifest.functions] == ["fixtures.models:tiny", "fixtures.models:matmul"]
    # The top-level target stays a device target; the tables' old target is their function.
    assert [item.device_target for item in expand(manifest)] == ["tpu:v5e:1x1", "tpu:v5e:1x1"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == list(manifest.warnings) and len(warnings) == 1  # once per manifest
    assert warnings[0] == (
        f'{path}: 2 [[function]] tables name the Python function with target = "MODULE:ATTRIBUTE", '
        f"the old spelling: {path}:3 (fixtures.models:tiny), {path}:8 (fixtures.models:matmul); "
        'write function = "fixtures.models:tiny" instead (target now names a device target such '
        'as "tpu:v5e:2x2"); the old spelling is still read'
    )


def test_a_table_without_a_function_says_what_to_write() -> None:
    with pytest.raises(aot.ManifestError) as raised:
        parse_manifest('[[function]]\nname = "f"\ntarget = "tpu:v5e:1x1"\n', "none.toml")
    assert str(raised.value) == (
        "none.toml:1: [[function]] #1 ('f'): no 'function': name the Python function to compile as "
        "function = \"MODULE:ATTRIBUTE\" (e.g. 'fixtures.models:tiny'); target = 'tpu:v5e:1x1' is "
        "not MODULE:ATTRIBUTE (and 'target' names device targets now)"
    )
