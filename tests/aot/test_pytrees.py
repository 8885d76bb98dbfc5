"""Pytree nodes whose auxiliary data is not JSON: Equinox modules (a MISSING sentinel),
Flax TrainState (a bound apply_fn and Optax closures), Flax NNX State/Param, checkify
errors (tracebacks and treedefs), register_dataclass types.

Their structures are identified by a digest that is the same in every process, stored
without pickle, matched against a caller's own structure and rebuilt when the process
has what it takes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen, nnx
from flax.training import train_state
from jax.experimental import checkify

import aot
from aot import treedef as treedefs
from aot.artifact import Artifact
from aot.build import build_artifact
from aot.rehydrate import load_executable
from tests.aot.helpers import assert_bitwise_equal


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Batch:
    x: jax.Array
    y: jax.Array
    scale: float = dataclasses.field(default=2.0, metadata={"static": True})


def _checkified(x):
    checkify.check(jnp.all(x > 0), "x must be positive, got {v}", v=x.min())
    return jnp.log(x)


def trees() -> dict[str, object]:
    """Real objects of each library (built the same way in every process)."""
    key = jax.random.key(0)
    dense = linen.Dense(3)
    params = dense.init(key, jnp.ones((1, 2)))
    _, state = nnx.split(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))
    err, _ = checkify.checkify(_checkified)(jnp.array([1.0, 2.0]))
    return {
        "eqx_linear": eqx.nn.Linear(2, 3, key=key),
        "eqx_mlp_arrays": eqx.partition(eqx.nn.MLP(2, 1, 4, 2, key=key), eqx.is_array)[0],
        "train_state": train_state.TrainState.create(apply_fn=dense.apply, params=params, tx=optax.adam(1e-3)),
        "nnx_state": state,
        "checkify_error": err,
        "dataclass": Batch(jnp.ones(2), jnp.zeros(2)),
    }


def test_every_structure_is_described_in_plain_json_without_addresses():
    for name, tree in trees().items():
        treedef = jax.tree_util.tree_structure(tree)
        data = treedefs.to_json(treedef)
        text = json.dumps(data)
        assert "0x" not in text, name
        assert treedefs.structure_key_of_json(json.loads(text)) == treedefs.structure_key(treedef), name


def test_nodes_that_round_trip_are_rebuilt_from_json_alone():
    built = trees()
    for name in ("eqx_linear", "eqx_mlp_arrays", "nnx_state", "dataclass"):
        treedef = jax.tree_util.tree_structure(built[name])
        assert treedefs.from_json(json.loads(json.dumps(treedefs.to_json(treedef)))) == treedef, name
    # Equinox's MISSING sentinel is recorded as the module attribute that holds it.
    linear = treedefs.to_json(jax.tree_util.tree_structure(built["eqx_linear"]))
    assert {"$": "const", "v": "equinox._module._flatten:MISSING"} in linear["aux"]["v"]


def test_a_checkify_error_is_rebuilt_and_still_reports():
    err, _ = checkify.checkify(_checkified)(jnp.array([1.0, -2.0]))
    treedef = jax.tree_util.tree_structure(err)
    data = json.loads(json.dumps(treedefs.to_json(treedef)))
    assert "aux" in data  # its traceback is recorded by type: a fresh one stands in
    rebuilt = jax.tree_util.tree_unflatten(treedefs.from_json(data), jax.tree_util.tree_leaves(err))
    assert rebuilt.get() == err.get() == "x must be positive, got -2.0 (`check` failed)"


def test_a_train_state_is_identified_by_what_its_closures_hold():
    """apply_fn and the optimizer's closures do not round-trip; their description does,
    the learning rate inside Optax's closures included."""
    dense = linen.Dense(3)
    params = dense.init(jax.random.key(0), jnp.ones((1, 2)))

    def make(lr, features=3, fn=None):
        model = linen.Dense(features)
        return train_state.TrainState.create(apply_fn=fn or model.apply, params=params, tx=optax.adam(lr))

    key = treedefs.structure_key
    tree = jax.tree_util.tree_structure
    assert key(tree(make(1e-3))) == key(tree(make(1e-3)))  # new objects, same identity
    assert key(tree(make(1e-3))) != key(tree(make(1e-4)))  # another learning rate
    assert key(tree(make(1e-3))) != key(tree(make(1e-3, features=4)))  # another model
    data = treedefs.to_json(tree(make(1e-3)))
    assert data["type"] == "flax.training.train_state:TrainState" and "aux" not in data
    with pytest.raises(aot.PytreeNodeError, match="auxiliary data was not stored"):
        treedefs.from_json(data)
    # The caller's own node of the same digest rebuilds it.
    live = tree(make(1e-3))
    assert treedefs.from_json(data, nodes=treedefs.node_table(live)) == live


