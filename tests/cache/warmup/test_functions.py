"""Resolving warmup items: static values (``--static NAME=JSON``, a manifest's
``static = {...}``) for every kind of parameter, compiled, stored and served."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import aot
from aot.cache.warmup.functions import compile_item, item_signature, place_statics
from aot.cache.warmup.manifest import WarmupItem
from aot.errors import TargetError

MODULE = "aot_static_functions"
SOURCE = '''\
import jax.numpy as jnp


def middle(x, n, y):
    return x * n + y


def flag(x, training=False):
    return x * (2.0 if training else 1.0)


def positional(x, n, /):
    return x + n


def keyword_only(x, *, n):
    return x - n
'''


@pytest.fixture
def functions_folder(tmp_path: Path):
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    yield str(tmp_path)
    sys.modules.pop(MODULE, None)


def _fn(name: str, folder: str):
    from aot.cache.warmup.functions import resolve_function

    return resolve_function(f"{MODULE}:{name}", base_dir=folder)


def test_place_statics_puts_each_value_where_the_function_takes_it(functions_folder: str) -> None:
    middle = _fn("middle", functions_folder)
    # Between two dynamic arguments: inserted at its position.
    assert place_statics(middle, ("A", "B"), {"n": 3}) == (("A", 3, "B"), {"static_argnums": (1,)})
    # Nothing dynamic after it: by keyword.
    assert place_statics(_fn("flag", functions_folder), ("A",), {"training": True}) == (
        ("A",), {"training": True, "static_argnames": ("training",)}
    )
    assert place_statics(_fn("positional", functions_folder), ("A",), {"n": 2}) == (("A", 2), {"static_argnums": (1,)})
    assert place_statics(_fn("keyword_only", functions_folder), ("A",), {"n": 1}) == (
        ("A",), {"n": 1, "static_argnames": ("n",)}
    )
    with pytest.raises(TargetError, match=r"static 'm' is not a parameter of middle \(its parameters: x, n, y\)"):
        place_statics(middle, ("A",), {"m": 1})


@pytest.mark.parametrize(
    ("function", "args", "static", "expected"),
    [
        ("middle", ("f32[3]", "f32[3]"), (("n", 3),), lambda x: x * 3 + x),
        ("flag", ("f32[3]",), (("training", True),), lambda x: x * 2),
        ("positional", ("f32[3]",), (("n", 2),), lambda x: x + 2),
        ("keyword_only", ("f32[3]",), (("n", 1),), lambda x: x - 1),
    ],
    ids=["between dynamic args", "positional-or-keyword", "positional-only", "keyword-only"],
)
def test_a_static_of_every_kind_is_compiled_stored_and_served(
    open_folder_cache, functions_folder: str, function: str, args, static, expected  # noqa: ANN001
) -> None:
    cache = open_folder_cache()
    item = WarmupItem(name=f"static.{function}", function=f"{MODULE}:{function}", args=args, static=static, base_dir=functions_folder)
    result = compile_item(cache, item)
    # Statics are part of the signature; coverage computes the same one without lowering.
    (key, value), = static
    assert not result.hit and result.entry.signature == ", ".join(["f32[3]"] * len(args) + [f"{key}={value!r}"])
    assert item_signature(item) == result.entry.signature
    assert compile_item(cache, item).hit  # the same key from the same item
    fn = aot.load(item.name, cache=cache)
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(fn(*([x] * len(args)))), expected(x))
