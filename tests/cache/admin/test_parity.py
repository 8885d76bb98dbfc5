"""``aot verify --recompile`` (cache/admin/parity.py, aot/parity.py): each stored
executable compared with what this host compiles from the stored portable HLO."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from click.testing import CliRunner

import aot
from aot.artifact import EXECUTABLE, PORTABLE_HLO, Artifact
from aot.build import build_artifact
from aot.jaxcompat.versions import release_tuple
from aot.cache.admin.parity import DIFFERS, OK, SKIPPED, verify_recompile
from aot.cli.main import cli
from aot.parity import canonical_hlo


def mlp(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w).sum(0) * 2.0


def scanned(p: dict[str, jax.Array], xs: jax.Array) -> dict[str, jax.Array]:
    ys = jax.lax.scan(lambda c, x: (c * 0.5 + x, c.sum()), xs[0], xs)[1]
    return {"y": ys + p["b"], "z": p["a"].astype(jnp.bfloat16)}


SPECS = ("f32[8,16]", "f32[16,4]")


def test_a_fresh_cache_recompiles_to_the_same_programs(tmp_path: Path) -> None:
    cache = aot.Cache(tmp_path / "c")
    cache.compile(mlp, *SPECS, name="p.mlp")
    cache.compile(scanned, {"a": aot.spec("i32[3]"), "b": aot.spec("f32[]")}, "f32[5,4]", name="p.scan")
    # Compiler options are part of the program: the recompile uses them too.
    cache.compile(mlp, *SPECS, name="p.opt0", compiler_options={"xla_backend_optimization_level": 0})
    report = verify_recompile(cache)
    assert [(i.name, i.status, i.method) for i in report.items] == [
        ("p.mlp", OK, "hlo+outputs"), ("p.opt0", OK, "hlo+outputs"), ("p.scan", OK, "hlo+outputs"),
    ], report.lines()
    assert report.ok and report.summary() == "recompiled 3 of 3 entries here: 3 OK, 0 differ, 0 failed, 0 skipped"
    cache.close()


def _forge(cache: aot.Cache, good: Artifact, other: Artifact) -> None:
    """Stores ``other``'s executable under ``good``'s key and manifest, as a cache
    written by a host with other compiler options would hold it."""
    forged_manifest = replace(good.manifest, blobs={**good.manifest.blobs, EXECUTABLE: other.manifest.blobs[EXECUTABLE]})
    cache.put_artifact(Artifact(forged_manifest, {**good.blobs, **other.blobs}))


def test_an_executable_compiled_with_other_options_under_the_same_key_differs(tmp_path: Path) -> None:
    plain = aot.lower(mlp, *SPECS, name="p.mlp")
    good = build_artifact(plain.compile(), plain.portable_hlo(plain.compile()))
    other_lowering = aot.lower(mlp, *SPECS, name="p.mlp", compiler_options={"xla_cpu_enable_fast_math": True})
    other = build_artifact(other_lowering.compile(), other_lowering.portable_hlo(other_lowering.compile()))
    cache = aot.Cache(tmp_path / "c")
    _forge(cache, good, other)
    assert cache.entries()[0].key == good.manifest.key
    (item,) = verify_recompile(cache).items
    # Fast math changes the code XLA generates, not the optimized HLO: the outputs tell.
    assert item.status == DIFFERS and item.method == "outputs"
    assert item.detail.startswith(
        "output 0 differs on generated inputs (seed 0) (the optimized HLO is the same); the stored executable is not"
    )
    cache.close()

    out = CliRunner().invoke(cli, ["--cache", str(tmp_path / "c"), "verify", "--recompile"])
    assert out.exit_code == 1, out.output
    assert "recompiled 1 of 1 entry here: 0 OK, 1 differ, 0 failed, 0 skipped" in out.output
    assert f"DIFFERS p.mlp (f32[8,16], f32[16,4]) {good.manifest.key[:12]}: output 0 differs" in out.output


def test_a_different_optimized_program_is_named_as_such(tmp_path: Path) -> None:
    """Another program's executable (other instructions) under the key: the HLO says so."""
    plain = aot.lower(mlp, *SPECS, name="p.mlp")
    good = build_artifact(plain.compile(), plain.portable_hlo(plain.compile()))
    doubled = aot.lower(lambda x, w: jnp.tanh(x @ w).sum(0) * 3.0 + 1.0, *SPECS, name="p.mlp")
    other = build_artifact(doubled.compile(), doubled.portable_hlo(doubled.compile()))
    cache = aot.Cache(tmp_path / "c")
    _forge(cache, good, other)
    (item,) = verify_recompile(cache).items
    assert item.status == DIFFERS and item.method == "outputs"
    assert item.detail.startswith("output 0 differs on generated inputs (seed 0); optimized HLO differs: line ")
    # Without running, the optimized HLO alone decides.
    (item,) = verify_recompile(cache, run=False).items
    assert item.status == DIFFERS and item.method == "hlo" and item.detail.startswith("optimized HLO differs: line ")
    cache.close()


