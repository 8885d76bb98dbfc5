"""What a new user sees on a miss: padded loaders' misses counted in the statistics,
and a miss that only a padded axis explains suggests pad=."""

from __future__ import annotations

import numpy as np
import pytest

import aot
from aot.cache.reports.stats import read_stats
from aot.errors import SignatureNotFoundError


def step(x, w):  # noqa: ANN001, ANN201
    return x @ w


@pytest.fixture
def buckets(open_folder_cache):  # noqa: ANN001, ANN201
    cache = open_folder_cache()
    for b in (2, 8):
        cache.compile(step, f"f32[{b},4]", "f32[4,3]", name="step")
    return cache


def test_a_padded_loaders_misses_are_counted(buckets) -> None:  # noqa: ANN001
    fn = aot.load("step", cache=buckets, pad={"x": 0})
    for _ in range(2):
        with pytest.raises(SignatureNotFoundError):
            fn(np.zeros((9, 4), np.float32), np.zeros((4, 3), np.float32))
    buckets.stats.flush()
    missed = {r.signature: r.misses for r in read_stats(buckets, "step").rows if r.misses}
    assert missed == {"f32[9,4], f32[4,3]": 2}


def test_a_miss_on_a_batch_size_suggests_pad(buckets) -> None:  # noqa: ANN001
    fn = aot.load("step", cache=buckets)
    with pytest.raises(SignatureNotFoundError) as caught:
        fn(np.zeros((5, 4), np.float32), np.zeros((4, 3), np.float32))
    assert (
        "\nOnly axis 0 of x differs from the stored (f32[8,4], f32[4,3]): "
        "aot.load('step', pad={'x': 0}) pads such calls up to a stored size (docs/symbolic.md).\n"
    ) in str(caught.value)
    # Another dimension differs too: no such suggestion.
    with pytest.raises(SignatureNotFoundError) as caught:
        fn(np.zeros((5, 5), np.float32), np.zeros((5, 3), np.float32))
    assert "pad=" not in str(caught.value)


def head(params, x):  # noqa: ANN001, ANN201
    return x @ params["params"]["Dense_0"]["kernel"] + params["params"]["Dense_1"]["bias"]


def test_a_pytree_mismatch_names_the_missing_leaf(open_folder_cache) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    params = {"params": {"Dense_0": {"kernel": np.zeros((4, 3), np.float32)},
                         "Dense_1": {"bias": np.zeros((3,), np.float32)}}}
    cache.compile(head, params, "f32[2,4]", name="head")
    fn = aot.load("head", cache=cache)
    del params["params"]["Dense_1"]["bias"]
    params["params"]["Dense_1"]["kernel"] = np.zeros((3,), np.float32)
    with pytest.raises(SignatureNotFoundError) as caught:
        fn(params, np.zeros((2, 4), np.float32))
    assert (
        "differs in pytree structure of params: params['params']['Dense_1']['bias'] is missing "
        "(stored an array)"
    ) in str(caught.value)


def test_the_stats_report_prints_as_a_table(buckets) -> None:  # noqa: ANN001
    fn = aot.load("step", cache=buckets)
    for _ in range(3):
        fn(np.zeros((2, 4), np.float32), np.zeros((4, 3), np.float32))
    buckets.stats.flush()
    report = buckets.stats.report()
    lines = str(report).splitlines()
    assert lines[0] == "NAME  SIGNATURE                 CALLS  LOADS  MISSES  RECOMPILES"
    assert lines[1] == "step  x: f32[2,4], w: f32[4,3]      3      1       0           0"
    assert lines[2] == "step  x: f32[8,4], w: f32[4,3]      0      1       0           0"
    assert lines[-1] == f"3 calls on 2 signatures; 2 loads; 0 misses; 0 recompiles ({report.location})"
    assert repr(report) == str(report)  # what an interactive prompt shows, too


def test_a_name_not_stored_counts_the_other_names_right(buckets) -> None:  # noqa: ANN001
    with pytest.raises(SignatureNotFoundError) as caught:
        aot.load("zzz", cache=buckets)
    assert "nothing is stored under 'zzz' in the cache at " in str(caught.value)
    assert " (1 other name: `aot ls` lists them)\n" in str(caught.value)


def test_a_loaded_name_with_one_signature_says_so(open_folder_cache) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.compile(step, "f32[2,4]", "f32[4,3]", name="one")
    assert repr(aot.load("one", cache=cache)) == "Dispatcher('one', 1 signature)"


def step_t(x, w):  # noqa: ANN001, ANN201
    return x.T @ w  # x is (features, batch): axis 0 is contracted


def test_a_pad_hint_is_only_given_for_an_axis_padding_can_serve(open_folder_cache) -> None:  # noqa: ANN001
    """Issue 38: a miss along a contracting axis suggested pad= on it, and following
    the hint returned a wrong-shaped result where jax.jit raises."""
    import jax

    cache = open_folder_cache()
    cache.compile(step_t, "f32[4,8]", "f32[4,3]", name="step_t")
    x, w = np.ones((3, 8), np.float32), np.ones((4, 3), np.float32)
    with pytest.raises(TypeError):
        jax.jit(step_t)(x, w)  # the contracting axis differs: no padding can be right
    fn = aot.load("step_t", cache=cache)
    with pytest.raises(SignatureNotFoundError) as caught:
        fn(x, w)
    assert "pad=" not in str(caught.value)
    # x's batch axis (1) differs, but the output has the batch on axis 0 (pad= would
    # slice axis 1): no suggestion either, rather than a wrong one.
    with pytest.raises(SignatureNotFoundError) as caught:
        fn(np.ones((4, 5), np.float32), w)
    assert "pad=" not in str(caught.value)


def test_following_the_pad_hint_matches_jit(buckets) -> None:  # noqa: ANN001
    import jax

    x, w = np.arange(20, dtype=np.float32).reshape(5, 4), np.ones((4, 3), np.float32)
    with pytest.raises(SignatureNotFoundError) as caught:
        aot.load("step", cache=buckets)(x, w)
    assert "pad={'x': 0}" in str(caught.value)
    got = aot.load("step", cache=buckets, pad={"x": 0})(x, w)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(step)(x, w)))
