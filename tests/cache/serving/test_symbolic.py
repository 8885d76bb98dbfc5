"""Serving symbolic entries and padding to buckets: aot.load compiles a stored
shape-polymorphic program for each new concrete shape (no tracing, no model code) and
stores it; strict mode refuses; pad= serves other sizes from stored buckets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
from aot.errors import SignatureNotFoundError, SpecError

SYMBOLIC = "mlp.symbolic"
PARAMS = "f32[512], f32[784,512], f32[512], f32[512,512], f32[10], f32[512,10]"


def _bitwise(actual, expected) -> None:  # noqa: ANN001
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.tobytes() == expected.tobytes()


@pytest.fixture(scope="module")
def mlp_symbolic(compiled):  # noqa: ANN001, ANN201
    """The MLP lowered once for any batch size ``b``."""
    return aot.lower(
        compiled.models.mlp_forward, compiled.param_specs, "f32[b,784]", name=SYMBOLIC
    )


@pytest.fixture(scope="module")
def reference(compiled):  # noqa: ANN001, ANN201
    forward = jax.jit(compiled.models.mlp_forward)
    inputs = {b: compiled.models.mlp_input(b, seed=b) for b in (3, 5, 6)}
    return inputs, {b: np.asarray(forward(compiled.params, x)) for b, x in inputs.items()}


def test_a_symbolic_entry_serves_any_batch_and_stores_each(
    cache, compiled, mlp_symbolic, reference, jax_work  # noqa: ANN001
) -> None:
    inputs, expected = reference
    entry = cache.put(mlp_symbolic)
    assert entry.exe_digest is None and entry.hlo_digest is not None
    assert entry.signature == PARAMS + ", f32[b,784]"
    fn = aot.load(SYMBOLIC, cache=cache)
    assert fn.signatures == [PARAMS + ", f32[b,784]"]
    for b in (3, 5):
        _bitwise(fn(compiled.params, inputs[b]), expected[b])
    entries = cache.entries(SYMBOLIC)
    assert len(entries) == 3
    concrete = [e for e in entries if e.exe_digest is not None]
    assert sorted(e.signature.rsplit(", ", 1)[1] for e in concrete) == ["f32[3,784]", "f32[5,784]"]
    # Each concrete entry shares the symbolic portable HLO (one blob).
    assert {e.hlo_digest for e in entries} == {entry.hlo_digest}
    # A new dispatcher serves the stored shapes with no trace, lowering or compile.
    with jax_work as work:
        again = aot.load(SYMBOLIC, cache=cache)
        _bitwise(again(compiled.params, inputs[3]), expected[3])
    assert work.events == []
    # The same call twice in one dispatcher compiles once.
    _bitwise(fn(compiled.params, inputs[5]), expected[5])
    assert len(cache.entries(SYMBOLIC)) == 3


def test_strict_refuses_to_compile_and_lists_the_concrete_shapes(
    open_folder_cache, compiled, mlp_symbolic, reference  # noqa: ANN001
) -> None:
    inputs, expected = reference
    cache = open_folder_cache()
    cache.put(mlp_symbolic)
    aot.load(SYMBOLIC, cache=cache)(compiled.params, inputs[3])  # stores b=3
    strict = aot.load(SYMBOLIC, cache=cache, strict=True)
    _bitwise(strict(compiled.params, inputs[3]), expected[3])
    with pytest.raises(SignatureNotFoundError) as info:
        strict(compiled.params, inputs[5])
    message = str(info.value)
    assert "no executable compiled for (" in message and "f32[5,784])" in message
    assert "would serve it (b=5), but strict=True forbids compiling" in message
    assert f"Concrete signatures stored:\n  {PARAMS}, f32[3,784]\nCompile this shape in CI" in message
    assert len(info.value.available) == 1 and info.value.available[0].endswith("f32[3,784]")
    assert len(cache.entries(SYMBOLIC)) == 2  # nothing written


def test_shapes_the_symbolic_signature_cannot_take_say_why(
    open_folder_cache, compiled, mlp_symbolic  # noqa: ANN001
) -> None:
    cache = open_folder_cache()
    cache.put(mlp_symbolic)
    fn = aot.load(SYMBOLIC, cache=cache)
    with pytest.raises(SignatureNotFoundError) as info:
        fn(compiled.params, np.zeros((4, 783), np.float32))
    assert "does not fit: x: dimension 1 is 783, not 784" in str(info.value)
    with pytest.raises(SignatureNotFoundError, match=r"does not fit: x: f16\[4,784\] is not float32"):
        fn(compiled.params, np.zeros((4, 784), np.float16))
    assert len(cache.entries(SYMBOLIC)) == 1


def test_constraints_are_checked_before_compiling(open_folder_cache) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put(aot.lower(lambda x: x * 2, aot.spec("f32[b]", constraints=["b >= 4"]), name="c"))
    fn = aot.load("c", cache=cache)
    np.testing.assert_array_equal(np.asarray(fn(np.ones(4, np.float32))), np.full(4, 2, np.float32))
    with pytest.raises(SignatureNotFoundError, match="constraint b >= 4"):
        fn(np.ones(2, np.float32))
    paired = aot.lower(lambda x, y: x[::2] + y, "f32[2*b]", "f32[b]", name="pair")
    cache.put(paired)
    fn = aot.load("pair", cache=cache)
    np.testing.assert_array_equal(np.asarray(fn(np.arange(6, dtype=np.float32), np.ones(3, np.float32))), [1, 3, 5])
    with pytest.raises(SignatureNotFoundError, match="Division had remainder 1"):
        fn(np.ones(7, np.float32), np.ones(3, np.float32))


def test_a_read_only_cache_compiles_but_stores_nothing(
    open_folder_cache, compiled, mlp_symbolic, reference  # noqa: ANN001
) -> None:
    inputs, expected = reference
    open_folder_cache().put(mlp_symbolic)
    reader = open_folder_cache(read_only=True)
    fn = aot.load(SYMBOLIC, cache=reader)
    _bitwise(fn(compiled.params, inputs[6]), expected[6])
    assert len(open_folder_cache().entries(SYMBOLIC)) == 1


def test_cache_compile_with_symbolic_specs_stores_and_returns_a_dispatcher(
    open_folder_cache,  # noqa: ANN001
) -> None:
    cache = open_folder_cache()

    def scale(x, s):  # noqa: ANN001, ANN202
        return x * s

    fn = cache.compile(scale, "f32[n,3]", "f32[]", name="scale")
    assert fn.signatures == ["f32[n,3], f32[]"]
    out = fn(np.ones((2, 3), np.float32), np.float32(4))
    np.testing.assert_array_equal(np.asarray(out), np.full((2, 3), 4, np.float32))
    result = cache.compile_entry(scale, "f32[n,3]", "f32[]", name="scale")
    assert result.hit and result.executable is None and result.entry.exe_digest is None
    with pytest.raises(aot.ReadOnlyCacheError, match="symbolic program"):
        open_folder_cache(read_only=True).compile_entry(scale, "f32[m,3]", "f32[]", name="scale")


def test_concurrent_first_calls_compile_one_entry(open_folder_cache) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put(aot.lower(lambda x: jnp.cumsum(x), "f32[b]", name="cumsum"))
    fn = aot.load("cumsum", cache=cache)
    results: list[object] = [None] * 4

    def call(i: int) -> None:
        results[i] = np.asarray(fn(np.ones(9, np.float32)))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        np.testing.assert_array_equal(r, np.arange(1, 10, dtype=np.float32))
    assert len(cache.entries("cumsum")) == 2


def test_verify_gc_and_a_missing_blob(open_folder_cache, compiled, mlp_symbolic, reference) -> None:  # noqa: ANN001
    inputs, _ = reference
    cache = open_folder_cache()
    symbolic = cache.put(mlp_symbolic)
    aot.load(SYMBOLIC, cache=cache)(compiled.params, inputs[3])
    report = cache.verify()
    assert report.ok and report.checked_entries == 2 and report.problems == ()
    plan = cache.gc(dry_run=True)
    assert plan.entries == () and plan.blobs == ()
    concrete = [e for e in cache.entries(SYMBOLIC) if e.exe_digest is not None][0]
    cache.quarantine(concrete, "test: collect it")
    plan = cache.gc()
    # The concrete entry, its executable and its manifest go; the shared portable HLO stays.
    assert [v.key for v in plan.entries] == [concrete.key]
    assert set(plan.blobs) == {concrete.exe_digest, concrete.manifest_digest}
    assert cache.blobs.check(symbolic.hlo_digest) is None
    assert [e.key for e in cache.entries(SYMBOLIC)] == [symbolic.key]
    # A symbolic entry whose portable HLO is gone is a problem, and is quarantined.
    cache.blobs.delete(symbolic.hlo_digest)
    report = cache.verify()
    assert [p.key for p in report.problems] == [symbolic.key]
    assert "portable_hlo blob" in report.problems[0].what
    with pytest.raises(SignatureNotFoundError):  # quarantined: not served
        aot.load(SYMBOLIC, cache=cache)(compiled.params, inputs[5])


def test_a_concrete_entry_of_a_symbolic_program_recompiles_in_another_environment(
    open_folder_cache, compiled, mlp_symbolic, reference, foreign, tmp_path  # noqa: ANN001
) -> None:
    """A concrete entry compiled from a symbolic one keeps the symbolic portable HLO:
    the cross-checks bind its shapes to the HLO's instead of calling it another
    program, so another environment recompiles it (and verify finds it clean)."""
    inputs, expected = reference
    source = open_folder_cache()
    source.put(mlp_symbolic)
    aot.load(SYMBOLIC, cache=source)(compiled.params, inputs[3])
    concrete = next(e for e in source.entries(SYMBOLIC) if e.exe_digest is not None)
    elsewhere = foreign(source.artifact(concrete), jaxlib="0.0.1")
    cache = aot.Cache(tmp_path / "elsewhere")  # the concrete entry only
    cache.put_artifact(elsewhere)
    assert cache.verify().ok
    fn = aot.load(SYMBOLIC, cache=cache)  # recompiles from the portable HLO at start-up
    _bitwise(fn(compiled.params, inputs[3]), expected[3])
    local = [e for e in cache.entries(SYMBOLIC) if e.env_fp == cache.environment.digest]
    assert [e.signature.rsplit(", ", 1)[1] for e in local] == ["f32[3,784]"]
    assert cache.verify().ok


def test_loading_a_symbolic_entry_by_key_says_how_to_serve_it(open_folder_cache, mlp_symbolic) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    entry = cache.put(mlp_symbolic)
    with pytest.raises(aot.SymbolicShapeError, match=r"is a symbolic entry.*aot\.load\(name\)"):
        cache.get(entry.key)


# ---------------------------------------------------------------- a fresh process

_SERVER = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class NoModelCode(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "fixtures" or name.startswith("fixtures."):
                raise ImportError(f"the serving process must not import {name}")
            return None

    sys.meta_path.insert(0, NoModelCode())
    try:
        import fixtures.models
    except ImportError:
        pass
    else:
        raise SystemExit("the import guard does not work")

    import jax.monitoring
    import numpy as np
    import aot

    cache, data = sys.argv[1], np.load(sys.argv[2], allow_pickle=False)
    params = [{"b": data[f"b{i}"], "w": data[f"w{i}"]} for i in range(3)]
    traced = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: traced.append(event) if "jaxpr_trace" in event else None
    )
    fn = aot.load("mlp.symbolic", cache=cache)
    out = np.asarray(fn(params, data["x"]))
    print(json.dumps({
        "equal": out.tobytes() == data["y"].tobytes() and out.dtype == data["y"].dtype,
        "signatures": fn.signatures,
        "traced": [e for e in traced],
        "model_imported": any(m.startswith("fixtures") for m in sys.modules),
    }))
    """
)


