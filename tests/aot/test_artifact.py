"""The artifact format: build, save, open, load in a process without the model's code.

Every kind of computation (single-device jit, jit pinned to another device, a 4x2
mesh, pmap over 8 devices, and a pytree-heavy function with a dead argument, donation
and namedtuple outputs) is compiled here, saved to a folder, and loaded and called in
a second process that cannot import the module that defined the functions and that
fails on any ``pickle.find_class``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import aot
from aot.jaxcompat.shardings import single_device_sharding
from aot.artifact import (
    EXECUTABLE,
    FORMAT_VERSION,
    PORTABLE_HLO,
    Artifact,
    Manifest,
)
from aot.fingerprint import Fingerprint, combined_key
from aot.build import build_artifact
from aot.recompile import recompile
from aot.rehydrate import load_executable
from tests.aot.helpers import assert_bitwise_equal, block

# batch.mask is donated but no output can reuse it: JAX warns, as it should.
pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

MODELS = "aot_blocked_models"  # the module the loader process must not import

MODEL_SOURCE = '''\
import collections

import jax
import jax.numpy as jnp

Out = collections.namedtuple("Out", ["y", "stats"])
Batch = collections.namedtuple("Batch", ["x", "mask"])


def mlp(x, w):
    return jnp.tanh(jnp.sin(x) @ w + 1.0)


def sharded(x, w):
    return jnp.tanh(x @ w) * 2.0


def allreduce(x, w):
    return jax.lax.psum(x * w, "i") + x


def dtypes(a, b, c, d, e, f):
    return a * 2, ~b, c * (1 + 2j), d + 1, e * e, (f * 3).astype(jnp.bfloat16), jnp.sum(d)


def pytree_fn(params, batch, dead, nothing, *, scale):
    h = batch.x
    for layer in params["layers"]:
        h = jnp.tanh(h @ layer["w"] + layer["b"])
    a, k = params["pair"]
    h = h * batch.mask[:, None] * scale + a * k
    return Out(y=h, stats={"sum": h.sum(), "parts": [h.mean(), (jnp.argmax(h), None)]})
'''


def _import_models(folder: Path):
    path = folder / f"{MODELS}.py"
    path.write_text(MODEL_SOURCE)
    spec = importlib.util.spec_from_file_location(MODELS, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODELS] = module  # importable here, so namedtuples record its path
    spec.loader.exec_module(module)
    return module


def _inputs(kind, models, seed=0):
    """(args, kwargs) for each kind, as numpy arrays."""
    rng = np.random.default_rng(seed)
    f32 = lambda *shape: rng.standard_normal(shape, np.float32)  # noqa: E731
    if kind in ("jit", "pinned"):
        return (f32(8, 16), f32(16, 4)), {}
    if kind == "mesh":
        return (f32(8, 16), f32(16, 4)), {}
    if kind == "pmap":
        return (f32(8, 3), f32(3)), {}
    if kind == "dtypes":
        return (
            f32(4).astype(jnp.bfloat16),
            np.array([True, False, True, True]),
            (f32(2) + 1j * f32(2)).astype(np.complex64),
            np.array([0, 7, 255], np.uint8),
            np.array([-3, 300], np.int16),
            f32(2).astype(np.float16),
        ), {}
    params = {
        "layers": [{"w": f32(4, 4), "b": f32(4)} for _ in range(3)],
        "pair": (np.float32(0.5), np.int32(3)),
    }
    batch = models.Batch(f32(2, 4), np.array([1.0, 0.0], np.float32))
    return (params, batch, np.zeros(5, np.float32), None), {"scale": np.float32(1.5)}


def _compile(kind, models, mesh):
    if kind == "jit":
        comp = aot.lower(models.mlp, "f32[8,16]", "f32[16,4]")
        return comp, jax.jit(models.mlp)
    if kind == "pinned":
        device = single_device_sharding(jax.devices()[3])
        comp = aot.lower(
            models.mlp, "f32[8,16]", "f32[16,4]", in_shardings=device, out_shardings=device
        )
        return comp, jax.jit(models.mlp, out_shardings=device)
    if kind == "mesh":
        comp = aot.lower(
            models.sharded, "f32[8,16]@data,None", "f32[16,4]@None,model",
            mesh=mesh, out_shardings="data,model",
        )
        return comp, jax.jit(models.sharded, out_shardings=NamedSharding(mesh, P("data", "model")))
    if kind == "pmap":
        comp = aot.lower_pmap(models.allreduce, "f32[8,3]", "f32[3]", axis_name="i", in_axes=(0, None))
        return comp, jax.pmap(models.allreduce, axis_name="i", in_axes=(0, None))
    if kind == "dtypes":
        comp = aot.lower(models.dtypes, "bf16[4]", "bool[4]", "c64[2]", "u8[3]", "i16[2]", "f16[2]")
        return comp, jax.jit(models.dtypes)
    params = {
        "layers": [{"w": "f32[4,4]", "b": "f32[4]"} for _ in range(3)],
        "pair": ("f32[]", "i32[]"),
    }
    comp = aot.lower(
        models.pytree_fn, params, models.Batch("f32[2,4]", "f32[2]"), "f32[5]", None,
        scale="f32[]", donate_argnums=1,
    )
    return comp, jax.jit(models.pytree_fn)


KINDS = ("jit", "pinned", "mesh", "pmap", "pytree", "dtypes")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Compiles every kind once; saves artifact, inputs and jax reference outputs."""
    root = tmp_path_factory.mktemp("artifacts")
    models = _import_models(tmp_path_factory.mktemp("models"))
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    out = {}
    try:
        for kind in KINDS:
            comp, reference_fn = _compile(kind, models, mesh)
            exe = comp.compile()
            args, kwargs = _inputs(kind, models)
            reference = block(reference_fn(*args, **kwargs))
            assert_bitwise_equal(exe(*args, **kwargs), reference)  # sanity, in process
            artifact = build_artifact(exe, comp.portable_hlo(exe))
            folder = root / kind
            artifact.save(folder / "artifact")
            for i, leaf in enumerate(jax.tree_util.tree_leaves((args, kwargs))):
                np.save(folder / f"in_{i}.npy", np.asarray(leaf), allow_pickle=False)
            for i, leaf in enumerate(jax.tree_util.tree_leaves(reference)):
                np.save(folder / f"ref_{i}.npy", np.asarray(leaf), allow_pickle=False)
            out[kind] = (comp, exe, artifact, folder, args, kwargs, reference)
        yield root, out
    finally:
        sys.modules.pop(MODELS, None)


