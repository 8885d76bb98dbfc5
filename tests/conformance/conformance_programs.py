"""The conformance programs: the model code, and its registry (name -> program).

This module stands for the model's code: the serving process of the conformance
suite cannot import it (a ``sys.meta_path`` blocker raises on the import). Each
:class:`Program` names its function, the input builder of ``conformance_data`` it is
compiled and served with, and its options (statics, donation, mesh, pmap, x64, ...).
Programs that fail today because of a known open item carry ``xfail`` (strict: an
unexpected pass fails the suite, so no mark stays by accident).

Modelled on JAX's own tests/export_test.py and tests/aot_test.py: pytrees (dict,
namedtuple, int keys, custom nodes), statics, kwargs, donation, every dtype, PRNG
keys, control flow, autodiff, linalg, shardings, pmap, shard_map, closed-over
constants, shape polymorphism.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

try:  # the harness's processes have tests/conformance on PYTHONPATH (the model is a top-level module there)
    import conformance_data as data
except ImportError:  # the test process imports the package
    from tests.conformance import conformance_data as data

# ---------------------------------------------------------------- the registry


@dataclasses.dataclass(frozen=True)
class Program:
    """One conformance program and how to compile and serve it."""

    name: str
    fn: Callable[..., Any]
    inputs: str  # a builder of conformance_data.INPUTS: compile specs and reference inputs
    serve: tuple[str, ...] = ()  # builders of the serving calls; () means (inputs,)
    specs: Callable[[], data.Call] | None = None  # specs for aot.lower instead of the inputs
    static_argnums: tuple[int, ...] = ()
    static_argnames: tuple[str, ...] = ()
    donate_argnums: tuple[int, ...] = ()
    mesh: bool = False  # lowered on conformance_data.mesh_4x2()
    in_shardings: Any = None  # PartitionSpecs (with mesh=True)
    out_shardings: Any = None
    pmap_axis: str | None = None  # lowered with aot.lower_pmap(axis_name=...)
    refuse: str | None = None  # the AotError class aot.lower must raise
    run_first: bool = False  # jax.jit runs it in the compiling process before it is stored
    x64: bool = False
    group: str = "main"  # programs of one group are served by one process
    xfail: str | None = None  # "issue 11: ..." while a known item is open

    @property
    def serve_inputs(self) -> tuple[str, ...]:
        return self.serve or (self.inputs,)


REGISTRY: dict[str, Program] = {}


def program(name: str | None = None, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        key = name or fn.__name__
        assert key not in REGISTRY, key
        assert options.get("inputs", key) in data.INPUTS, options.get("inputs", key)
        REGISTRY[key] = Program(key, fn, **{"inputs": key, **options})
        return fn

    return register


# ---------------------------------------------------------------- basics


@program(inputs="x8")
def elementwise(x):
    return jnp.sin(x) * 2 + 1


@program(inputs="xy")
def matmul(x, w):
    return jnp.tanh(x @ w)


@program(inputs="x8")
def two_outputs_same_array(x):
    # JAX's output aliasing: one value returned twice, and an input returned as is.
    y = x * 3
    return y, y, x


@program(inputs="zero_size")
def zero_size_arrays(empty, v):
    return empty * 2, empty.sum(axis=0) + v, jnp.zeros((0,), jnp.int32)


@program(inputs="scalar_array")
def scalar_array_input(x, s):
    return x * s, s * s


@program(inputs="nothing")
def no_arguments():
    return jnp.arange(5.0) * 2


@program(inputs="xy")
def unused_argument(x, unused):
    return jnp.cos(x)


# ---------------------------------------------------------------- pytrees


@program(inputs="tree_dict")
def pytree_dict(tree):
    return {"y": tree["x"] @ tree["w"] + tree["b"], "n": jnp.sum(tree["b"])}


@program(inputs="tree_list_tuple")
def pytree_list_tuple(items):
    a, (b, c) = items
    return (a + b, [c * 2, (a - b,)])


@program(inputs="tree_namedtuple")
def pytree_namedtuple(p):
    return data.Point(p.x + p.y, p.x * p.y)


@program(inputs="tree_none_leaves")
def pytree_none_leaves(tree):
    return {"sum": tree["a"] + tree["b"][1], "nothing": None, "pair": (None, tree["a"])}


@program(inputs="tree_int_keys")
def pytree_int_keys(tree):
    return {k: v * k for k, v in tree.items()}


@program(inputs="tree_dataclass")
def pytree_register_dataclass(batch):
    return data.Batch(batch.tokens * 2, batch.mask + 1, batch.label)


@program(inputs="tree_empty_containers")
def pytree_empty_containers(x, empty_tuple, empty_dict, empty_list):
    return x + 1, (), {"e": empty_dict}


@program(inputs="tree_kwargs")
def keyword_arguments(x, *, scale, extra):
    return x * scale + extra["bias"] * extra["gain"]


@program(inputs="tree_var_kwargs")
def var_keyword_arguments(**kwargs):
    return {k: v * 2 for k, v in kwargs.items()}


# ---------------------------------------------------------------- statics


@program(inputs="static_positional", static_argnums=(1,))
def static_positional_argument(x, n):
    return jnp.tile(x, n)


def _positional_only(x, n, /):
    return x[:n] * n


program("static_positional_only", inputs="static_positional", static_argnums=(1,))(_positional_only)


@program(inputs="static_keyword", static_argnames=("training",))
def static_keyword_argument(x, training=False):
    return x * 0.5 if training else x


@program(inputs="static_keyword_only", static_argnames=("mode",))
def static_keyword_only(x, *, mode):
    return x * 2 if mode == "double" else x


@program(inputs="static_tuple", static_argnums=(1,))
def static_hashable_tuple(x, perm):
    return jnp.transpose(x, perm)


# ---------------------------------------------------------------- donation


@program(inputs="x16x8", donate_argnums=(0,))
def donate_aliased(x):
    return x * 2 + 1


@program(inputs="donate_tree", donate_argnums=(0,))
def donate_pytree(params, grads):
    return {"w": params["w"] - 0.1 * grads, "b": params["b"] * 0.9}


@program(inputs="xy", donate_argnums=(0, 1))
def donate_unusable(x, w):
    return (x @ w).sum()  # no output matches: JAX keeps the inputs alive


# ---------------------------------------------------------------- dtypes


def _dtype_program(name: str) -> Callable[..., Any]:
    def fn(x):
        if x.dtype == jnp.bool_:
            return x, ~x, x.astype(jnp.int32)
        if jnp.issubdtype(x.dtype, jnp.complexfloating):
            return x, x * 2, jnp.abs(x)
        widened = x.astype(jnp.float32)
        return x, widened * 2, (widened + 1).astype(x.dtype)

    fn.__name__ = fn.__qualname__ = f"dtype_{name}"
    return fn


for _name in data.DTYPE_NAMES:
    program(f"dtype_{_name}")(_dtype_program(_name))
for _name in data.X64_DTYPE_NAMES:
    program(f"dtype_{_name}", x64=True)(_dtype_program(_name))


@program(inputs="xy", x64=True)
def x64_float64_math(x, w):
    return (x.astype(jnp.float64) @ w.astype(jnp.float64)) * np.float64(1 / 3), jnp.arange(3)


# ---------------------------------------------------------------- scalars and weak types


@program(inputs="weak_scalar")
def weak_python_float(x, temperature):
    return x * temperature  # jax.jit keeps bf16: the Python float is weakly typed


@program(inputs="python_int")
def python_int_argument(x, n):
    return x * n, n + 1


@program(inputs="x8")
def weak_typed_output(x):
    return x.sum(), 2.0 * jnp.ones(()), jnp.asarray(3)


# ---------------------------------------------------------------- PRNG keys


@program(inputs="typed_key")
def typed_prng_key(key, x):
    k1, k2 = jax.random.split(key)
    return jax.random.normal(k1, x.shape) + x, k2


@program(inputs="raw_key")
def raw_prng_key(key, x):
    k1, k2 = jax.random.split(key)
    return jax.random.uniform(k1, x.shape) * x, k2


# ---------------------------------------------------------------- control flow


@program(inputs="sequence")
def lax_scan(w, xs):
    def cell(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h.sum()

    return jax.lax.scan(cell, jnp.zeros(4), xs)


@program(inputs="int_and_x")
def lax_while_loop(n, x):
    def body(state):
        i, acc = state
        return i + 1, acc * 1.5 + i

    return jax.lax.while_loop(lambda s: s[0] < n, body, (0, x))


@program(inputs="int_and_x")
def lax_cond(n, x):
    return jax.lax.cond(n > 3, lambda v: v * 2, lambda v: -v, x)


@program(inputs="int_and_x")
def lax_fori_loop(n, x):
    return jax.lax.fori_loop(0, n, lambda i, acc: acc + jnp.sin(acc) * i, x)


@program(inputs="int_and_x")
def lax_switch(n, x):
    return jax.lax.switch(n % 3, [jnp.sin, jnp.cos, jnp.tanh], x)


# ---------------------------------------------------------------- autodiff


@jax.custom_vjp
def _clip_gradient(x):
    return x


_clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))


@program(inputs="x8")
def custom_vjp(x):
    return jax.grad(lambda v: jnp.sum(_clip_gradient(v) ** 3))(x)


@jax.custom_jvp
def _softplus(x):
    return jnp.log1p(jnp.exp(x))


_softplus.defjvp(lambda primals, tangents: (_softplus(primals[0]), jax.nn.sigmoid(primals[0]) * tangents[0]))


@program(inputs="x8")
def custom_jvp(x):
    return _softplus(x), jax.jvp(_softplus, (x,), (jnp.ones_like(x),))[1]


@program(inputs="xy")
def grad_and_value(x, w):
    return jax.value_and_grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)


@program(inputs="xy")
def vmap_per_example(x, w):
    return jax.vmap(lambda row: jnp.tanh(row @ w).sum())(x)


@program(inputs="xy")
def remat_checkpoint(x, w):
    layer = jax.checkpoint(lambda v: jnp.sin(v @ w) @ w.T)
    return jax.grad(lambda v: jnp.sum(layer(layer(v))))(x)


@program(inputs="xy")
def hessian_vector_product(x, w):
    f = lambda w: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731
    return jax.jvp(jax.grad(f), (w,), (jnp.ones_like(w),))[1]


# ---------------------------------------------------------------- linalg (LAPACK)


def _linalg(name: str, inputs: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return program(name, inputs=inputs, group="lapack")


_linalg("linalg_solve", "spd")(lambda a, b: jnp.linalg.solve(a, b))
_linalg("linalg_cholesky", "spd")(lambda a, b: jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(a), b))
_linalg("linalg_eigh", "spd")(lambda a, b: jnp.linalg.eigh(a))
_linalg("linalg_svd", "tall")(lambda a, b: jnp.linalg.svd(a, full_matrices=False))
_linalg("linalg_qr", "tall")(lambda a, b: jnp.linalg.qr(a))
_linalg("linalg_inv", "square")(lambda a: jnp.linalg.inv(a))
_linalg("linalg_slogdet", "square")(lambda a: jnp.linalg.slogdet(a))
_linalg("linalg_eig", "square")(lambda a: jnp.linalg.eig(a))
_linalg("linalg_lstsq", "tall")(lambda a, b: jnp.linalg.lstsq(a, b)[0])
_linalg("linalg_det_and_pinv", "tall")(lambda a, b: (jnp.linalg.pinv(a), jnp.linalg.det(a.T @ a)))


# ---------------------------------------------------------------- FFT, sorting, indexing


@program(inputs="signal")
def fft_complex(x):
    return jnp.fft.fft(x), jnp.fft.ifft(jnp.fft.fft(x)).real


@program(inputs="signal")
def fft_real(x):
    return jnp.fft.irfft(jnp.fft.rfft(x) * 0.5, n=16), jnp.fft.fft2(x)


@program(inputs="scores")
def sort_and_argsort(x):
    return jnp.sort(x, axis=-1), jnp.argsort(x, axis=0), jnp.sort(x.ravel())[::-1]


@program(inputs="scores")
def top_k(x):
    return jax.lax.top_k(x, 4)


@program(inputs="scores", run_first=True)
def sort_stored_after_running(x):
    return jnp.sort(x, axis=0), jnp.argmax(x, axis=1)


@program(inputs="numpy_float64")
def numpy_float64_inputs(x, i):
    return x * 2, i + 1


@program(inputs="gather_scatter")
def gather(table, idx, updates):
    return table[idx], jnp.take_along_axis(table, jnp.argsort(table, axis=0), axis=0)


@program(inputs="gather_scatter")
def scatter_add(table, idx, updates):
    return table.at[idx].add(updates), table.at[idx].set(0.0), table.at[idx].max(updates)


# ---------------------------------------------------------------- networks


@program(inputs="attention")
def attention_softmax(q, k, v):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


@program(inputs="attention")
def attention_dot_product(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True)


@program(inputs="image")
def convolution(images, kernels):
    out = jax.lax.conv_general_dilated(images, kernels, (1, 1), "SAME")
    return jax.nn.relu(out), jax.lax.reduce_window(out, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


_CONST = np.linspace(-1.0, 1.0, 100_000, dtype=np.float32).reshape(1000, 100)
_CONST_DEVICE = jnp.asarray(_CONST * 2)


@program(inputs="big_x")
def closure_over_large_constants(x):
    return x * _CONST + _CONST_DEVICE, jnp.sum(_CONST_DEVICE)


# ---------------------------------------------------------------- meshes, pmap, shard_map


@program(inputs="sharded_matmul", mesh=True)
def mesh_committed_inputs(x, w):
    return jnp.tanh(x @ w)


@program(
    inputs="sharded_uncommitted", mesh=True,
    in_shardings=(P("data", None), P(None, "model")), out_shardings=P("data", "model"),
)
def mesh_declared_shardings(x, w):
    return jax.nn.relu(x @ w)


def _ring(x):
    axis = "data"
    n = jax.lax.axis_size(axis)
    shifted = jax.lax.ppermute(x, axis, [(i, (i + 1) % n) for i in range(n)])
    return shifted + jax.lax.psum(x, axis)


@program(inputs="shard_map_input", mesh=True)
def shard_map_collectives(x):
    mesh = data.mesh_4x2()
    return jax.shard_map(_ring, mesh=mesh, in_specs=P("data", None), out_specs=P("data", None))(x)


@program(inputs="pmap_input", pmap_axis="i")
def pmap_psum(x):
    return x - jax.lax.pmean(x, "i"), jax.lax.psum(x, "i")


# ---------------------------------------------------------------- symbolic shapes


@program(
    inputs="batch_3", serve=("batch_3", "batch_5"),
    specs=lambda: data.args("f32[b,16]", "f32[16,4]"),
)
def symbolic_batch(x, w):
    return jax.nn.softmax(x @ w, axis=-1), (x @ w).sum(axis=0)


@program(
    inputs="pair_4", serve=("pair_4", "pair_7"),
    specs=lambda: data.args("f32[2*n]", "f32[n]"),
)
def symbolic_expression(x, y):
    return x.reshape(2, -1).sum(axis=0) * y, jnp.concatenate([x, y])


@program(
    inputs="tokens_2x6", serve=("tokens_2x6", "tokens_3x4"),
    specs=lambda: data.args({"ids": "i32[b,s]", "scale": "f32[b]"}),
)
def symbolic_pytree_two_dims(batch):
    onehot = jax.nn.one_hot(batch["ids"], 5)
    return {"counts": onehot.sum(axis=1) * batch["scale"][:, None], "length": batch["ids"].shape[1] * jnp.ones(())}


@program(
    inputs="sharded_rows_8", serve=("sharded_rows_8", "sharded_rows_16"), mesh=True,
    specs=lambda: data.args(aot_spec("f32[4*b,16]@data,None", mesh=data.mesh_4x2())),
)
def symbolic_sharded_rows(x):
    return jnp.tanh(x) * 2, x.sum(axis=1)


def _export_struct_specs() -> data.Call:
    shape = jax.export.symbolic_shape("b, 8", constraints=["b >= 2"])
    return data.args(jax.ShapeDtypeStruct(shape, np.float32), aot_spec("i32[b]"))


@program(inputs="rows_and_ids_3", serve=("rows_and_ids_3", "rows_and_ids_6"), specs=_export_struct_specs)
def symbolic_jax_export_structs(x, ids):
    return x * ids[:, None].astype(x.dtype), jnp.cumsum(x, axis=0)


def aot_spec(text: str, **kwargs: Any) -> Any:
    import aot

    return aot.spec(text, **kwargs)


# ---------------------------------------------------------------- libraries


def _linen_mlp() -> Any:
    from flax import linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Dense(8)(x))
            return nn.Dense(3)(x)

    return MLP()


@program(inputs="linen_mlp")
def flax_linen_apply(params, x):
    return _linen_mlp().apply(params, x)


@program(inputs="linen_train_step")
def flax_linen_train_step(params, x, y):
    def loss(p):
        return jnp.mean((_linen_mlp().apply(p, x) - y) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), value


@functools.cache
def _nnx_graphdef() -> Any:
    from flax import nnx

    abstract = nnx.eval_shape(lambda: nnx.Linear(6, 3, rngs=nnx.Rngs(0)))
    return nnx.split(abstract)[0]


@program(inputs="nnx_linear")
def flax_nnx_apply(state, x):
    from flax import nnx

    return nnx.merge(_nnx_graphdef(), state)(x)


@program(inputs="nnx_linear")
def flax_nnx_state_out(state, x):
    from flax import nnx

    model = nnx.merge(_nnx_graphdef(), state)
    grads = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model)
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, state, nnx.state(grads, nnx.Param))


@functools.cache
def _tx() -> Any:
    return data.optax_tx()


@program(inputs="optax_step")
def optax_adam_update(params, opt_state, grads):
    import optax

    updates, opt_state = _tx().update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


@program(inputs="eqx_module_in")
def equinox_module_in(model, x):
    return model(x)


@program(inputs="eqx_module_out")
def equinox_module_out(model, g_w, g_b):
    import equinox as eqx

    return eqx.tree_at(lambda m: (m.weight, m.bias), model, (model.weight - 0.1 * g_w.T, model.bias - g_b))


@program(inputs="train_state")
def flax_train_state_step(state, x, y):
    def loss(params):
        return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)

    return state.apply_gradients(grads=jax.grad(loss)(state.params))


# ---------------------------------------------------------------- library host callbacks
# Equinox's runtime checks (eqx.error_if) are pure callbacks into equinox._errors; with
# their default throw=True, diffrax, lineax and optimistix call them (aot.callbacks).


@program(inputs="x8")
def equinox_error_if(x):
    import equinox as eqx

    return eqx.error_if(x * 2.0, jnp.any(x > 100.0), "x must stay below 100") + 1.0


@program(inputs="ode_y0")
def diffrax_ode_default(y0, k):
    import diffrax

    term = diffrax.ODETerm(lambda t, y, args: -args * y)
    sol = diffrax.diffeqsolve(term, diffrax.Tsit5(), t0=0.0, t1=1.0, dt0=0.1, y0=y0, args=k)
    return sol.ys


@program(inputs="lu_system", group="lapack")
def lineax_lu_default(a, b):
    import lineax as lx

    return lx.linear_solve(lx.MatrixLinearOperator(a), b, lx.LU()).value


@program(inputs="root_y0", group="lapack")
def optimistix_newton_default(y0, c):
    import optimistix as optx

    solver = optx.Newton(rtol=1e-5, atol=1e-5)
    return optx.root_find(lambda y, c: y**3 - c, solver, y0, args=c).value


# ---------------------------------------------------------------- refused at lowering


@program(inputs="x8", refuse="UnsupportedComputationError")
def host_debug_print(x):
    jax.debug.print("x = {}", x)
    return x * 2


@program(inputs="x8", refuse="UnsupportedComputationError")
def host_pure_callback(x):
    return jax.pure_callback(lambda v: np.sin(v), jax.ShapeDtypeStruct(x.shape, x.dtype), x)


@program(inputs="x8", refuse="UnsupportedComputationError")
def host_io_callback(x):
    from jax.experimental import io_callback

    return io_callback(lambda v: v * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x, ordered=True)
