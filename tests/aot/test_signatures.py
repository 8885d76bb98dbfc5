"""Signatures with pytree paths (aot.signatures): lines, compact trees folded to a
width, leaf differences, and a call's arguments in one line (the loader's errors)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import aot
from aot.signatures import (
    ArgLeaf,
    LeafDifference,
    Signature,
    describe_call,
    leaf_differences,
    path_head,
)

MLP = Signature((
    ArgLeaf("params[0]['b']", "f32[512]"), ArgLeaf("params[0]['w']", "f32[784,512]"),
    ArgLeaf("params[1]['b']", "f32[512]"), ArgLeaf("params[1]['w']", "f32[512,512]"),
    ArgLeaf("params[2]['b']", "f32[10]"), ArgLeaf("params[2]['w']", "f32[512,10]"),
    ArgLeaf("x", "f32[8,784]"),
))


def test_lines_and_flat_text() -> None:
    assert MLP.lines()[1] == "params[0]['w']: f32[784,512]"
    assert MLP.flat_text == "f32[512], f32[784,512], f32[512], f32[512,512], f32[10], f32[512,10], f32[8,784]"


@pytest.mark.parametrize(
    ("width", "text"),
    [
        (None, "params: [{b: f32[512], w: f32[784,512]}, {b: f32[512], w: f32[512,512]}, "
               "{b: f32[10], w: f32[512,10]}], x: f32[8,784]"),
        (80, "params: [{2 arrays}, {2 arrays}, {2 arrays}], x: f32[8,784]"),
        (40, "params: [6 arrays], x: f32[8,784]"),
        (20, "..., x: f32[8,784]"),
        (12, "par ... 784]"),
    ],
)
def test_compact_folds_inner_levels_first(width: int | None, text: str) -> None:
    assert MLP.compact(width) == text
    if width is not None:
        assert len(text) <= width


def test_a_flat_signature_is_shortened_between_avals() -> None:
    flat = Signature.flat(MLP.flat_text)
    assert flat.compact(40) == "f32[512], ..., f32[512,10], f32[8,784]"
    assert flat.compact(60) == "f32[512], f32[784,512], ..., f32[512,10], f32[8,784]"
    assert flat.compact(5) == "f32[512], ..., f32[8,784]"  # never inside an aval, even when too wide


def test_compact_of_namedtuples_dicts_and_keyword_arguments() -> None:
    Batch = collections.namedtuple("Batch", "x y")
    signature = Signature.from_specs(
        [Batch(aot.spec("f32[2]"), aot.spec("i32[]"))], {"bias": aot.spec("f32[3]")}, ["batch"],
    )
    assert signature.lines() == ["batch.x: f32[2]", "batch.y: i32[]", "bias: f32[3]"]
    assert signature.compact() == "batch: (x=f32[2], y=i32[]), bias: f32[3]"
    unnamed = Signature.from_specs([aot.spec("f32[2]"), {"k": aot.spec("f32[1]")}])
    assert unnamed.compact() == "args[0]: f32[2], args[1]: {k: f32[1]}"


def test_flat_signature_without_paths() -> None:
    flat = Signature.flat("f32[8], f32[2,3]")
    assert flat.leaves == (ArgLeaf("", "f32[8]"), ArgLeaf("", "f32[2,3]"))
    assert not flat.has_paths and flat.compact() == "f32[8], f32[2,3]"
    assert Signature.from_manifest_json("not json", "f32[1]") == Signature.flat("f32[1]")


def test_leaf_differences_by_path_and_by_position() -> None:
    asked = Signature(MLP.leaves[:-1] + (ArgLeaf("x", "f32[4,784]"),))
    assert leaf_differences(MLP, asked) == (LeafDifference("x", "f32[8,784]", "f32[4,784]"),)
    assert leaf_differences(MLP, asked)[0].describe() == "x: stored f32[8,784], got f32[4,784]"
    # A request without paths is compared by position and named after the stored side.
    positional = Signature.flat(asked.flat_text)
    assert leaf_differences(MLP, positional) == (LeafDifference("x", "f32[8,784]", "f32[4,784]"),)
    shorter = Signature(MLP.leaves[:4] + (ArgLeaf("x", "f32[8,784]"), ArgLeaf("y", "f32[1]")))
    assert [d.describe() for d in leaf_differences(MLP, shorter)] == [
        "params[2]['b']: stored f32[10], missing from the request",
        "params[2]['w']: stored f32[512,10], missing from the request",
        "y: not in the stored signature (got f32[1])",
    ]


def test_path_head() -> None:
    assert path_head("params[0]['b']") == "params"
    assert path_head("args[3]['w']") == "args[3]"
    assert path_head("batch.x") == "batch"
    assert path_head("x") == "x"


def test_describe_call_is_one_phrase_per_argument() -> None:
    params = [{"b": np.zeros(3, np.float32), "w": np.zeros((2, 3), np.float32)}]
    assert describe_call([params, [1.0] * 1000], {}, ["params", "x"]) == (
        "params: [{b: f32[3], w: f32[2,3]}], x: a list of 1000 Python floats"
    )
    assert describe_call([None, (), {"a": 1}], {"k": 3}, ["a"]) == (
        "a: None, args[1]: an empty tuple, args[2]: a dict of 1 Python int, k: Python int 3"
    )


def test_the_display_dtype_table_says_what_aot_specs_says() -> None:
    """Listings name dtypes without JAX (aot.dtype_names.SHORT_DTYPES); every dtype and
    typed key aot.specs offers reads exactly as aot.specs prints it."""
    from aot.signatures import short_dtype
    from aot.jaxcompat.dtypes import prng_key_dtypes
    from aot.specs import DTYPES, dtype_name, dtype_to_str

    for short, dtype in DTYPES.items():
        assert short_dtype(dtype_to_str(dtype)) == dtype_name(dtype) == short
        assert short_dtype(short) == short
    keys = prng_key_dtypes()
    assert "key<fry>" in keys
    for name, dtype in keys.items():
        assert short_dtype(dtype_to_str(dtype)) == dtype_name(dtype) == name
    assert short_dtype("pred") == "bool"
    with pytest.raises(ValueError, match="unknown dtype 'float7'"):
        short_dtype("float7")
    args = [{"path": "k", "shape": [2], "dtype": "key<fry>"}, {"path": "w", "shape": [3], "dtype": "int4"}]
    assert Signature.from_manifest_args(args).compact() == "k: key<fry>[2], w: i4[3]"