# ------------------------------------------------------------------ the second process

LOADER = r'''
import importlib.abc, json, os, pickle, collections, sys
from pathlib import Path

BLOCKED = sys.argv[2]


class BlockModels(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == BLOCKED or name.startswith(BLOCKED + "."):
            raise ImportError(f"the loader must not import {name}")
        return None


sys.meta_path.insert(0, BlockModels())


def no_pickle(event, args):
    if event == "pickle.find_class":
        raise RuntimeError(f"pickle.find_class{args!r} on the load path")


sys.addaudithook(no_pickle)

import jax
import ml_dtypes
import numpy as np

from aot.artifact import Artifact
from aot.recompile import recompile
from aot.rehydrate import load_executable


def load(path):
    # np.save stores bfloat16 as raw 2-byte void (no pickle): view it back.
    array = np.load(path, allow_pickle=False)
    if array.dtype.kind == "V" and array.dtype.itemsize == 2:
        array = array.view(ml_dtypes.bfloat16)
    return array


def compare(out, folder):
    leaves = jax.tree_util.tree_leaves(jax.block_until_ready(out))
    refs = sorted(folder.glob("ref_*.npy"), key=lambda p: int(p.stem[4:]))
    if len(leaves) != len(refs):
        return f"{len(leaves)} outputs, expected {len(refs)}"
    for i, (leaf, ref_path) in enumerate(zip(leaves, refs)):
        ref = load(ref_path)
        got = np.asarray(leaf)
        if got.dtype != ref.dtype or got.shape != ref.shape or got.tobytes() != ref.tobytes():
            return f"output {i}: {got.dtype}{got.shape} != {ref.dtype}{ref.shape} or bits differ"
    return "equal"


def call(exe, folder):
    n = exe.info.in_tree.num_leaves
    leaves = [load(folder / f"in_{i}.npy") for i in range(n)]
    # Donated inputs go on device first, so that donation can delete them.
    leaves = [jax.device_put(l) if a.donated else l for l, a in zip(leaves, exe.info.args)]
    args, kwargs = jax.tree_util.tree_unflatten(exe.info.in_tree, leaves)
    out = jax.block_until_ready(exe(*args, **kwargs))
    donated = [l.is_deleted() for l, a in zip(leaves, exe.info.args) if a.donated]
    return out, donated, (args, kwargs)


report = {}
root = Path(sys.argv[1])
for kind in sorted(os.listdir(root)):
    folder = root / kind
    artifact = Artifact.open(folder / "artifact")
    exe = load_executable(artifact)
    out, donated, (args, kwargs) = call(exe, folder)
    entry = {
        "type": type(exe).__name__,
        "outputs": compare(out, folder),
        "donated_deleted": donated,
        "out_type": type(out).__name__,
        "out_module": type(out).__module__,
        "out_fields": list(getattr(out, "_fields", [])),
        "out_structure": str(jax.tree_util.tree_structure(out)),
        "out_devices": sorted(d.id for d in jax.tree_util.tree_leaves(out)[0].devices()),
    }
    first = jax.tree_util.tree_leaves(out)[0]
    if hasattr(first.sharding, "spec"):
        entry["out_spec"] = str(first.sharding.spec)
    # A bad input is still refused by path, from the manifest alone.
    # The first leaf gets another dtype and shape; the dead argument (or else the last
    # leaf) one more element.
    n = exe.info.in_tree.num_leaves
    bad = [load(folder / f"in_{i}.npy") for i in range(n)]
    bad[0] = np.zeros((1,), np.int8)
    dead = [i for i, a in enumerate(exe.info.args) if not a.kept] or [n - 1]
    for i in dead:
        bad[i] = np.zeros(bad[i].shape[:-1] + (bad[i].shape[-1] + 1,), bad[i].dtype)
    bad_args, bad_kwargs = jax.tree_util.tree_unflatten(exe.info.in_tree, bad)
    try:
        exe(*bad_args, **bad_kwargs)
        entry["bad_input"] = "accepted"
    except TypeError as exc:
        entry["bad_input"] = [type(exc).__name__, list(exc.mismatches)]
    # Recompile from the portable HLO alone, then load and run that.
    rebuilt = recompile(artifact)
    exe2 = load_executable(rebuilt)
    out2, donated2, _ = call(exe2, folder)
    entry["recompiled_outputs"] = compare(out2, folder)
    entry["recompiled_donated_deleted"] = donated2
    entry["recompiled_same_program"] = rebuilt.manifest.program == artifact.manifest.program
    report[kind] = entry

# Controls: the import block and the pickle hook were live all along.
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
'''