_DIGESTS = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import jax
    from tests.aot import test_pytrees
    from aot import treedef as treedefs
    print(json.dumps({
        name: treedefs.structure_key(jax.tree_util.tree_structure(tree))
        for name, tree in test_pytrees.trees().items() if name != "checkify_error"
    }))
    """
)


@pytest.mark.slow
def test_digests_are_the_same_in_another_process():
    # Not checkify's error: its auxiliary data holds an error code that JAX counts up
    # with every check it traces in a process (jax.jit sees another structure too).
    here = {
        name: treedefs.structure_key(jax.tree_util.tree_structure(tree))
        for name, tree in trees().items() if name != "checkify_error"
    }
    assert len(here) == 5
    env = dict(os.environ, PYTHONHASHSEED="123")  # another hash seed, other addresses
    proc = subprocess.run(
        # The repository's root: the classes are named by the same module path here.
        [sys.executable, "-c", _DIGESTS, str(Path(__file__).resolve().parents[2])],
        capture_output=True, text=True, env=env, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == here


# ------------------------------------------------------------------ specs


def test_nnx_variables_are_nodes_not_leaves():
    """NNX Param has .shape and .dtype but is a pytree node whose child is the array."""
    _, state = nnx.split(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))
    specs = aot.spec(state)
    assert jax.tree_util.tree_structure(specs) == jax.tree_util.tree_structure(state)
    assert [(s.shape, s.dtype) for s in jax.tree_util.tree_leaves(specs)] == [
        ((3,), np.float32), ((2, 3), np.float32)
    ]


# ------------------------------------------------------------------ programs


def eqx_step(model, x):
    """A module in, a module out (same structure) and an array out."""
    y = jax.vmap(model)(x)
    return jax.tree_util.tree_map(lambda p: p * 0.5, model), y


def flax_step(state, x):
    def loss(params):
        return jnp.mean(state.apply_fn(params, x) ** 2)

    value, grads = jax.value_and_grad(loss)(state.params)
    return state.apply_gradients(grads=grads), value


def nnx_step(state, x):
    new = jax.tree_util.tree_map(lambda p: p + 1.0, state)
    return new, x @ state["kernel"][...] + state["bias"][...]


def dataclass_step(batch):
    return Batch(batch.x * batch.scale, batch.y + 1.0), batch.x.sum()


def _program_inputs():
    built = trees()
    return {
        "eqx": (eqx_step, (built["eqx_linear"], jnp.ones((4, 2)))),
        "flax": (flax_step, (built["train_state"], jnp.ones((4, 2)))),
        "nnx": (nnx_step, (built["nnx_state"], jnp.ones((4, 2)))),
        "checkify": (checkify.checkify(_checkified), (jnp.array([1.0, -2.0, 3.0]),)),
        "dataclass": (dataclass_step, (built["dataclass"],)),
    }


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    out = {}
    for name, (fn, args) in _program_inputs().items():
        comp = aot.lower(fn, *args, name=name)
        exe = comp.compile()
        folder = tmp_path_factory.mktemp(name)
        build_artifact(exe, comp.portable_hlo(exe)).save(folder)
        out[name] = (fn, args, exe, folder)
    return out


@pytest.mark.parametrize("name", ["eqx", "flax", "nnx", "checkify", "dataclass"])
def test_library_pytrees_in_and_out_match_jax_jit(programs, name):
    fn, args, exe, folder = programs[name]
    expected = jax.jit(fn)(*args)
    assert_bitwise_equal(exe(*args), expected)
    loaded = load_executable(Artifact.open(folder))
    out = loaded(*args)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(expected) or name == "checkify"
    assert_bitwise_equal(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(expected))
    if name == "checkify":
        assert out[0].get() == expected[0].get() == "x must be positive, got -2.0 (`check` failed)"
    else:  # the state a step returns is fed back in: the structures match exactly
        assert_bitwise_equal(loaded(*(out[:1] + args[1:])), jax.jit(fn)(*(expected[:1] + args[1:])))


def test_a_train_state_with_another_optimizer_is_refused(programs):
    _, (state, x), exe, _ = programs["flax"]
    other = state.replace(tx=optax.adam(1e-2))  # the learning rate is compiled in
    with pytest.raises(aot.AvalMismatchError, match="TrainState"):
        exe(other, x)
