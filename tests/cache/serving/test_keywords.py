"""Calls jax.jit takes: arguments by keyword where the entry was compiled with them by
position, and the reverse, served bit-identical to jax.jit."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
from aot.errors import SignatureNotFoundError


def f(x: jax.Array, y: jax.Array, scale: jax.Array) -> jax.Array:
    return jnp.tanh(x @ y) * scale - x.sum()


@pytest.fixture
def inputs() -> tuple[jax.Array, jax.Array, jax.Array]:
    keys = jax.random.split(jax.random.key(0), 3)
    return (jax.random.normal(keys[0], (4, 4)), jax.random.normal(keys[1], (4, 4)),
            jax.random.normal(keys[2], (4,)))


def _same(a: jax.Array, b: jax.Array) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_keyword_calls_of_a_positional_entry_match_jit(tmp_path: Path, inputs) -> None:  # noqa: ANN001
    x, y, s = inputs
    cache = aot.Cache(tmp_path / "c")
    cache.compile(f, x, y, s, name="kw.positional")
    serve = aot.load("kw.positional", cache=cache)
    want = jax.jit(f)(x, y, s)
    for _ in range(3):  # the first call of each form, then its remembered kind
        _same(serve(x, y, s), want)
        _same(serve(x, y, scale=s), want)
        _same(serve(x, scale=s, y=y), want)
        _same(serve(scale=s, x=x, y=y), want)
    with pytest.raises(SignatureNotFoundError):  # given twice: jax.jit refuses it too
        serve(x, y, s, x=x)
    with pytest.raises(SignatureNotFoundError):
        serve(x, y, z=s)


def test_positional_calls_of_a_keyword_entry_match_jit(tmp_path: Path, inputs) -> None:  # noqa: ANN001
    x, y, s = inputs
    cache = aot.Cache(tmp_path / "c")
    cache.compile(f, x, y=y, scale=s, name="kw.keyword")
    serve = aot.load("kw.keyword", cache=cache)
    want = jax.jit(f)(x, y=y, scale=s)
    for _ in range(3):
        _same(serve(x, y=y, scale=s), want)
        _same(serve(x, y, s), want)
        _same(serve(x, y, scale=s), want)
    # Keyword calls and exact calls count on the one stored signature.
    cache.stats.flush()
    from aot.cache.reports.stats import read_stats

    assert [r.calls for r in read_stats(cache, "kw.keyword").rows] == [9]


def step(x: jax.Array, y: jax.Array) -> jax.Array:
    return x * 2.0 + y


def test_a_prejitted_functions_donation_is_served_as_under_jit(tmp_path: Path) -> None:
    cache = aot.Cache(tmp_path / "c")
    jitted = jax.jit(step, donate_argnums=0)
    spec = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    cache.compile(jitted, spec, spec, name="donated.step")
    serve = aot.load("donated.step", cache=cache)
    for _ in range(3):
        x, y = jnp.arange(64.0).reshape(8, 8), jnp.ones((8, 8))
        x_jit = jnp.arange(64.0).reshape(8, 8)
        want = jitted(x_jit, y)
        _same(serve(x, y), want)
        assert x.is_deleted() and x_jit.is_deleted()  # donated, as jax.jit does
        assert not y.is_deleted()


def test_donation_given_twice_and_differently_is_refused(tmp_path: Path) -> None:
    cache = aot.Cache(tmp_path / "c")
    spec = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    with pytest.raises(aot.AotError) as caught:
        cache.compile(jax.jit(step, donate_argnums=0), spec, spec, name="donated.twice", donate_argnums=1)
    assert str(caught.value) == (
        "donated.twice: donate_argnums=[1] was given, but the function is already wrapped "
        "in jax.jit with donate_argnums=[0]; give it once (pass the unwrapped function, "
        "or drop the argument here)"
    )


def test_a_compiled_executable_takes_keywords_as_jit_does(tmp_path: Path, inputs) -> None:  # noqa: ANN001
    x, y, s = inputs
    cache = aot.Cache(tmp_path / "c")
    compiled = cache.compile(f, x, y, scale=s, name="kw.executable")
    loaded = cache.compile(f, x, y, scale=s, name="kw.executable")  # a hit: loaded from the store
    want = jax.jit(f)(x, y, scale=s)
    for fn in (compiled, loaded):
        for _ in range(2):
            _same(fn(x, y, scale=s), want)
            _same(fn(x, y=y, scale=s), want)
            _same(fn(x, y, s), want)
        with pytest.raises(aot.AotError):
            fn(x, y, s, y=y)