@pytest.mark.slow
def test_every_kind_loads_and_runs_in_a_process_without_the_model_code(built, tmp_path):
    root, kinds = built
    loader = tmp_path / "loader.py"
    loader.write_text(LOADER)
    env = dict(os.environ)  # the conftest's XLA_FLAGS: 8 CPU devices
    # Only the artifacts folder: the models' folder is not on the loader's path.
    proc = subprocess.run(
        [sys.executable, str(loader), str(root), MODELS],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])

    assert report["import_blocked"] is True
    assert report["pickle_hooked"] is True
    assert report["models_imported"] is False

    for kind in KINDS:
        entry = report[kind]
        assert entry["outputs"] == "equal", kind
        assert entry["recompiled_outputs"] == "equal", kind
        assert entry["recompiled_same_program"] is True, kind
        assert entry["bad_input"][0] == "AvalMismatchError", kind

    assert report["jit"]["type"] == "MeshExecutable"
    assert report["jit"]["out_devices"] == [0]  # one device, on an 8-device host
    assert report["pinned"]["out_devices"] == [3]  # mapped by device id
    assert report["mesh"]["out_devices"] == list(range(8))
    assert report["mesh"]["out_spec"] == str(P("data", "model"))
    assert report["pmap"]["type"] == "PmapExecutable"
    assert report["pmap"]["out_devices"] == list(range(8))

    pytree = report["pytree"]
    # The namedtuple output is rebuilt from its recorded fields (its module is blocked).
    assert pytree["out_type"] == "Out"
    assert pytree["out_fields"] == ["y", "stats"]
    assert pytree["out_module"] != MODELS
    assert pytree["out_structure"] == str(jax.tree_util.tree_structure(kinds["pytree"][6]))
    # batch.x and batch.mask were donated; x is usable (an output has its shape) and is
    # deleted by the call, mask (f32[2]) is not usable and survives, as with jax.jit.
    # The same after recompiling from the portable HLO.
    assert pytree["donated_deleted"] == [True, False]
    assert pytree["recompiled_donated_deleted"] == [True, False]
    # Inputs are checked by path from the manifest alone, the dead argument included.
    assert pytree["bad_input"][1] == [
        "params['layers'][0]['b']: expected f32[4], got i8[1]",
        "dead: expected f32[5], got f32[6]",
    ]
    assert report["jit"]["bad_input"][1] == [
        "x: expected f32[8,16], got i8[1]",
        "w: expected f32[16,4], got f32[16,5]",
    ]


