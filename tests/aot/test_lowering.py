"""aot.lower / aot.lower_pmap: the computations they build, and what they refuse."""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.sharding import NamedSharding, PartitionSpec as P

import aot

Pair = collections.namedtuple("Pair", ["a", "b"])


def affine(x, w, b):
    return x @ w + b


def test_lower_returns_a_mesh_computation():
    comp = aot.lower(affine, "f32[2,3]", "f32[3,4]", "f32[4]")
    assert isinstance(comp, aot.MeshComputation)
    assert comp.kind == "jit"
    assert comp.name == "tests.aot.test_lowering.affine"
    assert comp.arg_names == ("x", "w", "b")
    assert comp.in_avals == tuple(
        jax.ShapeDtypeStruct(s, np.float32) for s in [(2, 3), (3, 4), (4,)]
    )
    assert comp.out_avals == (jax.ShapeDtypeStruct((2, 4), np.float32),)
    assert comp.in_tree == jax.tree_util.tree_structure(((0, 0, 0), {}))
    assert comp.out_tree == jax.tree_util.tree_structure(0)
    assert comp.donated == (False, False, False)
    assert comp.kept == frozenset({0, 1, 2})
    assert comp.signature == "f32[2,3], f32[3,4], f32[4]"
    assert repr(comp) == "MeshComputation('tests.aot.test_lowering.affine', (f32[2,3], f32[3,4], f32[4]))"


def test_as_text_is_stablehlo_without_locations_unless_asked():
    comp = aot.lower(affine, "f32[2,3]", "f32[3,4]", "f32[4]")
    text = comp.as_text()
    assert "stablehlo.dot_general" in text
    assert "tensor<2x3xf32>" in text
    assert "loc(" not in text
    assert "loc(" in comp.as_text(debug_info=True)


def test_explicit_name_and_name_of_a_partial():
    comp = aot.lower(affine, "f32[2,3]", "f32[3,4]", "f32[4]", name="model.affine")
    assert comp.name == "model.affine"
    partial = functools.partial(affine, b=np.zeros(4, np.float32))
    assert aot.lower(partial, "f32[2,3]", "f32[3,4]").name == "tests.aot.test_lowering.affine"


def test_pytree_outputs_have_their_structure():
    def fn(x):
        return {"pair": Pair(x, [x * 2, None]), "n": x.sum()}

    comp = aot.lower(fn, "f32[3]")
    assert comp.out_tree == jax.tree_util.tree_structure({"pair": Pair(0, [0, None]), "n": 0})
    assert [a.shape for a in comp.out_avals] == [(), (3,), (3,)]


def test_pmap_computation_has_global_avals():
    def fn(x):
        return jax.lax.psum(x, "i")

    comp = aot.lower_pmap(fn, "f32[8,5]", axis_name="i")
    assert comp.kind == "pmap"
    assert comp.in_avals == (jax.ShapeDtypeStruct((8, 5), np.float32),)
    assert comp.out_avals == (jax.ShapeDtypeStruct((8, 5), np.float32),)
    assert len(comp.devices) == 8


def test_pmap_on_a_subset_of_devices():
    def fn(x):
        return jax.lax.psum(x, "i")

    devices = jax.devices()[:4]
    comp = aot.lower_pmap(fn, "f32[4,2]", axis_name="i", devices=devices)
    exe = comp.compile()
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    out = jax.block_until_ready(exe(x))
    np.testing.assert_array_equal(out, np.broadcast_to(x.sum(axis=0), (4, 2)))
    assert out.sharding.device_set == set(devices)


def test_sharded_specs_need_a_mesh():
    with pytest.raises(aot.SpecError, match="names a sharding but no mesh was given"):
        aot.lower(affine, "f32[8,3]@data,None", "f32[3,4]", "f32[4]")
    with pytest.raises(aot.SpecError, match="is a PartitionSpec but no mesh was given"):
        aot.lower(affine, "f32[8,3]", "f32[3,4]", "f32[4]", in_shardings=P("data"))


