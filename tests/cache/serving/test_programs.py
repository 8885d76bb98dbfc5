"""aot.load serves what jax.jit serves: inputs canonicalized as jax.jit does, weak
types, library pytrees matched by digest (outputs rebuilt from the caller's own
nodes), and a name whose entries cannot all run here.

The last test serves every kind in a fresh process that cannot import the module
that defined the programs."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
from aot.artifact import Manifest
from aot.computation import MeshComputation
from aot.errors import AvalMismatchError, SignatureNotFoundError

TESTS = Path(__file__).resolve().parents[2]


def _no_compile(self: MeshComputation) -> None:
    raise AssertionError(f"XLA compile of {self.name} on a path that must not compile")


def scale(x, temperature):
    return x * temperature


def double(x):
    return x * 2


# ---------------------------------------------------------------- calls as jax.jit takes them


@pytest.fixture
def doubled(open_folder_cache):  # noqa: ANN001, ANN201
    cache = open_folder_cache()
    cache.compile(double, "f32[5]", name="double")
    cache.compile(double, "i32[5]", name="double")
    return aot.load("double", cache=cache)


def test_numpy_64_bit_inputs_are_canonicalized_as_jax_jit_does(doubled, monkeypatch) -> None:
    monkeypatch.setattr(MeshComputation, "compile", _no_compile)
    for x in (np.arange(5.0), np.arange(5), np.random.default_rng(0).standard_normal(5)):
        out = doubled(x)
        expected = jax.jit(double)(x)
        assert out.dtype == expected.dtype and out.dtype.itemsize == 4
        np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
    # JAX arrays and NumPy arrays of 32 bits take the same entries.
    np.testing.assert_array_equal(np.asarray(doubled(jnp.arange(5.0))), np.arange(5.0) * 2)


def test_a_list_is_reported_in_one_line(doubled) -> None:
    with pytest.raises(SignatureNotFoundError) as info:
        doubled([1.0] * 1000)
    first = str(info.value).splitlines()[0]
    assert first == "double: no executable compiled for (x: a list of 1000 Python floats)."
    assert str(info.value).count("f32[]") == 0  # not a thousand leaves
    assert "x: stored an array, got a list of 1000 items" in str(info.value)
    assert isinstance(info.value, TypeError)  # as jax.jit's compiled functions raise


def test_a_non_array_leaf_is_refused_in_one_line(doubled) -> None:
    with pytest.raises(AvalMismatchError) as info:
        doubled("abc")
    assert str(info.value) == (
        "double: x is a str ('abc'): not an array or a Python scalar (jax.jit refuses "
        "it too); pass arrays"
    )


def test_python_scalars_match_weakly_typed_entries(open_folder_cache) -> None:
    """bf16 * python_float stays bf16 under jax.jit; the entry compiled from a Python
    scalar serves Python scalars, the strong one np.float32."""
    cache = open_folder_cache()
    x = jnp.arange(4, dtype=jnp.bfloat16)
    cache.compile(scale, x, 0.5, name="scale")
    fn = aot.load("scale", cache=cache)
    assert fn.signatures == ["bf16[4], ~f32[]"]
    out = fn(x, 0.5)
    assert out.dtype == jax.jit(scale)(x, 0.5).dtype == jnp.bfloat16
    with pytest.raises(SignatureNotFoundError, match="temperature: stored ~f32.., got f32.. .a Python scalar is weakly typed"):
        fn(x, np.float32(0.5))
    cache.compile(scale, x, "f32[]", name="scale")
    fn = aot.load("scale", cache=cache)
    assert fn(x, np.float32(0.5)).dtype == jax.jit(scale)(x, np.float32(0.5)).dtype == jnp.float32
    assert fn(x, 0.5).dtype == jnp.bfloat16


# ---------------------------------------------------------------- entries that cannot run here


def test_entries_of_the_other_x64_mode_are_skipped_not_fatal(open_folder_cache, caplog) -> None:
    cache = open_folder_cache()
    cache.compile(double, "f32[5]", name="mixed")
    jax.config.update("jax_enable_x64", True)  # restored by conftest
    cache.compile(double, "f64[5]", name="mixed")
    assert aot.load("mixed", cache=cache)(np.arange(5.0)).dtype == np.float64
    jax.config.update("jax_enable_x64", False)
    for strict in (False, True):
        with caplog.at_level(logging.WARNING, logger="aot.cache.serving"):
            fn = aot.load("mixed", cache=cache, strict=strict)
        assert fn.signatures == ["f32[5]"]
        assert "compiled with jax_enable_x64=true, this process has jax_enable_x64=false" in caplog.text
        np.testing.assert_array_equal(np.asarray(fn(np.arange(5.0, dtype=np.float32))), np.arange(5.0) * 2)
    assert all(e.ok for e in cache.entries("mixed"))  # skipped, never quarantined


def test_a_name_whose_entries_all_need_the_other_x64_mode_fails_at_start_up_saying_why(open_folder_cache) -> None:
    cache = open_folder_cache()
    jax.config.update("jax_enable_x64", True)  # restored by conftest
    cache.compile(double, "f64[5]", name="wide")
    jax.config.update("jax_enable_x64", False)
    with pytest.raises(SignatureNotFoundError) as info:
        aot.load("wide", cache=cache)
    message = str(info.value)
    assert "no signature of 'wide'" in message and "can be served here" in message
    assert "(f64[5])" in message and "cannot run in this process: compiled with jax_enable_x64=true" in message
    assert all(e.ok for e in cache.entries("wide"))


@pytest.mark.parametrize("strict", [False, True])
def test_an_entry_this_jax_or_host_cannot_run_is_skipped(open_folder_cache, compiled, foreign, strict, caplog) -> None:  # noqa: ANN001
    """A dtype this jax lacks, or device ids this host lacks: skipped with the reason;
    the name's other entries serve; nothing is written to the cache."""
    cache = open_folder_cache()
    cache.put(compiled.tiny)
    unknown = foreign(compiled.tiny, jaxlib="9.9.9")
    args = [dict(a) for a in unknown.manifest.args]
    args[0]["dtype"] = "float8_e9m9"
    cache.put_artifact(dataclasses.replace(unknown, manifest=dataclasses.replace(unknown.manifest, args=tuple(args))))
    elsewhere = foreign(compiled.tiny, device_count="16")
    cache.put_artifact(dataclasses.replace(elsewhere, manifest=_on_device(elsewhere.manifest, 12)))
    assert len(cache.entries(compiled.TINY_NAME)) == 3

    with caplog.at_level(logging.WARNING, logger="aot.cache.serving"):
        fn = aot.load(compiled.TINY_NAME, cache=cache, strict=strict)
    np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected)
    reasons = sorted(reason for _, _, reason in fn.skipped)
    assert len(reasons) == 1
    assert "manifest names dtype 'float8_e9m9', which this jax" in reasons[0]
    assert "float8_e9m9" in caplog.text
    # The 16-device row is another program (its fingerprint pins the devices): not the
    # one this signature serves, so it is not even considered (selection).
    dropped = [entry for entry, _ in fn.programs.selection.dropped]
    assert len(dropped) == 1 and Manifest.from_json(dropped[0].manifest).device_ids == (12,)
    assert all(e.ok for e in cache.entries(compiled.TINY_NAME))
    with pytest.raises(SignatureNotFoundError, match=r"Not servable in this process:\n"):
        fn(np.zeros(3, np.float32), np.zeros(3, np.float32))