# ------------------------------------------------------------------ in process


def test_round_trip_in_process(built, tmp_path):
    _, kinds = built
    for kind in KINDS:
        comp, exe, artifact, folder, args, kwargs, reference = kinds[kind]
        if kind == "pytree":  # donation deletes the inputs: use fresh ones
            args, kwargs = jax.tree_util.tree_map(np.copy, (args, kwargs))
        loaded = load_executable(Artifact.open(folder / "artifact"))
        assert type(loaded) is type(exe)
        assert loaded.key == exe.key == artifact.manifest.key
        assert loaded.signature == exe.signature
        assert_bitwise_equal(loaded(*args, **kwargs), reference)


def test_recompile_from_portable_hlo(built):
    _, kinds = built
    comp, exe, artifact, folder, args, kwargs, reference = kinds["mesh"]
    rebuilt = recompile(Artifact.open(folder / "artifact"))
    assert rebuilt.manifest.program == artifact.manifest.program
    assert rebuilt.manifest.blobs[PORTABLE_HLO] == artifact.manifest.blobs[PORTABLE_HLO]
    assert rebuilt.manifest.key == combined_key(rebuilt.manifest.program, rebuilt.manifest.environment)
    out = load_executable(rebuilt)(*args, **kwargs)
    assert_bitwise_equal(out, reference)
    assert out.sharding.spec == P("data", "model")


def test_manifest_records_what_a_caller_needs(built):
    _, kinds = built
    comp, exe, artifact, folder, *_ = kinds["mesh"]
    data = json.loads((folder / "artifact" / "manifest.json").read_text())
    assert data["format_version"] == 2  # the lowest that carries it: no statics, no callbacks
    assert data["name"] == f"{MODELS}.sharded"
    assert data["kind"] == "jit"
    assert data["key"] == exe.key
    assert data["signature"] == "f32[8,16], f32[16,4]"
    assert data["program"]["parts"] == comp.program_fingerprint.as_dict()
    assert data["environment"]["parts"] == comp.environment_fingerprint.as_dict()
    assert data["environment"]["parts"]["jaxlib"] == jaxlib.__version__
    assert data["jax_version"] == jax.__version__
    assert data["jaxlib_version"] == jaxlib.__version__
    assert data["args"] == [
        {"path": "x", "shape": [8, 16], "dtype": "float32", "donated": False, "kept": True},
        {"path": "w", "shape": [16, 4], "dtype": "float32", "donated": False, "kept": True},
    ]
    assert data["arg_names"] == ["x", "w"]
    mesh_json = {
        "axis_names": ["data", "model"],
        "shape": [4, 2],
        "device_ids": [int(d.id) for d in jax.make_mesh((4, 2), ("data", "model")).devices.flat],
        "axis_types": ["Explicit", "Explicit"],
    }
    assert [s["spec"] for s in data["in_shardings"]] == [["data", None], [None, "model"]]
    assert all(s["type"] == "named" and s["mesh"] == mesh_json for s in data["in_shardings"])
    assert data["out_shardings"][0]["spec"] == ["data", "model"]
    assert sorted(data["device_ids"]) == list(range(8))
    assert data["compile_seconds"] > 0
    assert data["created_at"].endswith("+00:00")
    assert data["cost_analysis"]["flops"] > 0
    for role in (EXECUTABLE, PORTABLE_HLO):
        ref = data["blobs"][role]
        blob = (folder / "artifact" / f"{ref['digest']}.bin").read_bytes()
        assert ref["size"] == len(blob)
        assert ref["digest"] == hashlib.sha256(blob).hexdigest()
    # to_json / from_json is lossless.
    assert Manifest.from_json(artifact.manifest.to_json()) == artifact.manifest


