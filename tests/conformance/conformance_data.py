"""The client side of the conformance programs: input types and input builders.

A serving process has its request types and its data, not the model's code. This
module is that side: the pytree types the programs take and return (namedtuples,
dataclasses), the 4x2 mesh, and one deterministic builder per input set, named in
:data:`INPUTS`. Both processes import it; only ``conformance_programs`` (the model
code) is blocked in the serving process. Heavy libraries (flax, optax, equinox) are
imported inside the builders that need them.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Call = tuple[tuple[Any, ...], dict[str, Any]]

# ---------------------------------------------------------------- types

Point = collections.namedtuple("Point", ["x", "y"])


@dataclasses.dataclass
class Batch:
    """A ``register_dataclass`` node: two data fields and a static (meta) field."""

    tokens: Any
    mask: Any
    label: str = "train"


jax.tree_util.register_dataclass(Batch, data_fields=["tokens", "mask"], meta_fields=["label"])


def mesh_4x2() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)


def named(mesh: jax.sharding.Mesh, *spec: Any) -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


# ---------------------------------------------------------------- helpers


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def normal(seed: int, *shape: int, dtype: Any = np.float32) -> np.ndarray:
    return rng(seed).standard_normal(shape).astype(dtype)


def args(*a: Any, **k: Any) -> Call:
    return tuple(a), k


INPUTS: dict[str, Callable[[], Call]] = {}


def builder(name: str | None = None) -> Callable[[Callable[[], Call]], Callable[[], Call]]:
    def register(fn: Callable[[], Call]) -> Callable[[], Call]:
        key = name or fn.__name__
        assert key not in INPUTS, key
        INPUTS[key] = fn
        return fn

    return register


# ---------------------------------------------------------------- plain arrays


@builder()
def x8() -> Call:
    return args(normal(1, 8))


@builder()
def x4x4() -> Call:
    return args(normal(2, 4, 4))


@builder()
def x16x8() -> Call:
    return args(normal(3, 16, 8))


@builder()
def xy() -> Call:
    return args(normal(4, 8, 4), normal(5, 4, 3))


@builder()
def zero_size() -> Call:
    return args(np.zeros((0, 4), np.float32), normal(6, 4))


@builder()
def scalar_array() -> Call:
    return args(normal(7, 5), np.float32(2.5))


# ---------------------------------------------------------------- pytrees


@builder()
def tree_dict() -> Call:
    return args({"w": normal(10, 4, 3), "b": normal(11, 3), "x": normal(12, 2, 4)})


@builder()
def tree_list_tuple() -> Call:
    return args([normal(13, 3), (normal(14, 3), normal(15, 2, 3))])


@builder()
def tree_namedtuple() -> Call:
    return args(Point(normal(16, 5), normal(17, 5)))


@builder()
def tree_none_leaves() -> Call:
    return args({"a": normal(18, 4), "skip": None, "b": (None, normal(19, 4))})


@builder()
def tree_int_keys() -> Call:
    return args({0: normal(20, 3), 1: normal(21, 3), 7: normal(22, 3)})


@builder()
def tree_dataclass() -> Call:
    return args(Batch(np.arange(12, dtype=np.int32).reshape(3, 4), np.ones((3, 4), np.float32)))


@builder()
def tree_empty_containers() -> Call:
    return args(normal(23, 3), (), {}, [])


@builder()
def tree_kwargs() -> Call:
    return args(normal(24, 4), scale=np.float32(3.0), extra={"bias": normal(25, 4), "gain": normal(26, 4)})


@builder()
def tree_var_kwargs() -> Call:
    return args(a=normal(27, 3), b=normal(28, 3), c=normal(29, 3))


# ---------------------------------------------------------------- statics


@builder()
def static_positional() -> Call:
    return args(normal(30, 6), 3)


@builder()
def static_keyword() -> Call:
    return args(normal(31, 6), training=True)


@builder()
def static_keyword_only() -> Call:
    return args(normal(32, 6), mode="double")


@builder()
def static_tuple() -> Call:
    return args(normal(33, 2, 3, 4), (2, 0, 1))


# ---------------------------------------------------------------- dtypes


DTYPE_NAMES = [
    "float16", "bfloat16", "float32", "int8", "int16", "int32", "uint8", "uint16", "uint32",
    "bool", "complex64", "int4", "uint4", "int2", "uint2", "float8_e4m3fn", "float8_e5m2",
    "float8_e4m3b11fnuz", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e3m4", "float8_e4m3",
    "float8_e8m0fnu", "float4_e2m1fn",
]
X64_DTYPE_NAMES = ["float64", "int64", "uint64", "complex128"]


def dtype_input(name: str) -> Callable[[], Call]:
    def build() -> Call:
        dtype = jnp.dtype(name)
        if dtype == np.bool_:
            return args(np.array([True, False, True, True, False, False]))
        if np.issubdtype(dtype, np.complexfloating):
            return args((normal(40, 6) + 1j * normal(41, 6)).astype(dtype))
        if np.issubdtype(dtype, np.integer):
            info = jnp.iinfo(dtype)  # the extremes, and the small numbers between
            return args(np.array([info.min, info.min + 1, 0, 1, info.max - 1, info.max], dtype=dtype))
        return args((np.arange(6, dtype=np.float32) / 4 + 0.25).astype(dtype))

    return build


for _name in DTYPE_NAMES + X64_DTYPE_NAMES:
    INPUTS[f"dtype_{_name}"] = dtype_input(_name)


# ---------------------------------------------------------------- scalars, keys


@builder()
def weak_scalar() -> Call:
    return args(normal(50, 4).astype(jnp.bfloat16), 0.5)


@builder()
def python_int() -> Call:
    return args(normal(51, 3), 3)


@builder()
def typed_key() -> Call:
    return args(jax.random.key(0), normal(52, 3))


@builder()
def raw_key() -> Call:
    return args(np.asarray(jax.random.PRNGKey(7)), normal(53, 3))


# ---------------------------------------------------------------- control flow, math


@builder()
def sequence() -> Call:
    return args(normal(60, 4, 4) * 0.5, normal(61, 10, 4))


@builder()
def int_and_x() -> Call:
    return args(np.int32(5), normal(62, 4))


@builder()
def spd() -> Call:
    a = normal(63, 5, 5)
    return args((a @ a.T + 5 * np.eye(5)).astype(np.float32), normal(64, 5, 2))


@builder()
def square() -> Call:
    return args(normal(65, 5, 5) + 3 * np.eye(5, dtype=np.float32))


@builder()
def tall() -> Call:
    return args(normal(66, 7, 4), normal(67, 7, 2))


@builder()
def signal() -> Call:
    return args(normal(68, 4, 16))


@builder()
def scores() -> Call:
    return args(normal(69, 3, 17))


@builder()
def gather_scatter() -> Call:
    return args(normal(70, 10, 3), np.array([3, 1, 3, 9], np.int32), normal(71, 4, 3))


@builder()
def attention() -> Call:
    return args(normal(72, 2, 6, 4, 8), normal(73, 2, 6, 4, 8), normal(74, 2, 6, 4, 8))


@builder()
def image() -> Call:
    return args(normal(75, 2, 3, 9, 9), normal(76, 4, 3, 3, 3))


# ---------------------------------------------------------------- meshes, pmap


@builder()
def sharded_matmul() -> Call:
    mesh = mesh_4x2()
    x = jax.device_put(normal(80, 16, 8), named(mesh, "data", None))
    w = jax.device_put(normal(81, 8, 4), named(mesh, None, "model"))
    return args(x, w)


@builder()
def sharded_uncommitted() -> Call:
    return args(normal(82, 16, 8), normal(83, 8, 4))


@builder()
def shard_map_input() -> Call:
    mesh = mesh_4x2()
    return args(jax.device_put(normal(84, 8, 6), named(mesh, "data", None)))


@builder()
def pmap_input() -> Call:
    return args(normal(85, 8, 5))


# ---------------------------------------------------------------- symbolic


def batch(n: int, seed: int = 90) -> Callable[[], Call]:
    return lambda: args(normal(seed, n, 16), normal(seed + 1, 16, 4))


INPUTS["batch_3"] = batch(3)
INPUTS["batch_5"] = batch(5)
INPUTS["pair_4"] = lambda: args(normal(92, 8), normal(93, 4))
INPUTS["pair_7"] = lambda: args(normal(94, 14), normal(95, 7))
INPUTS["sharded_rows_8"] = lambda: args(jax.device_put(normal(98, 8, 16), named(mesh_4x2(), "data", None)))
INPUTS["sharded_rows_16"] = lambda: args(jax.device_put(normal(99, 16, 16), named(mesh_4x2(), "data", None)))
INPUTS["rows_and_ids_3"] = lambda: args(normal(100, 3, 8), np.arange(3, dtype=np.int32))
INPUTS["rows_and_ids_6"] = lambda: args(normal(101, 6, 8), np.arange(6, dtype=np.int32))
INPUTS["tokens_2x6"] = lambda: args({"ids": np.arange(12, dtype=np.int32).reshape(2, 6) % 5, "scale": normal(96, 2)})
INPUTS["tokens_3x4"] = lambda: args({"ids": np.arange(12, dtype=np.int32).reshape(3, 4) % 5, "scale": normal(97, 3)})


# ---------------------------------------------------------------- libraries


def mlp_params(sizes: tuple[int, ...] = (6, 8, 3), seed: int = 100) -> dict[str, Any]:
    """Parameters with flax.linen's structure for a stack of ``Dense`` layers."""
    params = {}
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"Dense_{i}"] = {
            "kernel": normal(seed + i, n_in, n_out) / np.float32(np.sqrt(n_in)),
            "bias": normal(seed + 50 + i, n_out) * np.float32(0.1),
        }
    return {"params": params}


