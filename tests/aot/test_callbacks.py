"""aot.callbacks: which host callbacks are bound by name, what the manifest stores of
them, and that what it stores cannot be altered or point outside the libraries."""

from __future__ import annotations

import functools
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
from aot.artifact import Artifact, Manifest
from aot.build import build_artifact
from aot.callbacks import bindable
from aot.rehydrate import load_executable
from tests.aot.helpers import assert_bitwise_equal


def checked(x):
    return eqx.error_if(x + 1.0, jnp.any(x > 10.0), "x is too large") * 3.0


def test_an_equinox_check_is_bound_by_name_and_rebound_at_load(tmp_path):
    x = np.arange(4, dtype=np.float32)
    comp = aot.lower(checked, x)
    assert [b["function"] for b in comp.host_callbacks] == [
        "equinox._errors:_error.<locals>.raises", "equinox._errors:_error.<locals>.tpu_msg",
    ]
    assert comp.host_callbacks[0]["closure"]["msgs"] == {"$": "list", "items": ["x is too large"]}
    assert comp.host_callbacks[0]["closure"]["stack"] == {"$": "list", "items": []}  # unobserved
    assert "host_callbacks" in comp.program_fingerprint.as_dict()
    exe = comp.compile()
    assert comp.portable_hlo(exe) is None  # jax.export does not serialize callbacks
    build_artifact(exe, None).save(tmp_path)
    artifact = Artifact.open(tmp_path)
    assert artifact.manifest.format_version == 4  # callbacks came in format 4: older readers refuse it
    loaded = load_executable(artifact)
    assert_bitwise_equal(loaded(x), jax.jit(checked)(x))
    with pytest.raises(Exception, match="x is too large"):
        jax.block_until_ready(loaded(x + 20.0))


def test_another_message_is_another_program():
    def make(message):
        def program(x):
            return eqx.error_if(x + 1.0, jnp.any(x > 10.0), message) * 3.0

        return program

    spec = jax.ShapeDtypeStruct((4,), jnp.float32)
    a, b = aot.lower(make("too large"), spec, name="f"), aot.lower(make("far too large"), spec, name="f")
    parts_a, parts_b = a.program_fingerprint.as_dict(), b.program_fingerprint.as_dict()
    assert parts_a["stablehlo"] == parts_b["stablehlo"]  # the HLO names a callback by index only
    assert parts_a["host_callbacks"] != parts_b["host_callbacks"]
    assert a.key != b.key


def test_an_altered_binding_is_corruption(tmp_path):
    x = np.arange(4, dtype=np.float32)
    comp = aot.lower(checked, x)
    data = build_artifact(comp.compile(), None).manifest.to_dict()
    for change in (
        lambda d: d["host_callbacks"][0]["closure"]["msgs"]["items"].__setitem__(0, "fine"),
        lambda d: d["host_callbacks"][0].__setitem__("function", "os:system"),
        lambda d: d.pop("host_callbacks"),
    ):
        altered = json.loads(json.dumps(data))
        change(altered)
        with pytest.raises(aot.CorruptArtifactError, match="host callbacks do not match"):
            Manifest.from_dict(altered)


def _model_function(x):
    return np.asarray(x)


class Holder:
    pass


def test_what_is_not_bound():
    assert "not an allow-listed library" in bindable(_model_function)
    assert "partial objects" in bindable(functools.partial(_model_function))
    assert bindable(np.sin) is not None
    holder = Holder()

    def lib_like(x):
        return holder

    lib_like.__module__ = "equinox.fake"
    assert "closure variable 'holder' holds a tests.aot.test_callbacks.Holder" in bindable(lib_like)


def test_a_model_callback_is_refused_at_lowering_naming_it():
    def f(x):
        return jax.pure_callback(_model_function, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    with pytest.raises(aot.UnsupportedComputationError) as info:
        aot.lower(f, jax.ShapeDtypeStruct((4,), jnp.float32))
    assert "'pure_callback' (jax.pure_callback) calling tests.aot.test_callbacks:_model_function" in str(info.value)


def test_a_library_check_under_pmap_is_refused_at_lowering():
    with pytest.raises(aot.UnsupportedComputationError, match="not bound under aot.lower_pmap") as info:
        aot.lower_pmap(checked, jax.ShapeDtypeStruct((2, 4), jnp.float32), devices=jax.devices()[:2])
    assert "equinox._errors:_error.<locals>.raises" in str(info.value)
    assert "EQX_ON_ERROR=nan" in str(info.value)