def test_manifest_records_dead_and_donated_arguments(built):
    _, kinds = built
    manifest = kinds["pytree"][2].manifest
    flags = {a["path"]: (a["donated"], a["kept"]) for a in manifest.args}
    assert flags["dead"] == (False, False)
    assert flags["batch.x"] == (True, True)
    assert flags["batch.mask"] == (True, True)
    assert flags["scale"] == (False, True)
    assert manifest.out_tree["t"] == "namedtuple"
    assert manifest.out_tree["type"] == f"{MODELS}:Out"
    assert manifest.out_tree["fields"] == ["y", "stats"]
    assert len(manifest.in_shardings) == len(manifest.args) - 1  # kept inputs only


def test_flat_outputs_when_an_output_node_cannot_be_rebuilt(tmp_path):
    class Hidden:
        def __init__(self, a, b):
            self.a, self.b = a, b

    jax.tree_util.register_pytree_node(
        Hidden, lambda h: ((h.a, h.b), None), lambda aux, children: Hidden(*children)
    )

    def fn(x):
        return Hidden(x + 1, x * 2)

    comp = aot.lower(fn, "f32[3]")
    exe = comp.compile()
    build_artifact(exe, comp.portable_hlo(exe)).save(tmp_path)
    # Loading works (an output node is rebuilt per caller, from the caller's inputs when
    # they hold an equal node); a call that cannot rebuild it names it.
    x = np.arange(3, dtype=np.float32)
    unflat = load_executable(Artifact.open(tmp_path))
    with pytest.raises(aot.PytreeNodeError) as info:
        unflat(x)
    assert isinstance(info.value, aot.UnsupportedComputationError)
    assert "test_artifact:test_flat_outputs_when_an_output_node_cannot_be_rebuilt.<locals>.Hidden" in str(info.value)
    assert "flat_outputs=True" in str(info.value)
    loaded = load_executable(Artifact.open(tmp_path), flat_outputs=True)
    out = loaded(x)
    assert isinstance(out, tuple) and len(out) == 2
    np.testing.assert_array_equal(out[0], x + 1)
    np.testing.assert_array_equal(out[1], x * 2)


# ------------------------------------------------------------------ refusing bad artifacts


class DeserializeCalled(Exception):
    pass


@pytest.fixture
def deserialize_calls(monkeypatch):
    """Replaces the PJRT client's deserialize_executable; records every call."""
    calls = []
    client_type = type(jax.devices()[0].client)

    def fake(self, *args, **kwargs):
        calls.append(args)
        raise DeserializeCalled("deserialize_executable was called")

    monkeypatch.setattr(client_type, "deserialize_executable", fake)
    return calls


@pytest.fixture
def saved(built, tmp_path):
    """A fresh copy of the jit artifact that a test may damage."""
    _, kinds = built
    artifact = kinds["jit"][2]
    return artifact.save(tmp_path / "copy"), artifact


def test_the_deserialize_patch_is_effective(saved, deserialize_calls):
    # Control for the tests below: an intact artifact does reach XLA.
    folder, _ = saved
    with pytest.raises(aot.IncompatibleEnvironmentError, match="deserialize_executable was called"):
        load_executable(Artifact.open(folder))
    assert len(deserialize_calls) == 1


def test_one_changed_byte_is_refused_before_deserializing(saved, deserialize_calls):
    folder, artifact = saved
    path = folder / f"{artifact.manifest.blobs[EXECUTABLE].digest}.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(aot.CorruptArtifactError) as info:
        load_executable(Artifact.open(folder))
    message = str(info.value)
    assert message.startswith(f"executable blob of '{MODELS}.mlp': sha256 ")
    assert "the bytes were altered or truncated and will not be executed" in message
    assert deserialize_calls == []


