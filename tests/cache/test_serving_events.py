"""JAX's monitoring events for the cache (aot.cache.serving_events): a load from the cache
records what JAX's persistent cache records for a hit, a miss what it records for a
miss, so that a dashboard counting JAX's cache counts jax-aot; compared in one test
with what JAX itself records for the same program through its persistent cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
from aot.cache import serving_events as events
from aot.cache import stats_recorder as stats_mod


class Heard:
    """Every jax.monitoring event and duration recorded while listening."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.durations: list[tuple[str, float]] = []

    def event(self, name: str, **_: Any) -> None:
        self.events.append(name)

    def duration(self, name: str, seconds: float, **_: Any) -> None:
        self.durations.append((name, seconds))

    def cache_events(self) -> list[str]:
        return [e for e in self.events if e.startswith("/jax/compilation_cache/")]

    def seconds(self, name: str) -> list[float]:
        return [s for n, s in self.durations if n == name]

    def kinds(self) -> dict[str, str]:
        """Each compilation-cache event name -> the function that recorded it."""
        out = {e: "record_event" for e in self.cache_events()}
        out.update({n: "record_event_duration_secs" for n, _ in self.durations
                    if n.startswith("/jax/compilation_cache/")})
        return out


@pytest.fixture
def heard() -> Iterator[Heard]:
    listener = Heard()
    jax.monitoring.register_event_listener(listener.event)
    jax.monitoring.register_event_duration_secs_listener(listener.duration)
    try:
        yield listener
    finally:
        jax.monitoring.unregister_event_listener(listener.event)
        jax.monitoring.unregister_event_duration_listener(listener.duration)


@pytest.fixture(autouse=True)
def _no_background_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats_mod, "FLUSH_SECONDS", None)


@pytest.mark.parametrize("mode", ["eager", "lazy", "background"])
def test_a_load_from_a_warm_cache_records_jax_hit_events(open_folder_cache, compiled, heard, mode) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    entry = cache.put(compiled.tiny)
    assert entry.compile_seconds and entry.compile_seconds > 0
    heard.events.clear()
    heard.durations.clear()
    fn = aot.load(compiled.TINY_NAME, cache=cache, lazy=mode == "lazy", background=mode == "background")
    if mode == "background":
        assert fn.wait(60)
    for _ in range(5):  # calls record nothing: the events are per load, off the call path
        np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected)
    assert heard.cache_events() == [events.COMPILE_REQUESTS, events.CACHE_HITS]
    (retrieval,) = heard.seconds(events.RETRIEVAL_TIME)
    (saved,) = heard.seconds(events.TIME_SAVED)
    assert 0 < retrieval < 60
    # JAX's formula: the stored compile time less the time the retrieval took.
    assert saved == pytest.approx(entry.compile_seconds - retrieval)
    (row,) = cache.stats.report(compiled.TINY_NAME).rows
    assert row.load_seconds == pytest.approx(retrieval)  # one measurement, two reports


def test_a_miss_records_jax_miss_events(open_folder_cache, compiled, heard) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put(compiled.mlp[1])
    fn = aot.load(compiled.MLP_NAME, cache=cache)
    heard.events.clear()
    with pytest.raises(aot.SignatureNotFoundError):
        fn(compiled.params, compiled.inputs[2])  # batch 2 is not stored
    assert heard.cache_events() == [events.COMPILE_REQUESTS, events.CACHE_MISSES]
    assert heard.seconds(events.CACHE_HITS) == []


def test_a_recompile_from_portable_hlo_is_a_miss_to_jax(open_folder_cache, compiled, foreign, heard) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put_artifact(foreign(compiled.tiny, jaxlib="0.0.1"))  # stored for another environment
    heard.events.clear()
    fn = aot.load(compiled.TINY_NAME, cache=cache)
    np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected)
    assert heard.cache_events().count(events.CACHE_MISSES) == 1
    assert events.CACHE_HITS not in heard.cache_events()


def test_the_same_events_as_jax_own_persistent_cache(tmp_path: Path, open_folder_cache, compiled, heard) -> None:  # noqa: ANN001
    """The names and recording functions JAX uses for a hit of its persistent cache (here
    through aot.jax_cache, JAX's backend: JAX records them itself) are those aot.load uses."""
    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    scale = float(np.random.default_rng().integers(2, 10**6))  # a program no earlier test compiled

    def program(x: jax.Array) -> jax.Array:
        return jnp.sin(x) * scale

    try:
        aot.jax_cache.install(str(tmp_path / "jit-cache"))
        jax.jit(program)(np.ones(4, np.float32)).block_until_ready()  # a miss, written
        assert events.CACHE_MISSES in heard.cache_events()
        jax.clear_caches()
        heard.events.clear()
        heard.durations.clear()
        jax.jit(program)(np.ones(4, np.float32)).block_until_ready()  # a hit of JAX's persistent cache
    finally:
        aot.jax_cache.uninstall()
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)
    jax_own = heard.kinds()
    assert events.CACHE_HITS in jax_own and events.CACHE_MISSES not in jax_own

    cache = open_folder_cache()
    cache.put(compiled.tiny)
    heard.events.clear()
    heard.durations.clear()
    aot.load(compiled.TINY_NAME, cache=cache)
    assert heard.kinds() == jax_own


def test_listeners_hear_each_event_once_and_never_break_a_load(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put(compiled.tiny)
    got: list[events.StatsEvent] = []

    def broken(event: events.StatsEvent) -> None:
        raise RuntimeError("a broken listener")

    events.add_listener(broken)
    events.add_listener(got.append)
    events.add_listener(got.append)  # once, however often added
    try:
        fn = aot.load(compiled.TINY_NAME, cache=cache)
        for _ in range(7):
            fn(*compiled.tiny_inputs)
        stats_mod.report_calls()
        stats_mod.report_calls()  # nothing new: nothing told
    finally:
        events.remove_listener(broken)
        events.remove_listener(got.append)
    kinds = [(e.kind, e.count) for e in got if e.name == compiled.TINY_NAME]
    assert kinds == [("serve", 1), ("load", 1), ("calls", 7)]
    assert cache.stats.flush()
    assert cache.stats.report(compiled.TINY_NAME).rows[0].calls == 7  # the index's count is unchanged
