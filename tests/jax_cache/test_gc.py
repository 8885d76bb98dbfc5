"""``aot gc`` of KIND jit entries end to end: real ``jax.jit`` programs stored through
aot.jax_cache, the evicted one compiled again and the kept one a hit afterwards, counted
with JAX's own monitoring events (SQLite folder cache, and PostgreSQL + S3); the plan as
the command line prints it."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

import aot
from aot.cache.cache import Cache
from aot.cache.index.entry import utcnow
from aot.cli.main import cli

HITS = "/jax/compilation_cache/cache_hits"
WRITES = "/jax/compilation_cache/cache_misses"  # JAX records it when it writes an entry


@pytest.fixture(params=["sqlite", pytest.param("postgresql+s3", marks=pytest.mark.postgres)])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str | None]:
    """(cache location, blob location)."""
    if request.param == "sqlite":
        return str(tmp_path / "cache"), None
    return str(request.getfixturevalue("postgres_url")), str(request.getfixturevalue("s3_url"))


@pytest.fixture
def events() -> Iterator[Counter[str]]:
    """JAX's compilation-cache events of this test, with the cache used for every compile."""
    seen: Counter[str] = Counter()

    def listen(event: str, **_: object) -> None:
        if event.startswith("/jax/compilation_cache/"):
            seen[event] += 1

    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.monitoring.register_event_listener(listen)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_listener(listen)
        aot.jax_cache.uninstall()
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)


def _where(remote: tuple[str, str | None]) -> list[str]:
    return ["--cache", remote[0], *(["--blobs", remote[1]] if remote[1] is not None else [])]


def test_an_evicted_program_is_compiled_again_and_the_kept_one_hits(
    remote: tuple[str, str | None], events: Counter[str],
) -> None:
    scale = float(np.random.default_rng().integers(2, 10**6))  # programs no earlier test compiled

    @jax.jit
    def stale_step(x: jax.Array) -> jax.Array:
        return jnp.sin(x) * scale

    @jax.jit
    def kept_step(x: jax.Array) -> jax.Array:
        return jnp.cos(x) * scale

    x = np.linspace(0, 1, 8, dtype=np.float32)  # numpy: no compile to build the input
    aot.jax_cache.install(remote[0], blob_location=remote[1])
    expected = (np.asarray(stale_step(x)), np.asarray(kept_step(x)))
    assert events[WRITES] == 2 and events[HITS] == 0
    aot.jax_cache.uninstall()
    with Cache(remote[0], blob_location=remote[1]) as cache:
        entries = {e.name: e for e in cache.index.jit_entries()}
        assert set(entries) == {"stale_step", "kept_step"}
        stale = entries["stale_step"]
        cache.index.jit_touch(stale.key, when=utcnow() - dt.timedelta(days=40))

    runner = CliRunner()
    collected = runner.invoke(cli, [*_where(remote), "--json", "gc", "--older-than", "30d", "--yes"])
    assert collected.exit_code == 0, collected.output
    plan = json.loads(collected.output)
    assert plan["executed"] and [(v["kind"], v["key"]) for v in plan["entries"]] == [("jit", stale.key)]
    assert plan["blobs"] == [stale.digest]

    jax.clear_caches()  # this process's in-memory executables: the next calls ask the cache
    events.clear()
    backend = aot.jax_cache.install(remote[0], blob_location=remote[1])
    again = (np.asarray(stale_step(x)), np.asarray(kept_step(x)))
    assert events[HITS] == 1 and events[WRITES] == 1  # the kept one loaded, the evicted one compiled
    assert (backend.counts.hits, backend.counts.misses, backend.counts.puts) == (1, 1, 1)
    np.testing.assert_array_equal(again[0], expected[0])
    np.testing.assert_array_equal(again[1], expected[1])
    aot.jax_cache.uninstall()
    with Cache(remote[0], blob_location=remote[1]) as cache:
        stored = {e.name: e for e in cache.index.jit_entries()}
        assert set(stored) == {"stale_step", "kept_step"}  # its put stored it again
        assert cache.blobs.check(stored["stale_step"].digest, stored["stale_step"].size) is None


def test_the_plan_shows_jit_entries_and_kind_narrows_it(tmp_path: Path) -> None:
    from jax._src import compilation_cache as cc  # only to build a payload as JAX does

    where = ["--cache", str(tmp_path / "c")]
    key = "jit_train_step-" + "a" * 64
    with Cache(str(tmp_path / "c")) as cache:
        backend = aot.jax_cache.JaxCacheBackend(cache, compile_once=False)
        backend.put(key, cc.compress_executable(cc.combine_executable_and_time(b"step" * 100, 2)))
        backend.close()
        cache.index.jit_touch(key, when=utcnow() - dt.timedelta(days=40))
    runner = CliRunner()
    shown = runner.invoke(cli, [*where, "gc", "--older-than", "30d", "--dry-run"])
    assert shown.exit_code == 0, shown.output
    assert "would remove 1 entry and 1 blob" in shown.output
    assert f"{key[:40]}  train_step (jit)" in shown.output and "unused for more than 30d" in shown.output
    narrowed = runner.invoke(cli, [*where, "--json", "gc", "--older-than", "30d", "--kind", "aot", "--dry-run"])
    assert narrowed.exit_code == 0, narrowed.output
    assert json.loads(narrowed.output)["entries"] == []
    removed = runner.invoke(cli, [*where, "gc", "--older-than", "30d", "--kind", "jit", "--yes"])
    assert removed.exit_code == 0, removed.output
    assert "removed 1 entry and 1 blob" in removed.output
    with Cache(str(tmp_path / "c")) as cache:
        assert cache.index.jit_entries() == [] and cache.blobs.digests() == []
