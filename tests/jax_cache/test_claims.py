"""aot.jax_cache's compile claims: a short lease that its holder's heartbeat renews while
it compiles (aot.cache.jax_cache, aot.cache.index.claim_heartbeat.ClaimHeartbeat), so a
killed holder's waiters compile within the lease and a long compile is not compiled
twice. Compiles are counted with JAX's own cache events (``jax.monitoring``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import aot
from aot.cache import pauses
from aot.cache.cache import Cache
from aot.cache.jax_cache import JaxCacheBackend

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("one_jit_script.py")
HITS = "/jax/compilation_cache/cache_hits"
WRITES = "/jax/compilation_cache/cache_misses"  # JAX records it when it writes an entry
LEASE = 1.5  # beats every 0.5 s: slack for a loaded machine


def _backend(location: str, **kwargs: Any) -> JaxCacheBackend:
    kwargs.setdefault("claim_seconds", LEASE)
    kwargs.setdefault("wait_seconds", 30)
    return JaxCacheBackend(Cache(location), owns=True, compile_once=True, **kwargs)


def _holder_of(location: str, key: str) -> str | None:
    with Cache(location) as cache:
        return cache.index.jit_claim_holder(key)


# ---------------------------------------------------------------- in process, PostgreSQL


def test_the_heartbeat_starts_at_the_first_claim_and_keeps_it_past_the_lease(postgres_url: str) -> None:
    backend = _backend(postgres_url)
    try:
        assert backend.heartbeat is None  # no thread for a process that never claims
        assert backend.get("jit_f-10") is None  # a miss: claimed, now "compiling"
        beat = backend.heartbeat
        assert beat is not None and beat.running
        time.sleep(3 * LEASE)
        assert _holder_of(postgres_url, "jit_f-10") == backend.holder  # renewed, still held
        assert beat.beats >= 2
    finally:
        backend.close()
    assert not beat.running and backend.heartbeat is None
    assert _holder_of(postgres_url, "jit_f-10") is None  # released at close


def test_a_compile_that_returns_gives_its_claim_up(postgres_url: str) -> None:
    backend = _backend(postgres_url)
    try:
        assert backend.get("jit_g-11") is None
        other = threading.Thread(target=backend.compile_done)  # another thread's compile
        other.start()
        other.join()
        assert backend.claimed == {"jit_g-11"}
        backend.compile_done()  # this thread's compile returned, stored or not
        assert backend.claimed == frozenset()
        assert _holder_of(postgres_url, "jit_g-11") is None
    finally:
        backend.close()


def test_a_jit_jax_does_not_store_leaves_no_claim_behind(postgres_url: str) -> None:
    """JAX's compile event releases the claim of a compile too short to be stored: no
    other process waits on it, and the heartbeat renews nothing."""
    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 3600)  # never put
    try:
        backend = aot.jax_cache.install(postgres_url, compile_once=True, claim_seconds=LEASE)
        scale = float(np.random.default_rng().integers(2, 10**6))

        @jax.jit
        def unstored(x: jax.Array) -> jax.Array:
            return x * scale

        unstored(np.ones(3, np.float32)).block_until_ready()
        assert backend.counts.misses >= 1 and backend.counts.puts == 0
        assert backend.heartbeat is not None  # it claimed
        assert backend.claimed == frozenset()  # and gave the claim up when the compile returned
    finally:
        aot.jax_cache.uninstall()
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)
    assert backend.heartbeat is None


def test_a_waiter_loads_the_entry_of_a_holder_compiling_past_the_lease(postgres_url: str) -> None:
    from jax._src import compilation_cache as cc  # only to build a payload as JAX does

    payload = cc.compress_executable(cc.combine_executable_and_time(b"x" * 100, 2))
    holder, waiter = _backend(postgres_url), _backend(postgres_url)
    try:
        assert holder.get("jit_h-12") is None  # claimed: compiling
        got: list[bytes | None] = []
        waiting = threading.Thread(target=lambda: got.append(waiter.get("jit_h-12")))
        waiting.start()
        time.sleep(3 * LEASE)  # a compile three leases long
        assert got == [] and waiter.counts.waits == 1  # still waiting: the claim is alive
        holder.put("jit_h-12", payload)
        waiting.join(timeout=30)
        assert got == [payload]  # loaded the holder's entry: not compiled twice
    finally:
        holder.close()
        waiter.close()


def test_an_entry_stored_between_the_miss_and_the_claim_is_loaded(postgres_url: str) -> None:
    """The holder stores and releases just after the waiter's miss and before its
    claim: the waiter's claim then succeeds, and it must load the entry, not compile."""
    from jax._src import compilation_cache as cc

    payload = cc.compress_executable(cc.combine_executable_and_time(b"y" * 100, 2))
    holder, late = _backend(postgres_url), _backend(postgres_url)

    def at(point: str) -> None:
        if point == "jit.missed":
            holder.put("jit_k-13", payload)  # stored, claim released

    previous = pauses.set_hook(at)
    try:
        assert late.get("jit_k-13") == payload
        assert late.counts.hits == 1 and late.claimed == frozenset()
    finally:
        pauses.set_hook(previous)
        holder.close()
        late.close()


# ---------------------------------------------------------------- PostgreSQL + S3, fresh processes


def _env(db: str, blobs: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("AOT_TEST_PAUSE", "AOT_JAX_CACHE_CLAIM_SECONDS", "AOT_JAX_CACHE_WAIT_SECONDS"):
        env.pop(name, None)
    env.update(
        AOT_JAX_CACHE=db, AOT_JAX_CACHE_BLOBS=blobs, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        PYTHONPATH=str(REPO), **extra,
    )
    return env


def _start(out: Path, scale: float, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "aot.cache.jax_cache", str(SCRIPT), str(out), str(scale)],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _wait_for(path: Path, proc: subprocess.Popen[str], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_holder_compiling_past_its_lease_keeps_its_claim(postgres_url: str, s3_url: str, tmp_path: Path) -> None:
    """The holder stops at its claim for four leases (a long compile); the waiter started
    meanwhile loads the holder's entry and compiles nothing."""
    with Cache(postgres_url, blob_location=s3_url):
        pass  # the schema, before the two start
    here = tmp_path / "claimed"
    lease = {"AOT_JAX_CACHE_CLAIM_SECONDS": "2", "AOT_JAX_CACHE_WAIT_SECONDS": "120"}
    holder = _start(tmp_path / "h.json", 7.0, _env(
        postgres_url, s3_url, AOT_TEST_PAUSE=f"jit.claimed=touch:{here}+sleep:8", **lease,
    ))
    try:
        _wait_for(here, holder)
        waiter = _start(tmp_path / "w.json", 7.0, _env(postgres_url, s3_url, **lease))
        _, err = waiter.communicate(timeout=180)
        assert waiter.returncode == 0, err
        _, err = holder.communicate(timeout=60)
        assert holder.returncode == 0, err
    finally:
        for proc in (holder, locals().get("waiter")):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    held, waited = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("h", "w"))
    assert held["events"].get(WRITES) == 1  # the holder compiled it
    assert WRITES not in waited["events"] and waited["events"].get(HITS) == 1  # the waiter did not
    assert waited["backend"]["waits"] == 1
    assert waited["result"] == held["result"] == [1.0, 8.0, 15.0, 22.0]
