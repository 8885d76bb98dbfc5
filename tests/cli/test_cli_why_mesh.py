"""``aot why`` for a mesh entry with donation, as it was warmed: the options of ``aot
compile`` (``--mesh``, ``--in-sharding``, ``--donate``...) and ``--manifest M NAME`` (the
entry described and lowered by the warm-up's own code) give the warmed key, a hit;
without them the request is another program and the miss names what differs."""

from __future__ import annotations

import json
from pathlib import Path

import aot
from tests.aot.test_targets import needs_libtpu
from tests.cli.helpers import Invoke, one_line_error

TRAIN = '''
[[function]]
name = "team.train_step"
function = "tests.cli.models:donating"
args = ["f32[8,4]@data,None", "f32[4]"]
mesh = "data=4"{target}
in_shardings = ["data,None", ""]
donate = [0]
'''

FUNCTION = ("--function", "tests.cli.models:donating")
SHARDED = ("--arg", "f32[8,4]@data,None", "--arg", "f32[4]")
AS_WARMED = (*FUNCTION, *SHARDED, "--mesh", "data=4", "--in-sharding", "data,None", "--in-sharding", "", "--donate", "0")


def _warm(invoke: Invoke, tmp_path: Path, cache_dir: Path, target: str | None = None) -> tuple[Path, str]:
    manifest = tmp_path / "train.toml"
    manifest.write_text(TRAIN.format(target=f'\ntarget = "{target}"' if target else ""))
    warmed = invoke("warmup", str(manifest))
    assert warmed.exit_code == 0, warmed.output
    cache = aot.Cache(cache_dir)
    try:
        (entry,) = cache.entries("team.train_step")
    finally:
        cache.close()
    return manifest, entry.key


def test_a_mesh_entry_with_donation_is_a_hit_as_it_was_warmed(invoke: Invoke, tmp_path: Path, cache_dir: Path) -> None:
    manifest, key = _warm(invoke, tmp_path, cache_dir)
    hit = f"team.train_step (x: f32[8,4], y: f32[4]): hit, key {key[:12]} (served: its ref names it)\n"

    by_manifest = invoke("why", "--manifest", str(manifest), "team.train_step")
    assert (by_manifest.exit_code, by_manifest.stdout) == (0, hit), by_manifest.output
    by_flags = invoke("why", "team.train_step", *AS_WARMED)
    assert (by_flags.exit_code, by_flags.stdout) == (0, hit), by_flags.output
    # The signature alone, sharded specs resolved over --mesh: a hit too.
    signature = invoke("why", "team.train_step", *SHARDED, "--mesh", "data=4")
    assert (signature.exit_code, signature.stdout) == (0, hit), signature.output

    as_json = invoke("why", "--manifest", str(manifest), "team.train_step", "--json")
    assert as_json.exit_code == 0, as_json.output
    assert [(e["hit"], e["nearest_key"]) for e in json.loads(as_json.stdout)] == [(True, key)]


def test_a_different_entry_is_a_miss_naming_what_differs(invoke: Invoke, tmp_path: Path, cache_dir: Path) -> None:
    _, key = _warm(invoke, tmp_path, cache_dir)
    # Without --donate: another program, the part named.
    kept = invoke("why", "team.train_step", *FUNCTION, *SHARDED, "--mesh", "data=4", "--in-sharding", "data,None",
                  "--in-sharding", "")
    assert kept.exit_code == 1, kept.output
    lines = kept.stdout.splitlines()
    assert lines[:2] == [
        f"team.train_step (x: f32[8,4], y: f32[4]): miss; nearest of 1 stored entry is {key[:12]} "
        "(x: f32[8,4], y: f32[4])",
        "  donated [0] != []",
    ]
    assert [line.split()[0] for line in lines[1:]] == ["donated", "stablehlo"]

    # On 2 devices, not 4: the devices and the shardings differ.
    smaller = invoke("why", "team.train_step", *FUNCTION, *SHARDED, "--mesh", "data=2", "--in-sharding", "data,None",
                     "--in-sharding", "", "--donate", "0")
    assert smaller.exit_code == 1, smaller.output
    parts = [line.split()[0] for line in smaller.stdout.splitlines()[1:]]
    assert parts == ["devices", "in_shardings", "stablehlo"], smaller.stdout
    lines = smaller.stdout.splitlines()
    assert lines[1] == "  devices [0,1,2,3] != [0,1]"
    # Both shardings begin alike: shown from where they part.
    assert lines[2].startswith('  in_shardings ..."],"device_ids":[0,1,2,3],"shape":[4]},')
    assert ' != ..."],"device_ids":[0,1],"shape":[2]},' in lines[2]