@builder()
def linen_mlp() -> Call:
    return args(mlp_params(), normal(110, 4, 6))


@builder()
def linen_train_step() -> Call:
    return args(mlp_params(), normal(111, 4, 6), normal(112, 4, 3))


def nnx_state(seed: int = 120) -> Any:
    from flax import nnx

    return nnx.State({
        "bias": nnx.Param(jnp.asarray(normal(seed, 3) * 0.1)),
        "kernel": nnx.Param(jnp.asarray(normal(seed + 1, 6, 3))),
    })


@builder()
def nnx_linear() -> Call:
    return args(nnx_state(), normal(121, 4, 6))


def optax_tx() -> Any:
    import optax

    return optax.adam(1e-2)


@builder()
def optax_step() -> Call:
    params = {"w": normal(130, 6, 3), "b": np.zeros(3, np.float32)}
    grads = {"w": normal(131, 6, 3), "b": normal(132, 3)}
    return args(params, optax_tx().init(params), grads)


def eqx_linear(seed: int = 140) -> Any:
    import equinox as eqx

    return eqx.nn.Linear(6, 3, key=jax.random.PRNGKey(seed))


@builder()
def ode_y0() -> Call:
    return args(normal(150, 3), np.float32(0.5))


@builder()
def lu_system() -> Call:
    return args(normal(151, 4, 4) + 4.0 * np.eye(4, dtype=np.float32), normal(152, 4))


@builder()
def root_y0() -> Call:
    return args(np.full(3, 1.5, np.float32), np.abs(normal(153, 3)) + 1.0)


@builder()
def eqx_module_in() -> Call:
    return args(eqx_linear(), normal(141, 6))


@builder()
def eqx_module_out() -> Call:
    return args(eqx_linear(), normal(142, 6, 3), normal(143, 3))


@builder()
def train_state() -> Call:
    import optax
    from flax.training import train_state as ts

    params = {"w": normal(150, 6, 3), "b": np.zeros(3, np.float32)}
    state = ts.TrainState.create(apply_fn=None, params=params, tx=optax.sgd(0.1))
    return args(state, normal(151, 4, 6), normal(152, 4, 3))


# ---------------------------------------------------------------- donation, constants


@builder()
def donate_tree() -> Call:
    return args({"w": normal(160, 4, 3), "b": normal(161, 3)}, normal(162, 4, 3))


@builder()
def big_x() -> Call:
    return args(normal(163, 1000, 100))


@builder()
def nothing() -> Call:
    return args()


@builder()
def numpy_float64() -> Call:
    # What np.random.randn and np.linspace give: float64 (jax.jit converts it to f32).
    return args(np.linspace(0.0, 1.0, 6), np.arange(6))
