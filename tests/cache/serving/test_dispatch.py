"""The per-call path of aot.load: JAX's C++ dispatch serves repeated calls of a
signature, and it refuses exactly what the first call refuses. Statistics stay exact
per signature, also once a second signature moves selection to Python."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
from aot.cache import stats_recorder as stats_mod
from aot.cache.reports.stats import read_stats
from aot.errors import AvalMismatchError, SignatureNotFoundError


@pytest.fixture(autouse=True)
def _no_background_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats_mod, "FLUSH_SECONDS", None)


def _calls(cache: aot.Cache, name: str) -> dict[str, int]:
    cache.stats.flush()
    return {r.signature: r.calls for r in read_stats(cache, name).rows if r.calls}


def _wrong_inputs(x: jax.Array, y: jax.Array) -> list[tuple[str, tuple, dict, type]]:
    return [
        ("shape", (x[:4], y), {}, SignatureNotFoundError),
        ("dtype", (x.astype(jnp.int32), y), {}, SignatureNotFoundError),
        ("pytree", ((x, y),), {}, SignatureNotFoundError),
        ("one input too many", (x, y, y), {}, SignatureNotFoundError),
        ("a string", (x, "y"), {}, AvalMismatchError),
        ("sharding", (jax.device_put(x, jax.devices()[1]), jax.device_put(y, jax.devices()[1])), {},
         AvalMismatchError),
    ]


def test_repeated_calls_still_refuse_what_the_first_call_refuses(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put(compiled.tiny)
    fn = aot.load(compiled.TINY_NAME, cache=cache)
    x, y = compiled.tiny_inputs
    for _ in range(3):  # the signature is now served by JAX's C++ dispatch
        np.testing.assert_array_equal(np.asarray(fn(x, y)), compiled.tiny_expected)
    for what, args, kwargs, error in _wrong_inputs(x, y):
        for attempt in range(2):  # refused again once the refusal itself was seen
            with pytest.raises(error) as caught:
                fn(*args, **kwargs)
            assert isinstance(caught.value, TypeError), what  # what jax.jit raises
            if what == "sharding":
                assert "device_put" in str(caught.value), what
    np.testing.assert_array_equal(np.asarray(fn(x, y)), compiled.tiny_expected)


def test_numpy_calls_are_served_and_counted(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    entry = cache.put(compiled.tiny)
    fn = aot.load(compiled.TINY_NAME, cache=cache)
    x, y = compiled.tiny_inputs
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(fn(x, y)), compiled.tiny_expected)
    for _ in range(2):  # float64 NumPy, as jax.jit takes it with x64 off
        out = fn(np.asarray(x, np.float64), np.asarray(y, np.float64))
        assert out.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(out), compiled.tiny_expected)
    assert _calls(cache, compiled.TINY_NAME) == {entry.signature: 5}


def test_each_signature_counts_exactly_when_several_are_called(served, compiled) -> None:  # noqa: ANN001
    cache = served
    fn = aot.load(compiled.MLP_NAME, cache=cache)
    made = dict.fromkeys(compiled.MLP_BATCHES, 0)
    for batch, n in [(1, 3), (2, 2), (1, 4), (4, 1), (2, 3)]:
        for _ in range(n):
            out = fn(compiled.params, compiled.inputs[batch])
            np.testing.assert_array_equal(np.asarray(out), compiled.expected[batch])
            made[batch] += 1
    with pytest.raises(SignatureNotFoundError):
        fn(compiled.params, compiled.inputs[4][:3])  # selected in Python now: still refused
    with pytest.raises(SignatureNotFoundError):
        fn(compiled.params[:1], compiled.inputs[1])
    expected = {compiled.mlp[b].manifest.signature: n for b, n in made.items()}
    assert _calls(cache, compiled.MLP_NAME) == expected


def test_calls_from_threads_are_all_served(served, compiled) -> None:  # noqa: ANN001
    from concurrent.futures import ThreadPoolExecutor

    cache = served
    fn = aot.load(compiled.MLP_NAME, cache=cache)

    def call(batch: int) -> None:
        np.testing.assert_array_equal(
            np.asarray(fn(compiled.params, compiled.inputs[batch])), compiled.expected[batch]
        )

    batches = [b for b in compiled.MLP_BATCHES for _ in range(20)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(call, batches))
    counted = _calls(cache, compiled.MLP_NAME)
    assert set(counted) == {a.manifest.signature for a in compiled.mlp.values()}
    assert sum(counted.values()) <= len(batches)  # may lose an increment, never adds one