def _on_device(manifest, device: int):  # noqa: ANN001, ANN202
    """``manifest`` as compiled for device ``device`` of a larger host: its device ids
    and the program fingerprint's ``devices`` part that pins them (a manifest whose
    device ids contradict its fingerprint is corruption, not another host)."""
    from aot.fingerprint import combined_key

    program = dataclasses.replace(
        manifest.program,
        parts=tuple((k, f"[{device}]" if k == "devices" else v) for k, v in manifest.program.parts),
    )
    return dataclasses.replace(
        manifest, device_ids=(device,), program=program, key=combined_key(program, manifest.environment),
    )


# ---------------------------------------------------------------- library pytrees, in another process

MODELS = "aot_blocked_programs"  # the serving process must not import it
SHARED = "aot_shared_inputs"  # what a serving process imports itself: libraries, its types

SHARED_SOURCE = '''\
import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen, nnx
from flax.training import train_state


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Pair:
    a: jax.Array
    b: jax.Array
    label: str = dataclasses.field(default="pair", metadata={"static": True})


def inputs():
    """The same values in every process: (args, kwargs) per program name."""
    key = jax.random.key(0)
    x = jnp.asarray(np.linspace(-1.0, 1.0, 8, dtype=np.float32).reshape(4, 2))
    dense = linen.Dense(3)
    state = train_state.TrainState.create(
        apply_fn=dense.apply, params=dense.init(key, x), tx=optax.adam(1e-2)
    )
    _, nnx_state = nnx.split(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))
    narrow = [np.array([1, 0, 1, 1], np.float32).astype(jnp.dtype(n))
              for n in ("int4", "uint4", "int2", "float8_e4m3fn", "float4_e2m1fn")]
    return {
        "eqx": ((eqx.nn.Linear(2, 3, key=key), x), {}),
        "flax": ((state, x), {}),
        "nnx": ((nnx_state, x), {}),
        "checkify": ((jnp.array([1.0, -2.0, 3.0]),), {}),
        "pair": ((Pair(x, x + 1.0),), {}),
        "private": ((x,), {}),
        "keys": ((jax.random.key(7), np.zeros(3, np.float32)), {}),
        "weak": ((jnp.arange(4, dtype=jnp.bfloat16), 0.5), {}),
        "narrow": (tuple(narrow), {}),
        "statics": ((np.arange(3, dtype=np.float32),), {}),
    }
'''

