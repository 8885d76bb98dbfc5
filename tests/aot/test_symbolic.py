"""Symbolic shapes in the core: spec strings with symbolic dimensions, lowering them
to a shape-polymorphic computation, its artifact, and binding it to concrete shapes."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
from aot.artifact import EXECUTABLE, PORTABLE_HLO, Artifact, Manifest
from aot.fingerprint import combined_key
from aot.build import build_artifact, build_symbolic_artifact
from aot.recompile import compile_symbolic
from aot.rehydrate import load_executable
from aot.symbolic import bind, split_dims
from tests.aot.helpers import assert_bitwise_equal


def dense(x, w):
    return jnp.tanh(x @ w)


# ---------------------------------------------------------------- specs


def test_symbolic_spec_strings_share_one_scope():
    x = aot.spec("f32[b,784]")
    y = aot.spec("i32[2*b]")
    assert str(x.shape[0]) == "b" and x.shape[1] == 784 and x.dtype == np.float32
    assert str(y.shape[0]) == "2*b"
    # One scope: the dimensions combine (jax.export refuses to mix scopes).
    assert y.shape[0] - 2 * x.shape[0] == 0
    assert aot.spec({"a": "f32[b]", "b": ["bf16[s,max(b, s)]"]})["b"][0].shape[1] is not None


@pytest.mark.parametrize(
    ("text", "dims"),
    [
        ("f32[b,784]", "b,784"),
        ("f32[ b , 2*b + 1 ]", "b,2*b+1"),
        ("i8[max(a, b),3]", "max(a,b),3"),
        ("f32[8]", "8"),
        ("f32[2*3]", "6"),  # a constant expression is just a number
    ],
)
def test_symbolic_dims_format_canonically(text, dims):
    from aot.specs import format_aval

    struct = aot.spec(text)
    assert format_aval(struct.shape, struct.dtype) == f"{text.split('[')[0]}[{dims}]"


def test_split_dims_keeps_commas_inside_calls():
    assert split_dims("b, max(a, b), 3") == ["b", " max(a, b)", " 3"]


def test_constraints_make_their_own_scope():
    struct = aot.spec("f32[b]", constraints=["b <= 64"])
    from aot.symbolic import constraints_of

    assert constraints_of(struct.shape[0].scope) == ("b <= 64",)
    with pytest.raises(aot.SpecError, match="malformed symbolic constraints"):
        aot.spec("f32[b]", constraints=["b <<= 3"])


# ---------------------------------------------------------------- lowering


def test_symbolic_lowering_is_one_shape_polymorphic_computation():
    comp = aot.lower(dense, "f32[b,16]", "f32[16,4]")
    assert comp.symbolic
    assert comp.signature == "f32[b,16], f32[16,4]"
    assert comp.program_fingerprint.as_dict()["in_avals"] == "f32[b,16], f32[16,4]"
    assert comp.program_fingerprint.as_dict()["symbolic_constraints"] == "[]"
    exported = jax.export.deserialize(bytearray(comp.portable_hlo()))
    assert [str(a) for a in exported.in_avals] == ["float32[b,16]", "float32[16,4]"]
    assert str(exported.out_avals[0]) == "float32[b,4]"


def test_concrete_fingerprints_have_no_symbolic_part():
    comp = aot.lower(dense, "f32[8,16]", "f32[16,4]")
    assert not comp.symbolic
    assert "symbolic_constraints" not in comp.program_fingerprint.as_dict()


def test_a_symbolic_computation_cannot_be_compiled_and_says_what_to_do():
    comp = aot.lower(dense, "f32[b,16]", "f32[16,4]")
    with pytest.raises(aot.SymbolicShapeError) as info:
        comp.compile()
    message = str(info.value)
    assert "(f32[b,16], f32[16,4]) has symbolic dimensions" in message
    assert "cache.put(computation)" in message and "aot.load(name)" in message
    assert isinstance(info.value, aot.UnsupportedComputationError)


def test_jax_export_structs_from_other_scopes_are_unified():
    own = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, 16"), np.float32)
    comp = aot.lower(lambda x, w, y: dense(x, w) + y, own, "f32[16,4]", "f32[b,4]")
    assert comp.signature == "f32[b,16], f32[16,4], f32[b,4]"
    constrained = jax.ShapeDtypeStruct(
        jax.export.symbolic_shape("b", constraints=["b >= 2"]), np.float32
    )
    comp = aot.lower(lambda x, y: x + y, constrained, "f32[b]")
    assert comp.symbolic_constraints == ("b >= 2",)
    assert comp.program_fingerprint.as_dict()["symbolic_constraints"] == '["b >= 2"]'


def test_scopes_with_different_constraints_are_refused():
    a = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b", constraints=["b >= 2"]), np.float32)
    b = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b", constraints=["b <= 9"]), np.float32)
    with pytest.raises(aot.SymbolicShapeError, match="scopes with different constraints"):
        aot.lower(lambda x, y: x + y, a, b)


def test_a_program_that_cannot_be_polymorphic_names_the_comparison():
    def branchy(x):
        return x if x.shape[0] > 3 else 2 * x

    with pytest.raises(aot.SymbolicShapeError) as info:
        aot.lower(branchy, "f32[b]", name="branchy")
    message = str(info.value)
    assert message.startswith("branchy: cannot be lowered for the symbolic shapes (f32[b]): ")
    assert "'b' > '3' is inconclusive" in message
    assert "constraints=['b >= 4']" in message
    # ... and the constraint makes it work
    comp = aot.lower(branchy, aot.spec("f32[b]", constraints=["b >= 4"]), name="branchy")
    assert comp.symbolic_constraints == ("b >= 4",)


def test_a_reshape_that_needs_divisibility_names_it():
    with pytest.raises(aot.SymbolicShapeError, match=r"Cannot divide evenly the sizes of shapes \(b,\)"):
        aot.lower(lambda x: x.reshape(2, -1), "f32[b]")
    comp = aot.lower(lambda x: x.reshape(2, -1), "f32[2*b]")
    assert comp.out_avals[0].shape[0] == 2


def test_pmap_with_symbolic_shapes_is_refused():
    with pytest.raises(aot.SymbolicShapeError, match="pmap cannot be lowered for symbolic shapes"):
        aot.lower_pmap(lambda x: x * 2, "f32[8,b]")


# ---------------------------------------------------------------- the artifact


@pytest.fixture(scope="module")
def symbolic_artifact():
    return build_symbolic_artifact(aot.lower(dense, "f32[b,16]", "f32[16,4]", name="dense"))


def test_symbolic_artifact_has_portable_hlo_and_no_executable(symbolic_artifact):
    manifest = symbolic_artifact.manifest
    assert manifest.is_symbolic and manifest.symbolic_constraints == ()
    assert set(manifest.blobs) == {PORTABLE_HLO}
    assert manifest.format_version == 2  # symbolic entries came in format 2; older readers serve it
    assert [a["shape"] for a in manifest.args] == [["b", 16], [16, 4]]
    assert [a["shape"] for a in manifest.out_avals] == [["b", 4]]
    assert manifest.signature == "f32[b,16], f32[16,4]"
    again = Manifest.from_json(manifest.to_json())
    assert again == manifest and again.to_json() == manifest.to_json()
    with pytest.raises(aot.SymbolicShapeError, match="is a symbolic entry"):
        load_executable(symbolic_artifact)


def _rekeyed(data: dict) -> str:
    from aot.fingerprint import Fingerprint

    program = Fingerprint.from_dict(data["program"])
    environment = Fingerprint.from_dict(data["environment"])
    data["key"] = combined_key(program, environment)
    return json.dumps(data)


def test_inconsistent_symbolic_manifests_are_corrupt(symbolic_artifact):
    data = symbolic_artifact.manifest.to_dict()
    no_marker = dict(data)
    del no_marker["symbolic"]
    with pytest.raises(aot.CorruptArtifactError, match="symbolic dimension 'b' in a concrete manifest"):
        Manifest.from_json(json.dumps(no_marker))
    with_exe = json.loads(json.dumps(data))
    with_exe["blobs"][EXECUTABLE] = {"digest": "0" * 64, "size": 1}
    with pytest.raises(aot.CorruptArtifactError, match="portable_hlo blob and no executable"):
        Manifest.from_json(json.dumps(with_exe))
    hostile = json.loads(json.dumps(data))
    hostile["out_avals"][0]["shape"][0] = "__import__('os')"
    with pytest.raises(aot.CorruptArtifactError, match="malformed symbolic dimension"):
        Manifest.from_json(json.dumps(hostile))
    bad_constraint = json.loads(json.dumps(data))
    bad_constraint["symbolic"] = {"constraints": ["b; drop"]}
    with pytest.raises(aot.CorruptArtifactError, match="malformed symbolic constraints"):
        Manifest.from_json(json.dumps(bad_constraint))


def test_a_concrete_manifest_needs_its_executable():
    comp = aot.lower(dense, "f32[2,16]", "f32[16,4]")
    data = build_artifact(comp.compile(), None).manifest.to_dict()
    del data["blobs"][EXECUTABLE]
    with pytest.raises(aot.CorruptArtifactError, match="concrete manifest without an executable"):
        Manifest.from_json(json.dumps(data))


def test_format_1_manifests_are_still_read():
    comp = aot.lower(dense, "f32[2,16]", "f32[16,4]")
    manifest = build_artifact(comp.compile(), None).manifest
    data = manifest.to_dict()
    data["format_version"] = 1
    old = Manifest.from_json(json.dumps(data))
    assert old.format_version == 1 and not old.is_symbolic
    # As written, so that an HMAC over a version-1 manifest still verifies.
    assert json.loads(old.to_json())["format_version"] == 1
    from aot.fingerprint import canonical_json

    assert old.signed_payload() == canonical_json(data).encode()


def test_compile_symbolic_matches_jit_bit_for_bit(symbolic_artifact):
    concrete = compile_symbolic(symbolic_artifact, [(5, 16), (16, 4)])
    manifest = concrete.manifest
    assert not manifest.is_symbolic and set(manifest.blobs) == {EXECUTABLE, PORTABLE_HLO}
    assert manifest.signature == "f32[5,16], f32[16,4]"
    assert manifest.blobs[PORTABLE_HLO] == symbolic_artifact.manifest.blobs[PORTABLE_HLO]
    parts = manifest.program.as_dict()
    assert parts["symbolic_program"] == symbolic_artifact.manifest.program.digest
    assert parts["name"] == "dense" and "symbolic_constraints" not in parts
    assert Manifest.from_json(manifest.to_json()) == manifest
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 16), np.float32)
    w = rng.standard_normal((16, 4), np.float32)
    assert_bitwise_equal(load_executable(concrete)(x, w), jax.jit(dense)(x, w))


def test_compile_symbolic_keeps_donation():
    comp = aot.lower(lambda x: x * 2, "f32[b]", donate_argnums=0, name="double")
    concrete = compile_symbolic(build_symbolic_artifact(comp), [(6,)])
    executable = load_executable(concrete)
    x = jnp.arange(6, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(executable(x)), np.arange(6) * 2)
    assert x.is_deleted()
    assert Artifact(concrete.manifest, concrete.blobs).manifest.args[0]["donated"]


# ---------------------------------------------------------------- binding


@pytest.mark.parametrize(
    ("patterns", "shapes", "constraints", "values", "reason"),
    [
        ([("b", 784)], [(8, 784)], (), {"b": 8}, ""),
        ([("2*b", 3), ("b",)], [(8, 3), (4,)], (), {"b": 4}, ""),
        ([("b+1",)], [(5,)], (), {"b": 4}, ""),
        ([("b", "s"), ("s",)], [(2, 7), (7,)], (), {"b": 2, "s": 7}, ""),
        ([("b", 784)], [(8, 783)], (), None, "input 0: dimension 1 is 783, not 784"),
        ([("b", 784)], [(8,)], (), None, "input 0: rank 1 != 2"),
        ([("2*b", 3), ("b",)], [(8, 3), (5,)], (), None, "inconsistency between dimension size"),
        ([("2*b",)], [(7,)], (), None, "Division had remainder 1"),
        ([("b",)], [(2,)], ("b >= 4",), None, "constraint b >= 4"),
        ([("b",)], [(0,)], (), None, "Expected value >= 1 for dimension variable 'b'"),
    ],
)
def test_bind_solves_or_says_why_not(patterns, shapes, constraints, values, reason):
    binding = bind(patterns, shapes, constraints)
    assert binding.values == values
    assert reason in binding.reason
    assert binding.ok is (values is not None)


def test_a_symbolic_program_on_an_explicit_mesh_compiles_for_concrete_shapes():
    """Exported under jax.set_mesh with Explicit axes, the shape assertions carry a
    sharding constraint and XLA cannot refine shapes: exported outside the context."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    comp = aot.lower(
        lambda x: (jnp.tanh(x) * 2, x.sum(axis=1)),
        aot.spec("f32[4*b,16]@data,None", mesh=mesh), mesh=mesh, name="rows",
    )
    concrete = compile_symbolic(build_symbolic_artifact(comp), [(8, 16)])
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", None))
    x = jax.device_put(np.arange(128, dtype=np.float32).reshape(8, 16), sharding)
    out = load_executable(concrete)(x)
    assert_bitwise_equal(out, jax.jit(lambda x: (jnp.tanh(x) * 2, x.sum(axis=1)))(x))
    assert out[0].sharding.is_equivalent_to(sharding, 2)
