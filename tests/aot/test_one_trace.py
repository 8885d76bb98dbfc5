"""One trace and one lowering per compiled entry (issue 25): the portable HLO is
exported from the lowering the compile used (aot.jaxcompat.export), and what it
serves is what the public ``jax.export`` path served."""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aot
from aot import computation as computation_module
from aot.build import build_artifact
from aot.recompile import recompile
from aot.rehydrate import load_executable
from fixtures import models
from tests.aot.helpers import assert_bitwise_equal

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

Pair = collections.namedtuple("Pair", ["total", "scaled"])


def _donating(x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.sin(x) * y + 1.0


def _keywords(x: jax.Array, *, scale: jax.Array, mode: str = "sum") -> Pair:
    total = jnp.sum(x) if mode == "sum" else jnp.max(x)
    return Pair(total, x * scale)


def _weak(x: jax.Array, k: float) -> jax.Array:
    return x * k


def _programs() -> dict[str, tuple[aot.MeshComputation, tuple[Any, ...], dict[str, Any]]]:
    """name -> (computation, args, kwargs) for a call of the compiled program."""
    rng = np.random.default_rng(0)
    mesh = models.sharded_mlp_mesh()
    x8 = np.asarray(rng.standard_normal((8, 8)), np.float32)
    return {
        "mlp": (
            aot.lower(models.mlp_forward, models.mlp_param_specs(), "f32[4,784]"),
            (models.mlp_init(), models.mlp_input(4)), {},
        ),
        "donated": (
            aot.lower(_donating, "f32[8,8]", "f32[8,8]", donate_argnums=0),
            (x8, x8 + 1), {},
        ),
        "keywords, statics, namedtuple": (
            aot.lower(_keywords, "f32[8,8]", scale="f32[]", mode="max", static_argnames="mode"),
            (x8,), {"scale": np.float32(3)},
        ),
        "weak scalar": (aot.lower(_weak, "f32[8]", 2.5), (x8[0], 2.5), {}),
        "mesh": (
            aot.lower(
                models.sharded_mlp, *models.sharded_mlp_specs(mesh), mesh=mesh,
                in_shardings=models.sharded_mlp_shardings(mesh),
            ),
            models.sharded_mlp_inputs(mesh), {},
        ),
        "pmap": (
            aot.lower_pmap(models.allreduce, models.allreduce_spec(), axis_name=models.ALLREDUCE_AXIS),
            (np.asarray(rng.standard_normal(models.allreduce_spec().shape), np.float32),), {},
        ),
    }


@pytest.fixture(scope="module")
def programs() -> dict[str, tuple[aot.MeshComputation, tuple[Any, ...], dict[str, Any]]]:
    return _programs()


def _public_export(computation: aot.MeshComputation, exe: Any) -> bytes:
    """What the portable HLO was before: jax.export traced and lowered again."""
    kept = iter(exe.info.in_shardings)
    in_shardings = [next(kept) if a.kept else None for a in exe.info.args]
    return computation._export(in_shardings, exe.info.out_shardings)


@pytest.mark.parametrize(
    "name", ["mlp", "donated", "keywords, statics, namedtuple", "weak scalar", "mesh", "pmap"]
)
def test_the_one_lowering_export_serves_what_the_public_export_served(programs, name: str) -> None:
    computation, args, kwargs = programs[name]
    exe = computation.compile()
    ours = computation_module.export_from_lowering(computation.name, computation.lowered, exe)
    assert ours is not None, "the one-lowering route refused a plain program"
    assert computation.portable_hlo(exe) == ours
    public_bytes = _public_export(computation, exe)
    public = jax.export.deserialize(bytearray(public_bytes))
    exported = jax.export.deserialize(bytearray(ours))
    for field in ("in_tree", "out_tree", "nr_devices", "module_kept_var_idx", "platforms",
                  "calling_convention_version", "ordered_effects", "unordered_effects",
                  "disabled_safety_checks", "uses_global_constants"):
        assert getattr(exported, field) == getattr(public, field), field
    for field in ("in_avals", "out_avals"):
        assert [(a.shape, a.dtype) for a in getattr(exported, field)] == [
            (a.shape, a.dtype) for a in getattr(public, field)
        ], field
    # The shardings: those asked for at lowering, else the compiled executable's.
    assert exported._in_named_shardings == public._in_named_shardings
    assert exported._out_named_shardings == public._out_named_shardings
    # Nothing in it depends on where it was lowered from, and it donates nothing itself.
    text = exported.mlir_module()
    assert ".py" not in text and "tf.aliasing_output" not in text and "jax.buffer_donor" not in text

    # Recompiled from each (another environment's path): the same executable, served alike.
    artifact = build_artifact(exe, ours)
    rebuilt = recompile(artifact)
    rebuilt_public = recompile(build_artifact(exe, public_bytes))
    assert rebuilt.manifest.program == artifact.manifest.program
    for field in ("in_shardings", "out_shardings", "args", "in_avals", "out_avals", "committed"):
        assert getattr(rebuilt.manifest, field) == getattr(rebuilt_public.manifest, field), field
    fresh = jax.tree_util.tree_map(np.array, (args, kwargs))  # a donated input is deleted
    expected = exe(*fresh[0], **fresh[1])
    for served in (rebuilt, rebuilt_public):
        fresh = jax.tree_util.tree_map(np.array, (args, kwargs))
        assert_bitwise_equal(load_executable(served)(*fresh[0], **fresh[1]), expected)


def test_the_same_program_lowered_from_two_places_exports_the_same_bytes() -> None:
    """Source locations stay out: ``aot compile`` and ``aot warmup`` of one function
    store one portable HLO blob."""

    def lower_here() -> aot.MeshComputation:
        return aot.lower(models.tiny, *models.tiny_specs(), name="tiny")

    def lower_from_a_helper() -> aot.MeshComputation:
        return aot.lower(models.tiny, *models.tiny_specs(), name="tiny.copy")

    first, second = lower_here(), lower_from_a_helper()
    assert first.portable_hlo() == second.portable_hlo()


@pytest.fixture()
def jax_events() -> Iterator[collections.Counter[str]]:
    seen: collections.Counter[str] = collections.Counter()

    def listen(event: str, _seconds: float, **_: Any) -> None:
        seen[event.rsplit("/", 1)[-1]] += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def test_compile_and_store_traces_and_lowers_once(tmp_path, jax_events, caplog) -> None:
    def fresh(x: jax.Array, y: jax.Array) -> jax.Array:  # not in any JAX cache yet
        return jnp.cos(x) * y - 2.0

    def twin(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.cos(x) * y - 2.0

    def second_twin(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.cos(x) * y - 2.0

    # What one jax.jit trace of this program reports: 1 on every release, once the jnp
    # functions inside were traced for these shapes (JAX 0.9.x also reports the first
    # trace of jnp.cos, multiply and subtract, which the first twin takes).
    spec = jax.ShapeDtypeStruct((16,), jnp.float32)
    jax.jit(twin).lower(spec, spec)
    jax_events.clear()
    jax.jit(second_twin).lower(spec, spec)
    one_trace = jax_events["jaxpr_trace_duration"]
    jax_events.clear()
    cache = aot.Cache(tmp_path / "cache")
    with caplog.at_level(logging.WARNING, logger="aot.computation"):
        exe = cache.compile(fresh, "f32[16]", "f32[16]", name="one.trace")
    assert jax_events["jaxpr_trace_duration"] == one_trace
    # The one-lowering route works on this release: no "tracing each program again"
    # warning, now or earlier in this process (it is logged once per process).
    assert not [r for r in caplog.records if "one-lowering route" in r.getMessage()]
    assert not computation_module._ROUTE_MISSING, computation_module._ROUTE_MISSING
    assert jax_events["jaxpr_to_mlir_module_duration"] == 1
    assert jax_events["backend_compile_duration"] == 1
    (entry,) = cache.entries(name="one.trace")
    assert entry.hlo_digest is not None
    x = np.arange(16, dtype=np.float32)
    assert_bitwise_equal(aot.load("one.trace", cache=cache)(x, x), exe(x, x))


def test_without_the_private_route_the_public_export_is_used_and_said_once(
    programs, monkeypatch, caplog
) -> None:
    from aot.jaxcompat import export as route

    def moved(*_: Any, **__: Any) -> Any:
        raise AttributeError("'MeshComputation' object has no attribute '_platforms'")

    monkeypatch.setattr(route, "export_lowered", moved)
    monkeypatch.setattr(computation_module, "_ROUTE_MISSING", [])
    computation, _, _ = programs["mlp"]
    exe = computation.compile()
    with caplog.at_level(logging.WARNING, logger="aot.computation"):
        first = computation.portable_hlo(exe)
        second = computation.portable_hlo(exe)
    assert first == second == _public_export(computation, exe)
    warnings = [r for r in caplog.records if "one-lowering route" in r.getMessage()]
    assert len(warnings) == 1 and "_platforms" in warnings[0].getMessage()


def test_a_pallas_style_kernel_goes_through_the_public_export(monkeypatch) -> None:
    """A module whose kernels JAX lowers differently for export is not taken as is."""
    from aot.jaxcompat import export as route

    computation = aot.lower(models.tiny, *models.tiny_specs())
    monkeypatch.setattr(route, "_EXPORT_SPECIFIC_TARGETS", (b"stablehlo",))
    assert computation_module.export_from_lowering(computation.name, computation.lowered) is None
    assert computation.portable_hlo() is not None  # the public path still exports it


def test_a_mesh_program_unspecified_inputs_keep_their_compiled_placement() -> None:
    mesh = models.sharded_mlp_mesh()
    params, x = models.sharded_mlp_specs(mesh)
    bare = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), (params, x))
    computation = aot.lower(
        models.sharded_mlp, *bare, mesh=mesh,
        out_shardings=NamedSharding(mesh, P("data", None)),
    )
    exe = computation.compile()
    rebuilt = recompile(build_artifact(exe, computation.portable_hlo(exe)))
    assert rebuilt.manifest.out_shardings == build_artifact(exe, None).manifest.out_shardings
    inputs = jax.tree_util.tree_map(np.asarray, models.sharded_mlp_inputs(mesh))
    assert_bitwise_equal(load_executable(rebuilt)(*inputs), exe(*inputs))