@pytest.mark.slow
def test_a_fresh_process_without_the_model_compiles_from_the_symbolic_hlo(
    open_folder_cache, compiled, mlp_symbolic, reference, tmp_path: Path  # noqa: ANN001
) -> None:
    inputs, expected = reference
    cache = open_folder_cache()
    cache.put(mlp_symbolic)
    arrays = {"x": np.asarray(inputs[6]), "y": expected[6]}
    for i, layer in enumerate(compiled.params):
        arrays[f"b{i}"], arrays[f"w{i}"] = np.asarray(layer["b"]), np.asarray(layer["w"])
    np.savez(tmp_path / "io.npz", **arrays)
    cache.close()
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, "-c", _SERVER, cache.location, str(tmp_path / "io.npz")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["equal"] and not result["model_imported"]
    # exported.call is traced (the stored HLO, not the model), nothing else.
    assert len(result["traced"]) <= 2
    entries = open_folder_cache().entries(SYMBOLIC)
    assert sorted(e.signature.rsplit(", ", 1)[1] for e in entries) == ["f32[6,784]", "f32[b,784]"]


# ---------------------------------------------------------------- padding


def step(x, w):  # noqa: ANN001, ANN201
    h = x @ w
    return {"h": h, "rowsum": h.sum(axis=1), "total": h.sum()}