MODEL_SOURCE = '''\
import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import checkify


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Private:
    total: jax.Array


def eqx_step(model, x):
    return jax.tree_util.tree_map(lambda p: p * 0.5, model), jax.vmap(model)(x)


def flax_step(state, x):
    def loss(params):
        return jnp.mean(state.apply_fn(params, x) ** 2)

    value, grads = jax.value_and_grad(loss)(state.params)
    return state.apply_gradients(grads=grads), value


def nnx_step(state, x):
    return jax.tree_util.tree_map(lambda p: p + 1.0, state), x @ state["kernel"][...]


def checked(x):
    checkify.check(jnp.all(x > 0), "x must be positive, got {v}", v=x.min())
    return jnp.log(jnp.abs(x))


def pair_step(pair):
    return dataclasses.replace(pair, a=pair.b * 2.0, b=pair.a), pair.a.sum()


def private(x):
    return Private(x.sum())


def keys(key, n):
    ks = jax.random.split(key, n.shape[0])
    return ks, jax.vmap(lambda k: jax.random.normal(k, (2,)))(ks)


def weak(x, temperature):
    return x * temperature


def narrow(*xs):
    return [x.astype(jnp.float32) + 1 for x in xs], xs[0]


def statics(x, training=False):
    return x * (2.0 if training else 1.0)
'''


def _import(folder: Path, name: str, source: str):  # noqa: ANN202
    import importlib.util

    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _leaves(tree):  # noqa: ANN001, ANN202
    """Output leaves as NumPy arrays (typed keys as their key data)."""
    out = []
    for leaf in jax.tree_util.tree_leaves(tree):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        out.append(np.asarray(leaf))
    return out


@pytest.fixture(scope="module")
def library_programs(tmp_path_factory):  # noqa: ANN201
    """Every program compiled into a folder cache, with jax.jit's outputs."""
    from aot.cache.cache import Cache
    from jax.experimental import checkify

    root = tmp_path_factory.mktemp("programs")
    (root / "models").mkdir()
    (root / "shared").mkdir()
    models = _import(root / "models", MODELS, MODEL_SOURCE)
    shared = _import(root / "shared", SHARED, SHARED_SOURCE)
    cache = Cache(root / "cache")
    functions = {
        "eqx": (models.eqx_step, {}), "flax": (models.flax_step, {}), "nnx": (models.nnx_step, {}),
        "checkify": (checkify.checkify(models.checked), {}), "pair": (models.pair_step, {}),
        "private": (models.private, {}), "keys": (models.keys, {}), "weak": (models.weak, {}),
        "narrow": (models.narrow, {}),
        "statics": (models.statics, {"training": True, "static_argnames": "training"}),
    }
    references = {}
    try:
        for name, ((args, kwargs), (fn, options)) in zip(functions, zip(shared.inputs().values(), functions.values())):
            cache.compile(fn, *args, name=name, **kwargs, **options)
            static = {k: v for k, v in options.items() if not k.startswith("static_")}
            out = jax.jit(fn, static_argnames=tuple(static))(*args, **static)
            references[name] = out
            if name == "flax":  # a second step, from the state the first returned
                references["flax2"] = jax.jit(fn)(out[0], args[1])
            np.savez(root / f"ref_{name}.npz", *_leaves(out))
        np.savez(root / "ref_flax2.npz", *_leaves(references["flax2"]))
        yield root, cache, shared, references
    finally:
        cache.close()
        sys.modules.pop(MODELS, None)
        sys.modules.pop(SHARED, None)


def test_library_pytrees_are_served_by_digest(library_programs, monkeypatch) -> None:  # noqa: ANN001
    root, cache, shared, references = library_programs
    monkeypatch.setattr(MeshComputation, "compile", _no_compile)
    inputs = shared.inputs()
    for name in ("eqx", "flax", "nnx", "pair", "keys", "weak", "narrow", "statics", "checkify"):
        (args, kwargs) = inputs[name]
        fn = aot.load(name, cache=cache, strict=True)
        out = fn(*args, **kwargs)
        if name != "checkify":  # checkify's error holds a fresh traceback
            from aot import treedef as treedefs

            assert treedefs.structure_key(jax.tree_util.tree_structure(out)) == treedefs.structure_key(
                jax.tree_util.tree_structure(references[name])
            ), name
        for got, want in zip(_leaves(out), _leaves(references[name])):
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name
    state, _ = aot.load("flax", cache=cache)(*inputs["flax"][0])
    again = aot.load("flax", cache=cache)(state, inputs["flax"][0][1])
    assert [a.tobytes() for a in _leaves(again)] == [a.tobytes() for a in _leaves(references["flax2"])]


