"""Compiled executables: outputs identical to jax.jit, and every bad input refused by path."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aot
from aot.jaxcompat.shardings import single_device_sharding
from tests.aot.helpers import assert_bitwise_equal, block

Batch = collections.namedtuple("Batch", ["x", "mask"])
Out = collections.namedtuple("Out", ["y", "stats"])


def mlp(x, w):
    return jnp.tanh(jnp.sin(x) @ w + 1.0)


def pytree_fn(params, batch, dead, nothing, *, scale):
    h = batch.x
    for layer in params["layers"]:
        h = jnp.tanh(h @ layer["w"] + layer["b"])
    a, k = params["pair"]
    h = h * batch.mask[:, None] * scale + a * k
    return Out(y=h, stats={"sum": h.sum(), "parts": [h.mean(), (h.max(), None)]})


PYTREE_PARAMS = {
    "layers": [{"w": "f32[4,4]", "b": "f32[4]"} for _ in range(3)],
    "pair": ("f32[]", "i32[]"),
}


def pytree_inputs(seed=0):
    rng = np.random.default_rng(seed)
    params = {
        "layers": [
            {"w": rng.standard_normal((4, 4), np.float32), "b": rng.standard_normal(4, np.float32)}
            for _ in range(3)
        ],
        "pair": (np.float32(0.5), np.int32(3)),
    }
    batch = Batch(rng.standard_normal((2, 4), np.float32), np.array([1.0, 0.0], np.float32))
    return params, batch, np.zeros(5, np.float32), None


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((4, 2), ("data", "model"))


@pytest.fixture(scope="module")
def mlp_exe():
    return aot.lower(mlp, "f32[8,16]", "f32[16,4]").compile()


def mlp_inputs():
    rng = np.random.default_rng(1)
    return rng.standard_normal((8, 16), np.float32), rng.standard_normal((16, 4), np.float32)


@pytest.fixture(scope="module")
def pytree_exe():
    return aot.lower(
        pytree_fn, PYTREE_PARAMS, Batch("f32[2,4]", "f32[2]"), "f32[5]", None, scale="f32[]"
    ).compile()


# ------------------------------------------------------------------ running


def test_jit_on_one_device_matches_jax_jit(mlp_exe):
    x, w = mlp_inputs()
    out = mlp_exe(x, w)
    assert isinstance(mlp_exe, aot.MeshExecutable)
    assert out.shape == (8, 4) and out.dtype == np.float32
    assert out.sharding == single_device_sharding(jax.devices()[0])
    assert_bitwise_equal(out, jax.jit(mlp)(x, w))
    # jax.Array inputs work the same as numpy inputs.
    assert_bitwise_equal(mlp_exe(jnp.asarray(x), jnp.asarray(w)), jax.jit(mlp)(x, w))


def test_jit_pinned_to_another_device_runs_there():
    device = jax.devices()[3]
    exe = aot.lower(
        mlp, "f32[8,16]", "f32[16,4]",
        in_shardings=single_device_sharding(device), out_shardings=single_device_sharding(device),
    ).compile()
    x, w = mlp_inputs()
    out = exe(jax.device_put(x, device), jax.device_put(w, device))
    assert out.devices() == {device}
    assert_bitwise_equal(out, jax.jit(mlp)(x, w))
    # A committed input on another device is refused with a placement message.
    with pytest.raises(aot.AvalMismatchError) as info:
        exe(jax.device_put(x, jax.devices()[1]), jax.device_put(w, device))
    assert "inputs match the compiled shapes and dtypes but JAX refused them" in str(info.value)
    assert "jax.device_put(x, sharding)" in str(info.value)


def test_example_array_committed_to_a_device_compiles_for_that_device():
    device = jax.devices()[3]
    x = jax.device_put(np.arange(3, dtype=np.float32), device)
    exe = aot.lower(jnp.sin, x).compile()
    out = exe(x)
    assert out.devices() == {device}
    assert_bitwise_equal(out, jax.jit(jnp.sin)(x))


def test_mesh_4x2_sharded_inputs_and_outputs(mesh):
    comp = aot.lower(
        mlp, "f32[8,16]@data,None", "f32[16,4]@None,model", mesh=mesh, out_shardings="data,model"
    )
    assert comp.in_avals == (
        jax.ShapeDtypeStruct((8, 16), np.float32), jax.ShapeDtypeStruct((16, 4), np.float32)
    )
    exe = comp.compile()
    x_sharding = NamedSharding(mesh, P("data", None))
    w_sharding = NamedSharding(mesh, P(None, "model"))
    x, w = mlp_inputs()
    xs, ws = jax.device_put(x, x_sharding), jax.device_put(w, w_sharding)
    out = block(exe(xs, ws))
    expected_sharding = NamedSharding(mesh, P("data", "model"))
    assert out.sharding.is_equivalent_to(expected_sharding, 2)
    assert out.sharding.spec == P("data", "model")
    assert len(out.addressable_shards) == 8
    assert {s.data.shape for s in out.addressable_shards} == {(2, 2)}
    assert exe.out_avals[0].sharding.spec == P("data", "model")
    reference = jax.jit(mlp, out_shardings=expected_sharding)(xs, ws)
    assert_bitwise_equal(out, reference)
    # Uncommitted numpy inputs are placed on the compiled shardings.
    assert_bitwise_equal(exe(x, w), reference)


def test_mesh_shardings_accept_strings_partition_specs_and_named_shardings(mesh):
    forms = [
        ("data,None", "None,model"),
        (P("data", None), P(None, "model")),
        (NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P(None, "model"))),
    ]
    comps = [
        aot.lower(mlp, "f32[8,16]", "f32[16,4]", mesh=mesh, in_shardings=form)
        for form in forms
    ]
    assert len({c.program_fingerprint.digest for c in comps}) == 1
    exe = comps[0].compile()
    assert [s.spec for s in exe.info.in_shardings] == [P("data", None), P(None, "model")]


def test_mesh_input_with_another_committed_sharding_is_refused(mesh):
    exe = aot.lower(mlp, "f32[8,16]@data,None", "f32[16,4]@None,model", mesh=mesh).compile()
    x, w = mlp_inputs()
    wrong = jax.device_put(x, NamedSharding(mesh, P(None, "model")))
    with pytest.raises(aot.AvalMismatchError) as info:
        exe(wrong, jax.device_put(w, NamedSharding(mesh, P(None, "model"))))
    assert "inputs match the compiled shapes and dtypes but JAX refused them" in str(info.value)


def allreduce(x, w):
    return jax.lax.psum(x * w, "i") + x


def test_pmap_over_8_devices_with_psum():
    comp = aot.lower_pmap(allreduce, "f32[8,3]", "f32[3]", axis_name="i", in_axes=(0, None))
    assert isinstance(comp, aot.PmapComputation) and comp.kind == "pmap"
    exe = comp.compile()
    assert isinstance(exe, aot.PmapExecutable)
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    w = np.array([1.0, -2.0, 0.5], np.float32)
    out = block(exe(x, w))
    assert out.shape == (8, 3)
    assert len(out.sharding.device_set) == 8
    reference = block(jax.pmap(allreduce, axis_name="i", in_axes=(0, None))(x, w))
    assert_bitwise_equal(out, reference)
    # psum really summed across the 8 devices.
    np.testing.assert_allclose(out[0] - x[0], (x * w).sum(axis=0), rtol=1e-6)


def test_pmap_static_broadcasted_arg():
    def power(x, n):
        return jax.lax.pmean(x**n, "i")

    comp = aot.lower_pmap(power, "f32[8]", 3, axis_name="i", static_broadcasted_argnums=1)
    exe = comp.compile()
    x = np.arange(8, dtype=np.float32)
    out = block(exe(x))
    assert_bitwise_equal(out, block(jax.pmap(power, axis_name="i", static_broadcasted_argnums=1)(x, 3)))


def add_and_double(x, y):
    return x + y, x * 2


def test_donated_input_is_deleted_after_the_call():
    comp = aot.lower(add_and_double, "f32[4]", "f32[4]", donate_argnums=0)
    assert comp.donated == (True, False)
    exe = comp.compile()
    x, y = jnp.arange(4.0), jnp.ones(4)
    expected = jax.jit(add_and_double)(x, y)
    out = exe(x, y)
    assert x.is_deleted()
    assert not y.is_deleted()
    assert_bitwise_equal(out, expected)
    with pytest.raises(RuntimeError, match="deleted"):
        np.asarray(x)


def test_pmap_donation():
    def double(x):
        return x * 2

    comp = aot.lower_pmap(double, "f32[8,3]", axis_name="i", donate_argnums=0)
    assert comp.donated == (True,)
    exe = comp.compile()
    # Donation can only reuse an input that already sits on the 8 devices.
    x = jax.device_put(np.arange(24, dtype=np.float32).reshape(8, 3), exe.info.in_shardings[0])
    expected = np.asarray(x) * 2
    out = block(exe(x))
    assert x.is_deleted()
    np.testing.assert_array_equal(out, expected)


def test_without_donation_inputs_survive():
    exe = aot.lower(add_and_double, "f32[4]", "f32[4]").compile()
    x = jnp.arange(4.0)
    exe(x, x)
    assert not x.is_deleted()


def scaled(x, n, *, mode):
    return x * n if mode == "mul" else x + n


def test_static_args_by_position_and_name():
    x = np.arange(3, dtype=np.float32)
    reference = jax.jit(scaled, static_argnums=1, static_argnames="mode")
    results = {}
    for n, mode in [(2, "mul"), (3, "mul"), (2, "add")]:
        comp = aot.lower(scaled, "f32[3]", n, static_argnums=1, static_argnames="mode", mode=mode)
        assert comp.in_avals == (jax.ShapeDtypeStruct((3,), np.float32),)
        exe = comp.compile()
        out = exe(x)  # static values are baked in and not passed again (as with jax AOT)
        assert_bitwise_equal(out, reference(x, n, mode=mode))
        results[(n, mode)] = (comp.program_fingerprint.digest, np.asarray(out).tolist())
    assert len({fp for fp, _ in results.values()}) == 3
    assert len({tuple(o) for _, o in results.values()}) == 3


@pytest.mark.parametrize(
    ("args", "kwargs", "static"),
    [
        (("f32[3]", 4), {}, {"static_argnames": "n"}),  # a static name passed by position
        (("f32[3]",), {"n": 4}, {"static_argnums": 1}),  # a static position passed by name
        (("f32[3]",), {"n": 4}, {"static_argnames": "n"}),
    ],
    ids=["name-by-position", "position-by-name", "name-by-name"],
)
def test_static_positions_and_names_are_inferred_from_each_other(args, kwargs, static):
    def times(x, n):
        return x * n

    comp = aot.lower(times, *args, **kwargs, **static)
    assert comp.in_avals == (jax.ShapeDtypeStruct((3,), np.float32),)  # n is not an input
    out = comp.compile()(np.ones(3, np.float32))
    np.testing.assert_array_equal(out, np.full(3, 4, np.float32))


def test_negative_static_argnum():
    comp = aot.lower(scaled, "f32[3]", 4, static_argnums=-1, mode="mul", static_argnames="mode")
    out = comp.compile()(np.ones(3, np.float32))
    np.testing.assert_array_equal(out, np.full(3, 4, np.float32))


def test_passing_a_static_arg_again_is_refused():
    exe = aot.lower(scaled, "f32[3]", 2, static_argnums=1, static_argnames="mode", mode="mul").compile()
    with pytest.raises(aot.AvalMismatchError) as info:
        exe(np.ones(3, np.float32), 2)
    assert info.value.mismatches == ("expected 1 positional arguments (x), got 2",)


def with_kwargs(x, *, scale, bias=None):
    return x * scale + (0.0 if bias is None else bias)


def test_keyword_arguments():
    comp = aot.lower(with_kwargs, "f32[3]", scale="f32[]", bias="f32[3]")
    exe = comp.compile()
    x = np.arange(3, dtype=np.float32)
    out = exe(x, scale=np.float32(2), bias=x)
    assert_bitwise_equal(out, jax.jit(with_kwargs)(x, scale=np.float32(2), bias=x))
    # A Python scalar is accepted for a scalar of the same kind.
    assert_bitwise_equal(exe(x, scale=2.0, bias=x), out)
    assert [a.path for a in exe.info.args] == ["x", "bias", "scale"]


def test_positional_parameter_given_by_keyword():
    exe = aot.lower(mlp, x="f32[8,16]", w="f32[16,4]").compile()
    x, w = mlp_inputs()
    assert_bitwise_equal(exe(x=x, w=w), jax.jit(mlp)(x, w))
    # By position, as jax.jit takes it: mapped onto the parameter names.
    assert_bitwise_equal(exe(x, w), jax.jit(mlp)(x, w))
    with pytest.raises(aot.AvalMismatchError) as info:
        exe(x, x=x)
    assert info.value.mismatches == (
        "expected 0 positional arguments, got 1",
        "missing keyword argument 'w' (expected f32[16,4])",
    )


def test_pytrees_of_dicts_lists_tuples_namedtuples_and_none(pytree_exe):
    params, batch, dead, nothing = pytree_inputs()
    out = pytree_exe(params, batch, dead, nothing, scale=np.float32(1.5))
    assert type(out) is Out
    assert isinstance(out.stats["parts"], list) and out.stats["parts"][1][1] is None
    reference = jax.jit(pytree_fn)(params, batch, dead, nothing, scale=np.float32(1.5))
    assert_bitwise_equal(out, reference)
    assert [a.path for a in pytree_exe.info.args] == [
        "params['layers'][0]['b']",
        "params['layers'][0]['w']",
        "params['layers'][1]['b']",
        "params['layers'][1]['w']",
        "params['layers'][2]['b']",
        "params['layers'][2]['w']",
        "params['pair'][0]",
        "params['pair'][1]",
        "batch.x",
        "batch.mask",
        "dead",
        "scale",
    ]


def test_unused_argument_is_not_kept_but_must_be_passed(pytree_exe):
    comp = aot.lower(
        pytree_fn, PYTREE_PARAMS, Batch("f32[2,4]", "f32[2]"), "f32[5]", None, scale="f32[]"
    )
    dead_index = [a.path for a in pytree_exe.info.args].index("dead")
    assert dead_index not in comp.kept
    assert comp.kept == frozenset(range(12)) - {dead_index}
    assert [a.kept for a in pytree_exe.info.args] == [i != dead_index for i in range(12)]
    params, batch, dead, nothing = pytree_inputs()
    with pytest.raises(aot.AvalMismatchError) as info:
        pytree_exe(params, batch, np.zeros(6, np.float32), None, scale=np.float32(1))
    assert info.value.mismatches == ("dead: expected f32[5], got f32[6]",)
    with pytest.raises(aot.AvalMismatchError) as info:
        pytree_exe(params, batch, scale=np.float32(1))
    assert info.value.mismatches == (
        "expected 4 positional arguments (params, batch, dead, nothing), got 2",
    )


@pytest.mark.parametrize("x64", [False, True])
def test_x64_on_and_off(x64):
    jax.config.update("jax_enable_x64", x64)

    def fn(x, n):
        return x * n + 1

    float_spec, int_spec = ("f64[3]", "i64[]") if x64 else ("f32[3]", "i32[]")
    comp = aot.lower(fn, float_spec, int_spec)
    assert comp.program_fingerprint.as_dict()["x64"] == str(x64).lower()
    exe = comp.compile()
    x = np.arange(3, dtype=np.float64 if x64 else np.float32)
    n = np.int64(3) if x64 else np.int32(3)
    out = exe(x, n)
    assert out.dtype == (np.float64 if x64 else np.float32)
    assert_bitwise_equal(out, jax.jit(fn)(x, n))
    assert_bitwise_equal(exe(x, 3), out)  # a Python int for the integer scalar
    if x64:
        wrong = x.astype(np.float32)
        with pytest.raises(aot.AvalMismatchError) as info:
            exe(wrong, n)
        assert info.value.mismatches == ("x: expected f64[3], got f32[3]",)
    else:
        # As jax.jit: with x64 off, NumPy's 64-bit arrays are 32-bit inputs.
        wide = x.astype(np.float64), np.int64(3)
        assert_bitwise_equal(exe(*wide), jax.jit(fn)(*wide))
        with pytest.raises(aot.AvalMismatchError) as info:
            exe(x.astype(np.float16), n)
        assert info.value.mismatches == ("x: expected f32[3], got f16[3]",)


def test_closed_over_numpy_constants_work():
    small = np.arange(3, dtype=np.float32)
    big = np.linspace(0, 1, 100_000, dtype=np.float32)

    def fn(x, y):
        return x + small, y * big

    exe = aot.lower(fn, "f32[3]", "f32[100000]").compile()
    x, y = np.ones(3, np.float32), np.full(100_000, 2, np.float32)
    assert_bitwise_equal(exe(x, y), jax.jit(fn)(x, y))


def test_cost_and_memory_analysis(mlp_exe):
    cost = mlp_exe.cost_analysis()
    assert cost["flops"] >= 2 * 8 * 16 * 4  # the matmul alone
    assert cost["transcendentals"] >= 8 * 16  # sin of every input
    memory = mlp_exe.memory_analysis()
    assert memory.argument_size_in_bytes == (8 * 16 + 16 * 4) * 4
    assert memory.output_size_in_bytes == 8 * 4 * 4


# ------------------------------------------------------------------ bad inputs


def test_wrong_dtype_and_shape_exact_message(mlp_exe):
    x, w = mlp_inputs()
    with pytest.raises(aot.AvalMismatchError) as info:
        mlp_exe(x.astype(np.float16), w[:3])
    assert str(info.value) == (
        "tests.aot.test_executable.mlp: inputs do not match the compiled signature "
        "(f32[8,16], f32[16,4]):\n"
        "  x: expected f32[8,16], got f16[8,16]\n"
        "  y: expected f32[16,4], got f32[3,4]\n"
        "Pass inputs of the compiled shapes and dtypes, or compile this signature too."
    ).replace("  y:", "  w:")


def test_aval_mismatch_is_a_type_error(mlp_exe):
    x, w = mlp_inputs()
    with pytest.raises(TypeError):
        mlp_exe(x, w.T)
    with pytest.raises(aot.AotError):
        mlp_exe(x, w.T)


def test_missing_and_extra_positional_arguments(mlp_exe):
    x, w = mlp_inputs()
    with pytest.raises(aot.AvalMismatchError) as info:
        mlp_exe(x)
    assert info.value.mismatches == ("expected 2 positional arguments (x, w), got 1",)
    with pytest.raises(aot.AvalMismatchError) as info:
        mlp_exe(x, w, w)
    assert info.value.mismatches == ("expected 2 positional arguments (x, w), got 3",)
    # The other arguments are still checked.
    with pytest.raises(aot.AvalMismatchError) as info:
        mlp_exe(x.astype(np.int32))
    assert info.value.mismatches == (
        "expected 2 positional arguments (x, w), got 1",
        "x: expected f32[8,16], got i32[8,16]",
    )


def test_missing_and_unexpected_keyword_arguments():
    exe = aot.lower(with_kwargs, "f32[3]", scale="f32[]", bias="f32[3]").compile()
    x = np.zeros(3, np.float32)
    with pytest.raises(aot.AvalMismatchError) as info:
        exe(x, scale=np.float32(2))
    assert info.value.mismatches == ("missing keyword argument 'bias' (expected f32[3])",)
    with pytest.raises(aot.AvalMismatchError) as info:
        exe(x, scale=np.float32(2), bias=x, extra=x)
    assert info.value.mismatches == ("unexpected keyword argument 'extra'",)
    with pytest.raises(aot.AvalMismatchError) as info:
        exe(x, scale=np.ones(2, np.float32), bias=x)
    assert info.value.mismatches == ("scale: expected f32[], got f32[2]",)


def test_wrong_pytree_is_reported_where_it_differs(pytree_exe):
    params, batch, dead, nothing = pytree_inputs()
    bad = {"layers": params["layers"][:2], "pair": params["pair"], "extra": 1}
    with pytest.raises(aot.AvalMismatchError) as info:
        pytree_exe(bad, {"x": batch.x, "mask": batch.mask}, dead, 0.0, scale=np.float32(1))
    assert info.value.mismatches == (
        "params: unexpected keys ['extra']",
        "params['layers']: expected a list of 3 items, got a list of 2 items",
        "batch: expected Batch(x, mask), got a dict with keys ['mask', 'x']",
        "nothing: expected None, got ~f32[] (Python float 0.0)",
    )
    # Shapes are still compared where the structure matches.
    layers = [dict(layer) for layer in params["layers"]]
    layers[2]["w"] = np.zeros((4, 5), np.float32)
    with pytest.raises(aot.AvalMismatchError) as info:
        pytree_exe({"layers": layers, "pair": [0.5, 3]}, batch, dead, None, scale=np.float32(1))
    assert info.value.mismatches == (
        # in pytree order: dict keys sorted
        "params['layers'][2]['w']: expected f32[4,4], got f32[4,5]",
        "params['pair']: expected a tuple of 2 items, got a list of 2 items",
    )


def test_non_array_leaf_is_named(mlp_exe):
    x, _ = mlp_inputs()
    with pytest.raises(aot.AvalMismatchError) as info:
        mlp_exe(x, "weights")
    assert info.value.mismatches == ("w: expected f32[16,4], got str 'weights' (not a JAX type)",)


def test_every_mismatch_is_listed_by_path():
    params = {
        "layers": [{"w1": "f32[256,1024]", "w2": "f32[1024,256]"} for _ in range(4)],
        "scale": "f32[]",
    }

    def forward(params, x):
        for layer in params["layers"]:
            x = jax.nn.relu(x @ layer["w1"]) @ layer["w2"]
        return x * params["scale"]

    exe = aot.lower(forward, params, "f32[8,256]").compile()
    values = {
        "layers": [
            {"w1": np.zeros((256, 1024), np.float32), "w2": np.zeros((1024, 256), np.float32)}
            for _ in range(4)
        ],
        "scale": np.float32(1),
    }
    values["layers"][3]["w1"] = np.zeros((256, 512), np.float32)
    values["layers"][1]["w2"] = np.zeros((1024, 256), np.float16)
    values["scale"] = np.ones(1, np.float32)
    with pytest.raises(aot.AvalMismatchError) as info:
        exe(values, np.zeros((8, 256), np.int32))
    assert info.value.mismatches == (
        "params['layers'][1]['w2']: expected f32[1024,256], got f16[1024,256]",
        "params['layers'][3]['w1']: expected f32[256,1024], got f32[256,512]",
        "params['scale']: expected f32[], got f32[1]",
        "x: expected f32[8,256], got i32[8,256]",
    )
    message = str(info.value)
    assert "\n  params['layers'][3]['w1']: expected f32[256,1024], got f32[256,512]\n" in message
    assert message.endswith(
        "Pass inputs of the compiled shapes and dtypes, or compile this signature too."
    )


def test_executable_identity(mlp_exe):
    assert mlp_exe.name == "tests.aot.test_executable.mlp"
    assert mlp_exe.signature == "f32[8,16], f32[16,4]"
    assert mlp_exe.in_avals == (
        jax.ShapeDtypeStruct((8, 16), np.float32), jax.ShapeDtypeStruct((16, 4), np.float32)
    )
    assert [(a.shape, a.dtype) for a in mlp_exe.out_avals] == [((8, 4), np.float32)]
    assert mlp_exe.key == mlp_exe.fingerprint
    assert len(mlp_exe.key) == 64
    assert repr(mlp_exe).startswith("MeshExecutable('tests.aot.test_executable.mlp', (f32[8,16], f32[16,4])")


# ------------------------------------------------------------------ dtypes, keys, weak types, statics


def _stored_and_loaded(comp, tmp_path):
    from aot.artifact import Artifact
    from aot.build import build_artifact
    from aot.rehydrate import load_executable

    exe = comp.compile()
    build_artifact(exe, comp.portable_hlo(exe)).save(tmp_path)
    return exe, load_executable(Artifact.open(tmp_path))


NARROW = ("int2", "int4", "uint2", "uint4", "float8_e4m3fn", "float8_e5m2", "float8_e4m3b11fnuz",
          "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e3m4", "float8_e4m3", "float8_e8m0fnu",
          "float4_e2m1fn")


def widen(*xs):
    return tuple(x.astype(jnp.float32) * 2 for x in xs), xs[1]


def test_every_narrow_dtype_compiles_stores_loads_and_runs(tmp_path, caplog):
    dtypes = [np.dtype(getattr(jnp, n)) for n in NARROW]
    inputs = [np.array([1, 0, 1, 1], np.float32).astype(d) for d in dtypes]
    comp = aot.lower(widen, *inputs)
    assert comp.signature == ", ".join(
        f"{s}[4]" for s in ("i2", "i4", "u2", "u4", "f8e4m3fn", "f8e5m2", "f8e4m3b11fnuz", "f8e4m3fnuz",
                            "f8e5m2fnuz", "f8e3m4", "f8e4m3", "f8e8m0fnu", "f4e2m1fn")
    )
    exe, loaded = _stored_and_loaded(comp, tmp_path)
    # jax.export has no int2/uint2: the artifact holds the executable alone, and says so.
    assert "without a portable HLO" in caplog.text
    expected = jax.jit(widen)(*inputs)
    assert_bitwise_equal(exe(*inputs), expected)
    assert_bitwise_equal(loaded(*inputs), expected)
    assert loaded.info.args[1].dtype == dtypes[1]


def split_and_draw(key, n):
    keys = jax.random.split(key, n.shape[0])
    return keys, jax.vmap(lambda k: jax.random.normal(k, (2,)))(keys)


def test_typed_keys_in_and_out(tmp_path):
    key = jax.random.key(7)
    comp = aot.lower(split_and_draw, key, "f32[3]")
    assert comp.signature == "key<fry>[], f32[3]"
    exe, loaded = _stored_and_loaded(comp, tmp_path)
    n = np.zeros(3, np.float32)
    expected_keys, expected = jax.jit(split_and_draw)(key, n)
    for run in (exe, loaded):
        keys, draws = run(key, n)
        assert keys.dtype == expected_keys.dtype and keys.shape == (3,)
        assert_bitwise_equal(jax.random.key_data(keys), jax.random.key_data(expected_keys))
        assert_bitwise_equal(draws, expected)
    # Typed keys from a spec string work too.
    assert aot.lower(split_and_draw, "key<fry>[]", "f32[3]").fingerprint == comp.fingerprint


def scale(x, temperature):
    return x * temperature


def test_a_python_scalar_argument_stays_weakly_typed(tmp_path):
    """jax.jit keeps bf16 * python_float in bf16; a strong f32 spec would promote."""
    x = jnp.arange(4, dtype=jnp.bfloat16)
    comp = aot.lower(scale, x, 0.5)
    assert comp.signature == "bf16[4], ~f32[]"
    exe, loaded = _stored_and_loaded(comp, tmp_path)
    expected = jax.jit(scale)(x, 0.5)
    assert expected.dtype == jnp.bfloat16
    assert_bitwise_equal(exe(x, 0.5), expected)
    assert_bitwise_equal(loaded(x, 0.5), expected)
    assert loaded.info.args[1].weak_type
    assert aot.lower(scale, x, "~f32[]").fingerprint == comp.fingerprint
    strong = aot.lower(scale, x, "f32[]")
    assert strong.fingerprint != comp.fingerprint
    assert strong.compile()(x, np.float32(0.5)).dtype == jnp.float32  # as jax.jit would


def with_flag(x, training=False):
    return x * (2.0 if training else 1.0)


def positional(x, n, /):
    return x * n


def keyword_only(x, *, n):
    return x + n


@pytest.mark.parametrize(
    ("fn", "args", "kwargs"),
    [
        (with_flag, ("f32[3]",), {"training": True, "static_argnames": "training"}),
        (with_flag, ("f32[3]", True), {"static_argnames": "training"}),
        (with_flag, ("f32[3]", True), {"static_argnums": 1}),
        (positional, ("f32[3]", 3), {"static_argnums": 1}),
        (keyword_only, ("f32[3]",), {"n": 4, "static_argnames": "n"}),
    ],
    ids=["pos-or-kw by name", "pos-or-kw passed by position", "argnums", "positional-only", "keyword-only"],
)
def test_statics_of_every_parameter_kind_store_and_load(tmp_path, fn, args, kwargs):
    comp = aot.lower(fn, *args, **kwargs)
    exe, loaded = _stored_and_loaded(comp, tmp_path)
    x = np.arange(3, dtype=np.float32)
    static = dict(kwargs)
    static.pop("static_argnames", None)
    static.pop("static_argnums", None)
    expected = fn(x, *args[1:], **static)
    assert_bitwise_equal(exe(x), expected)
    assert_bitwise_equal(loaded(x), expected)
    # Statics are part of the signature (shown after the inputs).
    assert comp.signature == {
        "with_flag": "f32[3], training=True", "positional": "f32[3], n=3", "keyword_only": "f32[3], n=4",
    }[fn.__name__]