def test_in_shardings_reach_the_computation():
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    comp = aot.lower(
        affine, "f32[8,3]", "f32[3,4]", "f32[4]",
        mesh=mesh, in_shardings=("data,None", None, None), out_shardings=P("data", "model"),
    )
    assert comp.in_shardings[0] == NamedSharding(mesh, P("data", None))
    assert comp.out_shardings[0] == NamedSharding(mesh, P("data", "model"))


# ------------------------------------------------------------------ unsupported


def _print(x):
    jax.debug.print("x = {}", x)
    return x * 2


def _pure(x):
    return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def _io(x):
    return io_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def _io_ordered(x):
    return io_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x, ordered=True)


def _nested_in_cond(x):
    return jax.lax.cond(x[0] > 0, _pure, lambda y: y, x)


def _nested_in_scan(x):
    def body(carry, row):
        jax.debug.print("row {}", row)
        return carry + row, None

    return jax.lax.scan(body, jnp.zeros(()), x)[0]


@pytest.mark.parametrize(
    ("fn", "primitive", "what"),
    [
        (_print, "debug_print", "jax.debug.print"),
        (_pure, "pure_callback", "jax.pure_callback"),
        (_io, "io_callback", "jax.experimental.io_callback"),
        (_io_ordered, "io_callback", "jax.experimental.io_callback"),
        (_nested_in_cond, "pure_callback", "jax.pure_callback"),
        (_nested_in_scan, "debug_print", "jax.debug.print"),
    ],
    ids=["debug.print", "pure_callback", "io_callback", "io_callback-ordered", "in-cond", "in-scan"],
)
def test_host_callbacks_are_refused_at_lowering(fn, primitive, what):
    with pytest.raises(aot.UnsupportedComputationError) as info:
        aot.lower(fn, "f32[3]")
    message = str(info.value)
    assert message.startswith(f"tests.aot.test_lowering.{fn.__name__}: uses primitive {primitive!r} ({what})")
    assert "calls back into the Python host" in message
    assert "before compiling ahead of time" in message


def test_host_callbacks_are_refused_under_pmap():
    def fn(x):
        jax.debug.print("{}", x)
        return jax.lax.psum(x, "i")

    with pytest.raises(aot.UnsupportedComputationError, match="'debug_print'"):
        aot.lower_pmap(fn, "f32[8]", axis_name="i")


def test_the_same_function_without_callbacks_lowers():
    # The refusal is about the primitive, not the function's shape: control case.
    comp = aot.lower(lambda x: jax.lax.cond(x[0] > 0, jnp.sin, lambda y: y, x), "f32[3]")
    out = comp.compile()(np.ones(3, np.float32))
    np.testing.assert_array_equal(out, jnp.sin(np.ones(3, np.float32)))


def test_pmap_axis_longer_than_the_devices_is_refused_with_the_fix():
    with pytest.raises(aot.UnsupportedComputationError) as info:
        aot.lower_pmap(lambda x: jax.lax.psum(x, "i"), "f32[8,4]", axis_name="i",
                       devices=jax.devices()[:2])
    message = str(info.value)
    assert "axis 0 of size 8" in message and "only 2 device(s)" in message
    assert "--xla_force_host_platform_device_count=8" in message


def test_a_prejitted_function_keeps_its_static_and_donated_arguments() -> None:
    def scaled(x, n):  # noqa: ANN001, ANN202
        return x * n + 1.0

    jitted = jax.jit(scaled, static_argnums=1, donate_argnums=0)
    exe = aot.lower(jitted, "f32[4]", 3).compile()
    x, x_jit = jnp.arange(4.0), jnp.arange(4.0)
    out, want = exe(x), jitted(x_jit, 3)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    assert out.dtype == want.dtype and x.is_deleted() and x_jit.is_deleted()