_SERVER = textwrap.dedent(
    """
    import importlib.abc, json, pickle, collections, sys
    BLOCKED = sys.argv[3]

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == BLOCKED or name.startswith(BLOCKED + "."):
                raise ImportError(f"the serving process must not import {name}")
            return None

    sys.meta_path.insert(0, Block())

    def no_pickle(event, args):
        if event == "pickle.find_class":
            raise RuntimeError(f"pickle.find_class{args!r} on the load path")

    sys.addaudithook(no_pickle)

    import jax, jax.monitoring
    import numpy as np
    import aot
    import aot_shared_inputs as shared

    root, cache = sys.argv[1], sys.argv[2]
    inputs = shared.inputs()  # eager jax ops (keys, inits) compile here, before serving
    work, serving = [], [False]  # JAX's trace/lower/compile events while serving
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: work.append(f"{event} ({kw.get('fun_name', '?')})") if serving[0] and "/jax/core/compile/" in event else None
    )

    def serve(fn, *args, **kwargs):
        serving[0] = True
        try:
            return jax.block_until_ready(fn(*args, **kwargs))
        finally:
            serving[0] = False

    def leaves(tree):
        out = []
        for leaf in jax.tree_util.tree_leaves(tree):
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                leaf = jax.random.key_data(leaf)
            out.append(np.asarray(leaf))
        return out

    def same(out, ref):
        ref = np.load(f"{root}/ref_{ref}.npz", allow_pickle=False)
        want = [ref[f"arr_{i}"] for i in range(len(ref.files))]
        got = leaves(out)
        return len(got) == len(want) and all(
            g.tobytes() == w.tobytes() and g.shape == w.shape for g, w in zip(got, want)
        )

    report = {}
    for name in ("eqx", "flax", "nnx", "checkify", "pair", "keys", "weak", "narrow", "statics"):
        args, kwargs = inputs[name]
        serving[0] = True
        fn = aot.load(name, cache=cache, strict=True)
        serving[0] = False
        out = serve(fn, *args, **kwargs)
        report[name] = {"same": same(out, name), "types": [type(o).__name__ for o in out]}
        if name == "flax":
            again = serve(fn, out[0], args[1])
            report["flax2"] = {"same": same(again, "flax2"), "types": [type(o).__name__ for o in again]}
        if name == "checkify":
            report[name]["message"] = out[0].get()
        if name == "weak":
            report[name]["dtype"] = str(out.dtype)
    fn = aot.load("private", cache=cache, strict=True)
    try:
        serve(fn, *inputs["private"][0])
        report["private"] = "served"
    except aot.PytreeNodeError as exc:
        report["private"] = str(exc)
    report["jax_work"] = work
    try:
        __import__(BLOCKED)
        report["import_blocked"] = False
    except ImportError:
        report["import_blocked"] = True
    try:
        pickle.loads(pickle.dumps(collections.OrderedDict()))
        report["pickle_hooked"] = False
    except RuntimeError:
        report["pickle_hooked"] = True
    report["models_imported"] = BLOCKED in sys.modules
    print(json.dumps(report))
    """
)


@pytest.mark.slow
def test_library_pytrees_are_served_in_a_process_without_the_model_code(library_programs) -> None:  # noqa: ANN001
    root, cache, _, _ = library_programs
    env = dict(os.environ, PYTHONPATH=str(root / "shared"))  # the shared inputs only
    proc = subprocess.run(
        [sys.executable, "-c", _SERVER, str(root), cache.location, MODELS],
        capture_output=True, text=True, env=env, cwd=root, timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["import_blocked"] and report["pickle_hooked"] and not report["models_imported"]
    assert report["jax_work"] == []  # nothing traced, lowered or compiled to serve
    for name in ("eqx", "flax", "flax2", "nnx", "checkify", "pair", "keys", "weak", "narrow", "statics"):
        assert report[name]["same"] is True, (name, report[name])
    assert report["eqx"]["types"] == ["Linear", "ArrayImpl"]
    assert report["flax"]["types"] == ["TrainState", "ArrayImpl"]  # rebuilt from the caller's state
    assert report["nnx"]["types"] == ["State", "ArrayImpl"]
    assert report["pair"]["types"] == ["Pair", "ArrayImpl"]
    assert report["checkify"]["types"] == ["Error", "ArrayImpl"]
    assert report["checkify"]["message"] == "x must be positive, got -2.0 (`check` failed)"
    assert report["weak"]["dtype"] == "bfloat16"
    # An output node nothing here can rebuild: named, with what to do.
    assert report["private"].startswith(f"pytree node class {MODELS}:Private cannot be imported in this process")
    assert "flat_outputs=True" in report["private"]