def test_bytes_swapped_in_after_verification_are_still_refused(saved, deserialize_calls):
    """A reader that hashed a blob hands it over as verified (not hashed twice); any
    other bytes under that digest, even in the same artifact object, are hashed."""
    folder, artifact = saved
    digest = artifact.manifest.blobs[EXECUTABLE].digest
    intact = Artifact.open(folder).blobs[digest]
    changed = bytearray(intact)
    changed[len(changed) // 2] ^= 0x01
    blobs = {**artifact.blobs, digest: bytes(changed)}
    with pytest.raises(aot.CorruptArtifactError, match="will not be executed"):
        load_executable(Artifact(artifact.manifest, blobs, verified={digest: intact}))
    assert deserialize_calls == []
    # the verified bytes themselves reach XLA
    with pytest.raises(aot.IncompatibleEnvironmentError, match="deserialize_executable was called"):
        load_executable(Artifact(artifact.manifest, {**blobs, digest: intact}, verified={digest: intact}))


def test_a_truncated_portable_hlo_is_refused_before_recompiling(saved, monkeypatch):
    folder, artifact = saved
    path = folder / f"{artifact.manifest.blobs[PORTABLE_HLO].digest}.bin"
    path.write_bytes(path.read_bytes()[:-1])

    def fail(*args, **kwargs):
        raise AssertionError("jax.export.deserialize was called on a corrupt blob")

    monkeypatch.setattr(jax.export, "deserialize", fail)
    with pytest.raises(aot.CorruptArtifactError, match="portable_hlo blob of"):
        recompile(Artifact.open(folder))


def test_a_missing_blob_is_refused(saved, deserialize_calls):
    folder, artifact = saved
    (folder / f"{artifact.manifest.blobs[EXECUTABLE].digest}.bin").unlink()
    with pytest.raises(aot.CorruptArtifactError, match="executable blob .* is missing"):
        load_executable(Artifact.open(folder))
    assert deserialize_calls == []


def _edit_manifest(folder, edit, *, rekey):
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    if rekey:  # an artifact really built elsewhere has a consistent key
        program = Fingerprint.from_dict(data["program"])
        environment = Fingerprint.from_dict(data["environment"])
        data["environment"]["digest"] = environment.digest
        data["key"] = combined_key(program, environment)
    path.write_text(json.dumps(data))


def test_another_format_version_is_an_incompatible_environment(saved, deserialize_calls):
    folder, _ = saved
    _edit_manifest(folder, lambda d: d.update(format_version=FORMAT_VERSION + 1), rekey=False)
    with pytest.raises(aot.IncompatibleEnvironmentError) as info:
        load_executable(Artifact.open(folder))
    assert str(info.value).startswith(
        f"artifact format version {FORMAT_VERSION + 1} != {FORMAT_VERSION}"
    )
    assert info.value.differences == (f"format_version {FORMAT_VERSION + 1} != {FORMAT_VERSION}",)
    assert deserialize_calls == []


def test_a_format_1_manifest_is_still_read(built, tmp_path):
    """Format 2 changed how pytree nodes are described; format 1 manifests are read
    (their standard containers and JSON auxiliary data mean the same)."""
    _, kinds = built
    folder = kinds["pytree"][2].save(tmp_path / "v1")
    _edit_manifest(folder, lambda d: d.update(format_version=1), rekey=False)
    artifact = Artifact.open(folder)
    assert artifact.manifest.format_version == 1
    args, kwargs = jax.tree_util.tree_map(np.copy, (kinds["pytree"][4], kinds["pytree"][5]))
    assert_bitwise_equal(load_executable(artifact)(*args, **kwargs), kinds["pytree"][6])


def test_a_reader_of_an_older_format_serves_what_it_can_read(built, tmp_path, monkeypatch):
    """Entries are written at the lowest format that carries them, so a replica still
    on the jax-aot before statics and callbacks (formats 1-3) serves a plain entry."""
    _, kinds = built
    folder = kinds["pytree"][2].save(tmp_path / "plain")
    monkeypatch.setattr("aot.artifact.READABLE_FORMAT_VERSIONS", (1, 2, 3))
    artifact = Artifact.open(folder)
    assert artifact.manifest.format_version == 2
    args, kwargs = jax.tree_util.tree_map(np.copy, (kinds["pytree"][4], kinds["pytree"][5]))
    assert_bitwise_equal(load_executable(artifact)(*args, **kwargs), kinds["pytree"][6])


def test_another_environment_names_each_differing_part(saved, deserialize_calls):
    folder, _ = saved

    def edit(data):
        data["environment"]["parts"]["jaxlib"] = "0.0.1"
        data["jaxlib_version"] = "0.0.1"  # built there: the version field agrees
        data["environment"]["parts"]["device_count"] = "1"

    _edit_manifest(folder, edit, rekey=True)
    with pytest.raises(aot.IncompatibleEnvironmentError) as info:
        load_executable(Artifact.open(folder))
    assert info.value.differences == ("device_count 1 != 8", f"jaxlib 0.0.1 != {jaxlib.__version__}")
    message = str(info.value)
    assert f"was compiled for another environment: device_count 1 != 8; jaxlib 0.0.1 != {jaxlib.__version__}." in message
    assert "Recompile it here" in message
    assert deserialize_calls == []
    # check_env=False skips the comparison (and reaches XLA).
    with pytest.raises(aot.IncompatibleEnvironmentError, match="deserialize_executable was called"):
        load_executable(Artifact.open(folder), check_env=False)


def test_another_cpu_says_which_features_are_missing(saved, deserialize_calls):
    folder, artifact = saved
    ours = artifact.manifest.environment.as_dict()["cpu_isa"]
    _edit_manifest(
        folder, lambda d: d["environment"]["parts"].update(cpu_isa=ours + " zz_future_isa"), rekey=True
    )
    with pytest.raises(aot.IncompatibleEnvironmentError) as info:
        load_executable(Artifact.open(folder))
    assert info.value.differences == (
        "cpu_isa: stored artifact needs ['zz_future_isa'], this CPU adds nothing",
    )


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["environment"]["parts"].update(jaxlib="0.0.1"),
        lambda d: d["program"]["parts"].update(donated="[0]"),
        lambda d: d.update(key="0" * 64),
    ],
    ids=["environment", "program", "key"],
)
def test_a_tampered_manifest_is_corrupt(saved, deserialize_calls, edit):
    folder, _ = saved
    _edit_manifest(folder, edit, rekey=False)
    with pytest.raises(aot.CorruptArtifactError) as info:
        Artifact.open(folder)
    assert "does not match its fingerprints; the manifest was altered" in str(info.value)
    assert deserialize_calls == []


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["args"][0].update(shape=[16, 8]),  # same size: XLA would not notice
        lambda d: d["args"][1].update(dtype="int32"),
        lambda d: d.update(signature="f32[1]"),
    ],
    ids=["shape", "dtype", "signature"],
)
def test_tampered_argument_avals_are_corrupt(saved, edit):
    folder, _ = saved
    _edit_manifest(folder, edit, rekey=False)
    with pytest.raises(aot.CorruptArtifactError) as info:
        Artifact.open(folder)
    assert "do not match its program fingerprint (f32[8,16], f32[16,4]); the manifest was altered" in str(info.value)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"{not json", "manifest is not valid JSON"),
        (b"[1, 2]", "manifest is not a JSON object"),
        (json.dumps({"format_version": FORMAT_VERSION}).encode(), "manifest is missing or has a malformed field"),
    ],
)
def test_an_unreadable_manifest_is_corrupt(saved, content, fragment):
    folder, _ = saved
    (folder / "manifest.json").write_bytes(content)
    with pytest.raises(aot.CorruptArtifactError, match=fragment):
        Artifact.open(folder)


