"""Statics are part of a signature: two static values under one name are two entries,
each served by the call that passes it (aot.cache.serving.statics)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
from aot.artifact import Manifest
from aot.errors import CorruptArtifactError, UnsupportedComputationError
from aot.statics import StaticArg, canonical_text

MODEL = textwrap.dedent(
    """
    import jax

    def forward(x, act, scale=1.0):
        y = jax.nn.relu(x) if act == "relu" else jax.nn.gelu(x)
        return y * scale
    """
)

SERVE = textwrap.dedent(
    """
    import importlib.abc, json, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.startswith("statics_model"):
                raise ImportError("the serving process must not import the model")
    sys.meta_path.insert(0, Block())
    import jax.numpy as jnp, numpy as np, aot
    location, blobs, out = sys.argv[1], sys.argv[2] or None, sys.argv[3]
    cache = aot.Cache(location, blob_location=blobs, read_only=True)
    f = aot.load("model.forward", cache=cache, strict=True)
    x = jnp.linspace(-3, 3, 16, dtype=jnp.float32)
    results = {
        "relu_positional": f(x, "relu"), "relu_keyword": f(x, act="relu"),
        "gelu_positional": f(x, "gelu"), "gelu_keyword": f(x, act="gelu"),
    }
    json.dump({k: np.asarray(v).tobytes().hex() for k, v in results.items()}, open(out, "w"))
    """
)


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    folder = tmp_path / "model_code"
    folder.mkdir()
    (folder / "statics_model.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(folder))
    import importlib

    sys.modules.pop("statics_model", None)
    return importlib.import_module("statics_model")


def _compile_both(cache: Any, model: Any) -> list[Any]:
    return [
        cache.compile(model.forward, "f32[16]", act, static_argnums=1, name="model.forward")
        for act in ("relu", "gelu")
    ]


def test_two_statics_are_two_signatures(cache: Any, model: Any) -> None:
    relu, gelu = _compile_both(cache, model)
    assert relu.signature == "f32[16], act='relu'"
    assert gelu.signature == "f32[16], act='gelu'"
    assert relu.key != gelu.key
    rows = {e.signature: e.key for e in cache.entries(name="model.forward")}
    assert rows == {"f32[16], act='relu'": relu.key, "f32[16], act='gelu'": gelu.key}
    manifest = Manifest.from_json(cache.entries(name="model.forward")[0].manifest)
    assert manifest.format_version == 3  # statics came in format 3; no callbacks: not 4
    assert [s.to_dict() for s in manifest.statics] in (
        [{"index": 1, "name": "act", "repr": "'relu'"}], [{"index": 1, "name": "act", "repr": "'gelu'"}],
    )


def test_each_static_serves_its_own_program_in_a_process_without_the_model(
    open_cache: Any, model: Any, tmp_path: Path,
) -> None:
    cache = open_cache()
    _compile_both(cache, model)
    out = tmp_path / "served.json"
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, open_cache.location, open_cache.blob_location or "", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    served = json.loads(out.read_text())
    x = jnp.linspace(-3, 3, 16, dtype=jnp.float32)
    reference = jax.jit(model.forward, static_argnames="act")
    for act in ("relu", "gelu"):
        expected = np.asarray(reference(x, act=act)).tobytes().hex()
        assert served[f"{act}_positional"] == expected
        assert served[f"{act}_keyword"] == expected
    assert served["relu_positional"] != served["gelu_positional"]


def test_a_wrong_static_lists_the_stored_values(cache: Any, model: Any) -> None:
    _compile_both(cache, model)
    served = aot.load("model.forward", cache=cache)
    x = jnp.ones(16, jnp.float32)
    with pytest.raises(aot.SignatureNotFoundError) as info:
        served(x, "tanh")
    assert str(info.value).startswith(
        "model.forward: act='tanh' is not stored; stored: act='gelu', act='relu'."
    )
    with pytest.raises(aot.SignatureNotFoundError) as info:
        served(x)
    assert "act is a static argument with several stored values (act='gelu', act='relu')" in str(info.value)
    assert sorted(info.value.available) == ["f32[16], act='gelu'", "f32[16], act='relu'"]


def test_an_omitted_static_with_one_stored_value_is_served(cache: Any, model: Any) -> None:
    cache.compile(model.forward, "f32[16]", "gelu", static_argnums=1, name="model.forward")
    served = aot.load("model.forward", cache=cache)
    x = jnp.linspace(-1, 1, 16, dtype=jnp.float32)
    expected = np.asarray(jax.jit(model.forward, static_argnums=1)(x, "gelu"))
    np.testing.assert_array_equal(np.asarray(served(x)), expected)
    np.testing.assert_array_equal(np.asarray(served(x, act="gelu")), expected)


def test_keyword_statics_and_several_of_them(cache: Any, model: Any) -> None:
    for scale in (2.0, 3.0):
        cache.compile(model.forward, "f32[16]", act="relu", scale=scale,
                      static_argnames=("act", "scale"), name="model.forward")
    assert sorted(e.signature for e in cache.entries(name="model.forward")) == [
        "f32[16], act='relu', scale=2.0", "f32[16], act='relu', scale=3.0",
    ]
    served = aot.load("model.forward", cache=cache)
    x = jnp.linspace(-1, 1, 16, dtype=jnp.float32)
    reference = jax.jit(model.forward, static_argnames=("act", "scale"))
    np.testing.assert_array_equal(np.asarray(served(x, "relu", 3.0)), np.asarray(reference(x, "relu", 3.0)))
    np.testing.assert_array_equal(np.asarray(served(x, scale=2.0)), np.asarray(reference(x, "relu", 2.0)))
    with pytest.raises(aot.SignatureNotFoundError, match=r"scale=4\.0 is not stored; stored: scale=2\.0, scale=3\.0"):
        served(x, scale=4.0)


def test_entries_without_statics_keep_the_plain_dispatcher_and_their_keys(cache: Any) -> None:
    from aot.cache.serving.dispatcher import Dispatcher

    def double(x):
        return x * 2

    exe = cache.compile(double, "f32[4]", name="double")
    assert exe.signature == "f32[4]"
    assert "statics" not in exe.program_fingerprint.as_dict()
    assert "statics" not in json.loads(cache.entries(name="double")[0].manifest)
    assert type(aot.load("double", cache=cache)) is Dispatcher


def test_a_version_2_manifest_reads_as_no_statics(cache: Any) -> None:
    def double(x):
        return x * 2

    cache.compile(double, "f32[4]", name="double")
    data = json.loads(cache.entries(name="double")[0].manifest)
    data["format_version"] = 2
    manifest = Manifest.from_dict(data)
    assert manifest.statics == () and manifest.format_version == 2


def test_an_altered_static_is_corruption(cache: Any, model: Any) -> None:
    _compile_both(cache, model)
    data = json.loads(cache.entries(name="model.forward")[0].manifest)
    other = "'gelu'" if data["statics"][0]["repr"] == "'relu'" else "'relu'"
    data["statics"][0]["repr"] = other
    data["signature"] = f"f32[16], act={other}"
    with pytest.raises(CorruptArtifactError, match="statics .* do not match its program fingerprint"):
        Manifest.from_dict(data)


def test_canonical_texts_and_refusals() -> None:
    import enum

    class Act(enum.Enum):
        RELU = "relu"

    assert canonical_text("relu") == "'relu'"
    assert canonical_text((1, 2.5, None, True)) == "(1, 2.5, None, True)"
    assert canonical_text((3,)) == "(3,)"
    assert canonical_text(Act.RELU) == "Act.RELU"
    assert canonical_text([1]) is None  # unhashable: jax.jit refuses it too
    assert canonical_text(object()) is None  # its repr names a memory address
    assert canonical_text("x" * 300) is None
    with pytest.raises(UnsupportedComputationError, match="static argument act=<object object"):
        StaticArg.of(1, "act", object(), where="model.forward")


def test_an_unstable_static_is_refused_at_lowering() -> None:
    def f(x, fn):
        return fn(x)

    with pytest.raises(UnsupportedComputationError, match="static argument fn=<function"):
        aot.lower(f, "f32[4]", lambda x: x + 1, static_argnums=1)
