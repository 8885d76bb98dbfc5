"""What a new user reads (issue 23 item 7): a count and its noun agree ("1 hit", not
"1 hits") in show, why and aot.load's start-up error."""

from __future__ import annotations

import aot
from tests.cli.helpers import Invoke


def test_one_of_a_kind_is_singular(invoke: Invoke, warmed, cache_dir) -> None:  # noqa: ANN001
    with aot.Cache(cache_dir) as cache:
        (tiny,) = cache.entries("tiny")
        cache.get(tiny.key)  # one use
    shown = invoke("show", "tiny").stdout
    assert "UTC (1 hit)\n" in shown, shown
    why = invoke("why", "tiny", "--arg", "f32[9]", "--arg", "f32[9]").stdout
    assert why.startswith("tiny (x: f32[9], y: f32[9]): miss; nearest of 1 stored entry is "), why
