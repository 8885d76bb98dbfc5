"""aot.spec: spec strings, sharded specs, pytrees of specs, and malformed specs."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aot
from aot.jaxcompat.shardings import single_device_sharding
from aot.specs import GRAMMAR, format_aval, leaf_signature, parse_partition_spec

# Every dtype docs/specs.md lists, with the numpy dtype it must become.
DTYPES = {
    "f16": np.float16,
    "bf16": jnp.bfloat16,
    "f32": np.float32,
    "f64": np.float64,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "u8": np.uint8,
    "u16": np.uint16,
    "u32": np.uint32,
    "u64": np.uint64,
    "bool": np.bool_,
    "c64": np.complex64,
    "c128": np.complex128,
}


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((4, 2), ("data", "model"))


@pytest.mark.parametrize("short", sorted(DTYPES))
def test_every_dtype_parses_and_formats_back(short):
    if np.dtype(DTYPES[short]).itemsize == 8 or short == "c128":
        jax.config.update("jax_enable_x64", True)  # restored by conftest
    struct = aot.spec(f"{short}[8,128]")
    assert isinstance(struct, jax.ShapeDtypeStruct)
    assert struct.shape == (8, 128)
    assert struct.dtype == np.dtype(DTYPES[short])
    assert struct.sharding is None
    # The short name is what error messages and signatures print.
    assert format_aval(struct.shape, struct.dtype) == f"{short}[8,128]"


@pytest.mark.parametrize(
    ("text", "dtype"), [("float32[3]", np.float32), ("int8[3]", np.int8), ("bfloat16[3]", jnp.bfloat16)]
)
def test_numpy_dtype_names_are_accepted(text, dtype):
    assert aot.spec(text).dtype == np.dtype(dtype)


@pytest.mark.parametrize("text", ["f32[]", "f32[ ]", " f32[] "])
def test_scalar_spec(text):
    struct = aot.spec(text)
    assert struct.shape == ()
    assert struct.dtype == np.float32


def test_zero_sized_and_high_rank_dimensions():
    assert aot.spec("i32[0,3]").shape == (0, 3)
    assert aot.spec("u8[1, 2, 3, 4, 5]").shape == (1, 2, 3, 4, 5)


def test_sharded_spec_on_a_mesh(mesh):
    struct = aot.spec("f32[8,16]@data,None", mesh=mesh)
    assert struct.shape == (8, 16)
    assert isinstance(struct.sharding, NamedSharding)
    assert struct.sharding.mesh is mesh
    assert struct.sharding.spec == P("data", None)


@pytest.mark.parametrize(
    ("sharding", "expected"),
    [
        ("None,model", P(None, "model")),
        ("_,model", P(None, "model")),
        ("data", P("data")),
        ("data+model", P(("data", "model"))),
        ("data+model,None", P(("data", "model"), None)),
    ],
)
def test_sharding_entries(mesh, sharding, expected):
    assert aot.spec(f"f32[8,16]@{sharding}", mesh=mesh).sharding.spec == expected


def test_parse_partition_spec_strings():
    assert parse_partition_spec("data,None") == P("data", None)
    assert parse_partition_spec("") == P()
    assert parse_partition_spec("('data', 'model')") == P("data", "model")


def test_pytree_of_strings_arrays_and_structs():
    Point = collections.namedtuple("Point", ["x", "y"])
    tree = {
        "w": "f32[4,4]",
        "layers": ["bf16[2]", jax.ShapeDtypeStruct((3,), np.int32)],
        "pair": ("u8[]", np.zeros((2, 5), np.float16)),
        "point": Point(jnp.ones((7,), jnp.int8), "c64[1]"),
        "nothing": None,
    }
    out = aot.spec(tree)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(
        {
            "w": 0,
            "layers": [0, 0],
            "pair": (0, 0),
            "point": Point(0, 0),
            "nothing": None,
        }
    )
    got = {
        jax.tree_util.keystr(path): format_aval(leaf.shape, leaf.dtype)
        for path, leaf in jax.tree_util.tree_flatten_with_path(out)[0]
    }
    assert got == {
        "['w']": "f32[4,4]",
        "['layers'][0]": "bf16[2]",
        "['layers'][1]": "i32[3]",
        "['pair'][0]": "u8[]",
        "['pair'][1]": "f16[2,5]",
        "['point'].x": "i8[7]",
        "['point'].y": "c64[1]",
    }
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree_util.tree_leaves(out))


def test_struct_passes_through_unchanged():
    struct = jax.ShapeDtypeStruct((2, 3), np.float32)
    assert aot.spec(struct) is struct


def test_committed_mesh_array_keeps_its_sharding(mesh):
    sharding = NamedSharding(mesh, P("data", "model"))
    x = jax.device_put(np.zeros((8, 4), np.float32), sharding)
    assert aot.spec(x).sharding == sharding
    # An uncommitted single-device array does not pin the spec to a device ...
    assert aot.spec(jnp.zeros((2,))).sharding is None
    # ... a committed one does, as with jax.jit.
    device = jax.devices()[3]
    assert aot.spec(jax.device_put(np.zeros(2), device)).sharding == single_device_sharding(device)


def test_python_scalars_become_weakly_typed_scalar_specs():
    # As under jax.jit: a Python number is weakly typed (bool never is).
    assert aot.spec(1.5) == jax.ShapeDtypeStruct((), np.float32, weak_type=True)
    assert aot.spec(3) == jax.ShapeDtypeStruct((), np.int32, weak_type=True)
    assert aot.spec(True) == jax.ShapeDtypeStruct((), np.bool_)
    assert aot.spec(np.float32(1.5)) == jax.ShapeDtypeStruct((), np.float32)


def test_leaf_signature():
    assert leaf_signature([np.zeros((8, 784), np.float32), np.int32(3), 2.0]) == (
        "f32[8,784], i32[], ~f32[]"
    )


# ------------------------------------------------------------------ malformed specs

MALFORMED = [
    # The whole spec, what goes wrong, and where.
    ("float32[1", "malformed spec 'float32[1': this '[' is never closed (column 8: 'float32' >>> '[1'); expected "),
    ("f32[8,", "malformed spec 'f32[8,': this '[' is never closed (column 4: 'f32' >>> '[8,'); expected "),
    ("f32(8)", "malformed spec 'f32(8)': no '[DIMS]' follows the dtype (a scalar is 'f32[]') (column 4: 'f32' >>> '(8)'); expected "),
    ("[8,128]", "malformed spec '[8,128]': it does not start with a dtype (column 1: '' >>> '[8,128]'); expected "),
    ("", "malformed spec '': it is empty; expected "),
    ("f32[8]x", "malformed spec 'f32[8]x': only '@SHARDING' may follow ']' (column 7: 'f32[8]' >>> 'x'); expected "),
    ("f33[8]", "malformed spec 'f33[8]': unknown dtype 'f33' (did you mean f32?); expected [~]DTYPE"),
    ("fp32[8]", "malformed spec 'fp32[8]': unknown dtype 'fp32' (did you mean f32?); expected [~]DTYPE"),
    ("float[8]", "malformed spec 'float[8]': unknown dtype 'float'"),
    ("f32[8,x y]", "malformed spec 'f32[8,x y]': dimension 'x y' is not a non-negative integer or a symbolic dimension expression"),
    ("f32[b-]", "malformed spec 'f32[b-]': dimension 'b-' is not a non-negative integer or a symbolic dimension expression"),
    ("f32[b;1]", "malformed spec 'f32[b;1]': dimension 'b;1' is not a non-negative integer"),
    ("f32[-1]", "malformed spec 'f32[-1]': dimension '-1' is not a non-negative integer"),
    ("f32[8,]", "malformed spec 'f32[8,]': dimension '' is not a non-negative integer"),
    ("f32[2.5]", "malformed spec 'f32[2.5]': dimension '2.5' is not a non-negative integer"),
    ("f32[\u00b2]", "malformed spec 'f32[\u00b2]': dimension '\u00b2' is not a non-negative integer"),
    ("f32[8]@", "malformed spec 'f32[8]@': nothing follows '@'"),
    ("f32[8]@da-ta", "malformed spec 'f32[8]@da-ta': malformed sharding 'da-ta': entry 'da-ta' is not an axis name"),
    ("f32[8]@data,,model,x", "malformed spec 'f32[8]@data,,model,x': sharding has 4 entries for 1 dimensions"),
]


@pytest.mark.parametrize(("text", "fragment"), MALFORMED, ids=[m[0] or "empty" for m in MALFORMED])
def test_malformed_spec_quotes_it_and_shows_the_grammar(mesh, text, fragment):
    with pytest.raises(aot.SpecError) as info:
        aot.spec(text, mesh=mesh)
    message = str(info.value)
    assert fragment in message
    # The grammar, with its examples and the full dtype list, is in every message.
    assert GRAMMAR in message
    assert "DTYPE[DIM,...][@SHARDING], e.g. 'f32[8,128]', 'i32[]' (a scalar)" in message
    assert message.count("c64, c128") == 1  # the dtype list once, not twice


def test_spec_error_is_a_value_error_and_an_aot_error():
    with pytest.raises(ValueError):
        aot.spec("nope")
    with pytest.raises(aot.AotError):
        aot.spec("nope")


def test_sharded_spec_without_a_mesh_says_to_pass_one():
    with pytest.raises(aot.SpecError) as info:
        aot.spec("f32[8,16]@data,None")
    assert str(info.value) == (
        "spec 'f32[8,16]@data,None' names a sharding but no mesh was given; pass mesh= "
        "(or --mesh on the command line)"
    )


def test_sharded_spec_with_an_unknown_axis_names_the_axis(mesh):
    with pytest.raises(aot.SpecError) as info:
        aot.spec("f32[8,16]@batch,None", mesh=mesh)
    assert str(info.value) == (
        "spec 'f32[8,16]@batch,None' names mesh axes ['batch'] that the mesh "
        "{'data': 4, 'model': 2} does not have"
    )


def test_malformed_leaf_inside_a_pytree_is_reported():
    with pytest.raises(aot.SpecError) as info:
        aot.spec({"a": "f32[2]", "b": ["i32[3]", "i32[3.5]"]})
    assert "malformed spec 'i32[3.5]': dimension '3.5'" in str(info.value)


def test_unspeccable_leaf_names_its_type():
    with pytest.raises(aot.SpecError) as info:
        aot.spec({"a": object()})
    assert "cannot make a spec of object" in str(info.value)
    assert GRAMMAR in str(info.value)


# ------------------------------------------------------------------ every dtype JAX has

NARROW = {
    "i2": "int2", "i4": "int4", "u2": "uint2", "u4": "uint4",
    "f8e3m4": "float8_e3m4", "f8e4m3": "float8_e4m3", "f8e4m3b11fnuz": "float8_e4m3b11fnuz",
    "f8e4m3fn": "float8_e4m3fn", "f8e4m3fnuz": "float8_e4m3fnuz", "f8e5m2": "float8_e5m2",
    "f8e5m2fnuz": "float8_e5m2fnuz", "f8e8m0fnu": "float8_e8m0fnu", "f4e2m1fn": "float4_e2m1fn",
}


@pytest.mark.parametrize(("short", "name"), sorted(NARROW.items()))
def test_narrow_dtypes_by_short_and_numpy_name(short, name):
    dtype = np.dtype(getattr(jnp, name))
    assert aot.spec(f"{short}[4,2]") == jax.ShapeDtypeStruct((4, 2), dtype)
    assert aot.spec(f"{name}[3]").dtype == dtype
    assert format_aval((4, 2), dtype) == f"{short}[4,2]"
    assert aot.spec(jnp.zeros(3, dtype)).dtype == dtype


def test_typed_prng_keys_as_spec_strings_and_from_key_arrays():
    keys = jax.random.split(jax.random.key(0))
    struct = aot.spec("key<fry>[2]")
    assert struct.shape == (2,) and struct.dtype == keys.dtype
    assert format_aval(struct.shape, struct.dtype) == "key<fry>[2]"
    assert aot.spec(keys) == struct
    assert aot.spec("key<rbg>[]").dtype == jax.random.key(0, impl="rbg").dtype
    with pytest.raises(aot.SpecError, match="unknown PRNG key type 'key<nope>'"):
        aot.spec("key<nope>[2]")


def test_weak_types_are_written_with_a_tilde():
    assert aot.spec("~f32[]") == jax.ShapeDtypeStruct((), np.float32, weak_type=True)
    assert aot.spec("~i32[]") == aot.spec(3)
    assert format_aval((), np.float32, True) == "~f32[]"
    assert aot.spec(jnp.asarray(2.0)).weak_type  # a weakly typed array stays weak
    with pytest.raises(aot.SpecError, match="only numeric dtypes can be weakly typed"):
        aot.spec("~bool[]")


@pytest.mark.parametrize(
    ("text", "dtype"),
    [("f64[3]", np.float64), ("i64[]", np.int64), ("u64[2,2]", np.uint64), ("c128[1]", np.complex128),
     ("float64[3]", np.float64)],
)
def test_a_64_bit_spec_without_x64_is_refused_with_the_remedy(text, dtype):
    with pytest.raises(aot.SpecError) as info:
        aot.spec(text)
    message = str(info.value)
    assert "jax_enable_x64 is off" in message
    assert 'jax.config.update("jax_enable_x64", True)' in message
    assert "x64 = true" in message and "--x64" in message
    # A ShapeDtypeStruct names its dtype as explicitly: never truncated either.
    with pytest.raises(aot.SpecError, match="jax_enable_x64 is off"):
        aot.spec(jax.ShapeDtypeStruct((3,), dtype))
    jax.config.update("jax_enable_x64", True)  # restored by conftest
    assert aot.spec(text).dtype == np.dtype(dtype)


def test_numpy_examples_follow_jax_jit_canonicalization():
    """A NumPy float64 example is an f32 input with x64 off, as under jax.jit: the user
    did not write that dtype, NumPy chose it."""
    assert aot.spec(np.arange(3.0)) == jax.ShapeDtypeStruct((3,), np.float32)
    assert aot.spec(np.arange(3)) == jax.ShapeDtypeStruct((3,), np.int32)
    jax.config.update("jax_enable_x64", True)
    assert aot.spec(np.arange(3.0)) == jax.ShapeDtypeStruct((3,), np.float64)