def test_why_options_usage(invoke: Invoke, tmp_path: Path, cache_dir: Path) -> None:
    manifest, _ = _warm(invoke, tmp_path, cache_dir)
    sharded = invoke("why", "team.train_step", *SHARDED)
    assert one_line_error(sharded) == (
        "Error: spec 'f32[8,4]@data,None' names a sharding but no mesh was given; pass mesh= "
        "(or --mesh on the command line)"
    )
    donate = invoke("why", "team.train_step", "--arg", "f32[8,4]", "--arg", "f32[4]", "--donate", "0")
    assert donate.exit_code == 2
    assert donate.stderr.splitlines()[-1] == (
        "Error: --donate changes the program, not its input signature: give --function MODULE:FUNCTION "
        "to lower it and compare every part (or --manifest MANIFEST.toml to explain an entry as aot "
        "warmup compiles it)"
    )
    both = invoke("why", "--manifest", str(manifest), "team.train_step", "--arg", "f32[4]", "--donate", "0")
    assert both.exit_code == 2
    assert both.stderr.splitlines()[-1] == (
        "Error: --manifest describes NAME's entries as aot warmup compiles them; give no --arg, --donate with it"
    )
    typo = invoke("why", "--manifest", str(manifest), "team.trian_step")
    assert one_line_error(typo) == (
        f"Error: {manifest}: no entry named 'team.trian_step' (did you mean 'team.train_step'?); "
        "its names: team.train_step"
    )


@needs_libtpu
def test_a_tpu_mesh_entry_is_a_hit_for_its_target(invoke: Invoke, tmp_path: Path, cache_dir: Path) -> None:
    """The issue's case: tpu:v5e:2x2, mesh data=4, donation, compiled deviceless here."""
    manifest, key = _warm(invoke, tmp_path, cache_dir, target="tpu:v5e:2x2")
    hit = f"team.train_step@tpu:v5e:2x2 (x: f32[8,4], y: f32[4]): hit, key {key[:12]} (served: its ref names it)\n"
    by_manifest = invoke("why", "--manifest", str(manifest), "team.train_step")
    assert (by_manifest.exit_code, by_manifest.stdout) == (0, hit), by_manifest.output
    by_flags = invoke("why", "team.train_step", *AS_WARMED, "--target", "tpu:v5e:2x2")
    assert (by_flags.exit_code, by_flags.stdout) == (0, hit), by_flags.output

    # The manifest's entry for this host instead: another environment.
    here = invoke("why", "--manifest", str(manifest), "team.train_step", "--target", "host")
    assert here.exit_code == 1, here.output
    lines = here.stdout.splitlines()
    assert lines[0].startswith("team.train_step (x: f32[8,4], y: f32[4]): miss; nearest of 1 stored entry is ")
    assert "  device_count 4 != 8" in lines and "  platform tpu != cpu" in lines


def test_why_manifest_explains_every_bucket_and_a_pmap_entry(invoke: Invoke, warmed: Path) -> None:
    from tests.cli.helpers import MANIFEST

    with aot.Cache(warmed) as cache:
        keys = {e.signature: e.key[:12] for e in cache.entries("mlp.forward")}
        (allreduce,) = cache.entries("allreduce")
    params = "params: [{2 arrays}, {2 arrays}, {2 arrays}]"
    every = invoke("why", "--manifest", str(MANIFEST), "mlp.forward")
    assert every.exit_code == 0, every.output
    shown = [
        f"mlp.forward[batch={n}] ({params}, x: f32[{n},784]): hit, key "
        f"{next(k for s, k in keys.items() if s.endswith(f'f32[{n},784]'))} (served: its ref names it)"
        for n in (1, 8, 32)
    ]
    assert every.stdout.splitlines() == shown
    one = invoke("why", "--manifest", str(MANIFEST), "mlp.forward[batch=8]")
    assert (one.exit_code, one.stdout.splitlines()) == (0, shown[1:2]), one.output
    pmap = invoke("why", "--manifest", str(MANIFEST), "allreduce")
    assert (pmap.exit_code, pmap.stdout) == (
        0, f"allreduce (x: f32[8,1024]): hit, key {allreduce.key[:12]} (served: its ref names it)\n"
    ), pmap.output