def test_entries_of_another_environment_are_skipped_with_why(tmp_path: Path) -> None:
    cache = aot.Cache(tmp_path / "c")
    with jax.enable_x64(True):
        cache.compile(lambda x: x * 2, "f64[4]", name="p.x64")  # checked in x64 mode: OK
    comp = aot.lower(mlp, *SPECS, name="p.mlp")
    artifact = build_artifact(comp.compile(), comp.portable_hlo(comp.compile()))
    elsewhere = dict(artifact.manifest.environment.as_dict(), platform="tpu", device_kind="TPU v5 lite", device_count="1")
    moved = replace(artifact.manifest, environment=type(artifact.manifest.environment).of("environment", elsewhere))
    cache.put_artifact(Artifact(replace(moved, key=aot.fingerprint.combined_key(moved.program, moved.environment)), artifact.blobs))
    items = {i.name: i for i in verify_recompile(cache).items}
    assert items["p.x64"].status == OK
    here = cache.environment.as_dict()
    assert items["p.mlp"].status == SKIPPED
    assert items["p.mlp"].detail == f"compiled for tpu (TPU v5 lite x1), this host is cpu (cpu x{here['device_count']})"
    cache.close()

    out = CliRunner().invoke(cli, ["--cache", str(tmp_path / "c"), "--json", "verify", "--recompile"])
    data = json.loads(out.output)
    assert data["recompile"]["counts"] == {"OK": 1, "DIFFERS": 0, "ERROR": 0, "SKIPPED": 1}
    assert data["recompile"]["ok"] is True


def test_a_pruned_argument_and_typed_keys_still_verify(tmp_path: Path) -> None:
    """The original compile prunes an unused argument, the recompile from the export
    keeps it: the optimized HLO differs in form, the outputs are equal: OK, saying so.
    Typed PRNG keys are generated as keys."""
    cache = aot.Cache(tmp_path / "c")
    cache.compile(lambda x, unused: x * 2.0, "f32[8,4]", "f32[4,3]", name="p.unused")
    cache.compile(lambda k, x: jax.random.normal(k, (3,)) + x, jax.ShapeDtypeStruct((), jax.random.key(0).dtype),
                  "f32[3]", name="p.key")
    items = {i.name: i for i in verify_recompile(cache).items}
    assert items["p.key"].status == OK
    # JAX 0.12's export writes the normal sampler's polynomial as multiply and add where
    # the original lowering has fma: equal outputs, an optimized HLO that differs in form.
    assert items["p.key"].method == ("outputs" if release_tuple(jax.__version__) >= (0, 12) else "hlo+outputs")
    assert (items["p.unused"].status, items["p.unused"].method) == (OK, "outputs")
    assert items["p.unused"].detail.startswith("outputs equal; optimized HLO differs: line 1: stored 'HloModule (f32[8,4]")
    cache.close()


def test_canonical_hlo_ignores_names_and_locations_only() -> None:
    a = aot.lower(mlp, *SPECS, name="a").compile()
    b = aot.lower(lambda x, y: jnp.tanh(x @ y).sum(0) * 2.0, *SPECS, name="b").compile()
    c = aot.lower(lambda x, y: jnp.tanh(x @ y).sum(0) * 2.0 + 1.0, *SPECS, name="c").compile()
    assert canonical_hlo(a.as_text()) == canonical_hlo(b.as_text())
    assert canonical_hlo(a.as_text()) != canonical_hlo(c.as_text())
    assert PORTABLE_HLO  # the blob role the recompile reads


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu not installed: needed to compile for a TPU target")
def test_an_entry_compiled_for_a_target_is_skipped_on_this_cpu(tmp_path: Path) -> None:
    cache = aot.Cache(tmp_path / "c")
    cache.compile(mlp, *SPECS, name="p.tpu", target="tpu:v5e:1x1")
    (item,) = verify_recompile(cache).items
    here = cache.environment.as_dict()
    assert (item.status, item.detail) == (
        SKIPPED, f"compiled for tpu (TPU v5 lite x1), this host is cpu (cpu x{here['device_count']})",
    )
    cache.close()