def test_a_folder_without_manifest_is_corrupt(tmp_path):
    with pytest.raises(aot.CorruptArtifactError, match="has no manifest.json"):
        Artifact.open(tmp_path)


def test_loader_source_has_no_pickle_marshal_or_eval():
    # The load path in the library itself (the subprocess test checks it at run time).
    import aot.artifact
    import aot.executable_checks
    import aot.jaxcompat.deserialize
    import aot.rehydrate
    import aot.shardings
    import aot.treedef

    modules = (
        aot.artifact, aot.executable_checks, aot.jaxcompat.deserialize, aot.rehydrate,
        aot.shardings, aot.treedef,
    )
    for module in modules:
        source = Path(module.__file__).read_text()
        for word in ("import pickle", "import marshal", "eval(", "exec(", "cloudpickle"):
            assert word not in source, f"{module.__name__} uses {word}"


def test_loaded_executables_have_cost_and_memory_analysis(built):
    _, kinds = built
    _, exe, _, folder, *_ = kinds["jit"]
    loaded = load_executable(Artifact.open(folder / "artifact"))
    assert loaded.cost_analysis()["flops"] == exe.cost_analysis()["flops"] > 0
    assert loaded.memory_analysis().argument_size_in_bytes == (8 * 16 + 16 * 4) * 4