@pytest.fixture
def buckets(open_folder_cache):  # noqa: ANN001, ANN201
    cache = open_folder_cache()
    for b in (2, 8):
        cache.compile(step, f"f32[{b},4]", "f32[4,3]", name="step")
    return cache


def _xw(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n)
    return rng.standard_normal((n, 4), np.float32), rng.standard_normal((4, 3), np.float32)


def test_pad_serves_the_smallest_bucket_that_fits_and_slices_outputs(
    buckets, jax_work, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    fn = aot.load("step", cache=buckets, pad={"x": 0})
    used: list[str] = []
    for program in fn.programs.concrete.values():
        executable = fn.programs.executable(program)
        real = executable.bind  # once per kind of call: a padded size, an exact one
        monkeypatch.setattr(
            executable, "bind",
            lambda t, _real=real, _sig=program.signature: (used.append(_sig), _real(t))[1],
        )
    reference = jax.jit(step)
    for n, bucket in ((1, 2), (2, 2), (5, 8), (8, 8)):
        x, w = _xw(n)
        out = fn(x, w)
        # What the bucket's program computes for the padded rows, sliced back: XLA
        # picks kernels by shape, so a program for exactly n rows may differ in the
        # last bits (docs/symbolic.md).
        expected = reference(np.pad(x, ((0, bucket - n), (0, 0))), w)
        for key in ("h", "rowsum"):
            _bitwise(out[key], np.asarray(expected[key])[:n])
        assert out["h"].shape == (n, 3) and out["rowsum"].shape == (n,)
        # Zero rows add nothing to a sum: this reduction happens to survive padding.
        _bitwise(out["total"], expected["total"])
        np.testing.assert_allclose(out["h"], reference(x, w)["h"], rtol=1e-5, atol=1e-6)
        assert used[-1] == f"f32[{bucket},4], f32[4,3]"
    with jax_work as work:  # a size seen before: nothing traced or compiled at all
        fn(*_xw(5))
    assert work.events == []
    assert len(buckets.entries("step")) == 2  # padding compiles and stores nothing


def test_pad_refuses_when_no_bucket_is_large_enough(buckets) -> None:  # noqa: ANN001
    fn = aot.load("step", cache=buckets, pad={"x": 0})
    with pytest.raises(SignatureNotFoundError) as info:
        fn(*_xw(9))
    assert str(info.value).startswith(
        "step: 9 rows do not fit any stored bucket: the largest is 8 (f32[8,4], f32[4,3])"
    )
    # Other dimensions differ: not a padding question, the ordinary miss.
    with pytest.raises(SignatureNotFoundError, match="Stored signatures"):
        fn(np.zeros((2, 5), np.float32), np.zeros((5, 3), np.float32))


def test_pad_configuration_errors(buckets) -> None:  # noqa: ANN001
    with pytest.raises(SpecError, match="pad: no input is named 'y'; the stored inputs are w, x"):
        aot.load("step", cache=buckets, pad={"y": 0})
    with pytest.raises(SpecError, match="is not an axis"):
        aot.load("step", cache=buckets, pad={"x": -1})
    with pytest.raises(SpecError, match="output axis to slice is ambiguous"):
        aot.load("step", cache=buckets, pad={"x": 0, "w": 1})
    fn = aot.load("step", cache=buckets, pad={"x": 0}, pad_outputs={"['nope']": 0})
    with pytest.raises(SpecError, match=r"does not return; its outputs are \"\['h'\]\""):
        fn(*_xw(3))
    fn = aot.load("step", cache=buckets, pad={"x": 0}, pad_outputs={"['total']": 0})
    with pytest.raises(aot.AvalMismatchError, match=r"output \"\['total'\]\" has shape \(\)"):
        fn(*_xw(3))


def test_pad_outputs_mapping_slices_only_the_named_outputs(buckets) -> None:  # noqa: ANN001
    fn = aot.load("step", cache=buckets, pad={"x": 0}, pad_outputs={"['h']": 0})
    x, w = _xw(3)
    out = fn(x, w)
    assert out["h"].shape == (3, 3) and out["rowsum"].shape == (8,)
    _bitwise(out["h"], np.asarray(jax.jit(step)(np.pad(x, ((0, 5), (0, 0))), w)["h"])[:3])


def test_pad_a_device_array_and_a_pytree_argument(open_folder_cache) -> None:  # noqa: ANN001
    cache = open_folder_cache()

    def score(batch, w):  # noqa: ANN001, ANN202
        return (batch["x"] @ w) * batch["mask"][:, None]

    for b in (4, 16):
        cache.compile(score, {"x": f"f32[{b},4]", "mask": f"f32[{b}]"}, "f32[4,2]", name="score")
    fn = aot.load("score", cache=cache, pad={"batch": 0}, pad_value=0)
    rng = np.random.default_rng(1)
    batch = {"x": jnp.asarray(rng.standard_normal((6, 4), np.float32)), "mask": jnp.ones(6, np.float32)}
    w = rng.standard_normal((4, 2), np.float32)
    out = fn(batch, w)
    assert isinstance(out, jax.Array) and out.shape == (6, 2)
    padded = jax.tree_util.tree_map(lambda a: jnp.pad(a, [(0, 10)] + [(0, 0)] * (a.ndim - 1)), batch)
    _bitwise(out, np.asarray(jax.jit(score)(padded, w))[:6])
    with pytest.raises(aot.AvalMismatchError, match="same size along their padded axes"):
        fn({"x": batch["x"], "mask": jnp.ones(5, np.float32)}, w)


def test_pad_prefers_a_bucket_to_compiling_the_symbolic_entry(buckets) -> None:  # noqa: ANN001
    buckets.put(aot.lower(step, "f32[b,4]", "f32[4,3]", name="step"))
    fn = aot.load("step", cache=buckets, pad={"x": 0})
    fn(*_xw(5))
    assert len(buckets.entries("step")) == 3  # 2 buckets + the symbolic entry: no compile
    # Too large for every bucket: the symbolic entry compiles the exact shape ...
    x, w = _xw(11)
    _bitwise(fn(x, w)["h"], jax.jit(step)(x, w)["h"])
    assert len(buckets.entries("step")) == 4
    # ... which strict mode forbids: refused, naming the largest bucket.
    strict = aot.load("step", cache=buckets, pad={"x": 0}, strict=True)
    with pytest.raises(SignatureNotFoundError, match="12 rows do not fit any stored bucket: the largest is 11"):
        strict(*_xw(12))
