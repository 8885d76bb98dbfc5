"""aot.jax_cache: jax-aot as the backend of JAX's persistent compilation cache.

The training-script tests run a plain Flax/Optax script in fresh processes
(``python -m aot.cache.jax_cache train_script.py``) against the PostgreSQL and S3
servers, and count JAX's own cache events (``jax.monitoring``), never time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
from aot.cache.cache import Cache
from aot.cache.index.jit import function_name
from aot.jaxcompat import persistent_cache as jaxpc

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("train_script.py")
HITS = "/jax/compilation_cache/cache_hits"
WRITES = "/jax/compilation_cache/cache_misses"  # JAX records it when it writes an entry
REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"


def _env(location: str, blobs: str | None = None, local: Path | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("AOT_TEST_PAUSE", None)
    env.update(
        AOT_JAX_CACHE=location,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        PYTHONPATH=str(REPO),
        **extra,
    )
    if blobs is not None:
        env["AOT_JAX_CACHE_BLOBS"] = blobs
    if local is not None:
        env["AOT_JAX_CACHE_LOCAL"] = str(local)
    return env


def _start(out: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "aot.cache.jax_cache", str(SCRIPT), str(out)],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _run(out: Path, env: dict[str, str]) -> tuple[dict[str, Any], str]:
    proc = _start(out, env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.read_text()), err


@pytest.fixture
def shared(postgres_url: str, s3_url: str) -> tuple[str, str]:
    return postgres_url, s3_url


# ---------------------------------------------------------------- in process


def test_function_name_is_parsed_from_jax_keys() -> None:
    assert function_name("jit_train_step-05ed34bd") == "train_step"
    assert function_name("pmap_f-abc") == "f"
    assert function_name("jit__reduce_sum-12bf") == "_reduce_sum"
    assert function_name("odd") == "odd"


def test_the_private_names_we_use_are_there() -> None:
    """The canary of aot/jaxcompat/persistent_cache.py: a JAX upgrade that moves them fails here."""
    from jax._src import compilation_cache as cc
    from jax._src.compilation_cache_interface import CacheInterface

    assert {"get", "put"} <= set(CacheInterface.__abstractmethods__)
    for name in ("_cache", "_cache_initialized", "_cache_checked", "_cache_used"):
        assert hasattr(cc, name), name
    assert hasattr(cc._cache_initialized_mutex, "acquire")
    data = cc.combine_executable_and_time(b"exe", 7)
    assert jaxpc.compile_time_of(data) == 7
    from jax._src import dispatch

    assert dispatch.BACKEND_COMPILE_EVENT == jaxpc.COMPILE_DONE_EVENT  # releases a jit's claim


@pytest.mark.version_suite
def test_install_routes_jit_and_uninstall_restores(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    before = jaxpc.current_backend()
    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    try:
        backend = aot.jax_cache.install(str(tmp_path / "c"))
        assert aot.jax_cache.installed() is backend
        scale = float(np.random.default_rng().integers(2, 10**6))  # a program no earlier test compiled

        @jax.jit
        def routed(x: jax.Array) -> jax.Array:
            return x * scale + 1

        assert float(routed(jnp.ones(3))[0]) == scale + 1
        assert backend.counts.puts >= 1
        names = {e.name for e in backend.cache.index.jit_entries()}
        assert "routed" in names
        assert aot.jax_cache.uninstall() is True
        assert jaxpc.current_backend() is before
        assert aot.jax_cache.installed() is None

        @jax.jit
        def after(x: jax.Array) -> jax.Array:
            return x * scale - 1

        after(jnp.ones(3)).block_until_ready()
        with Cache(str(tmp_path / "c")) as cache:
            assert "after" not in {e.name for e in cache.index.jit_entries()}
    finally:
        aot.jax_cache.uninstall()
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)
    assert aot.jax_cache.uninstall() is False


def test_a_failing_store_never_raises_into_jit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    backend = aot.jax_cache.JaxCacheBackend(Cache(str(tmp_path / "c")), owns=True)
    try:
        backend.put("jit_f-00", b"not a zstd frame")
        assert backend.counts.errors == 1
        assert backend.get("jit_f-00") is None
        assert backend.cache.index.jit_entries() == []
        assert any("could not store jit_f-00" in r.getMessage() for r in caplog.records)
    finally:
        backend.close()


def test_a_signed_cache_refuses_an_unsigned_entry(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from jax._src import compilation_cache as cc  # only to build a payload as JAX does

    payload = cc.compress_executable(cc.combine_executable_and_time(b"x" * 100, 2))
    unsigned = aot.jax_cache.JaxCacheBackend(Cache(str(tmp_path / "c")), owns=True)
    unsigned.put("jit_f-01", payload)
    assert unsigned.get("jit_f-01") == payload
    unsigned.close()
    signed = aot.jax_cache.JaxCacheBackend(Cache(str(tmp_path / "c"), signing_key="k" * 32), owns=True)
    try:
        assert signed.get("jit_f-01") is None
        assert any("unsigned" in r.getMessage() for r in caplog.records)
        signed.put("jit_f-01", payload)  # the fresh compile's put signs it
        assert signed.get("jit_f-01") == payload
        assert signed.cache.index.jit_get("jit_f-01").signature is not None
    finally:
        signed.close()


# ---------------------------------------------------------------- PostgreSQL + S3, fresh processes


@pytest.mark.version_suite
@pytest.mark.slow
def test_a_second_process_hits_every_jit_of_a_training_script(shared: tuple[str, str], tmp_path: Path) -> None:
    db, blobs = shared
    first, _ = _run(tmp_path / "1.json", _env(db, blobs, tmp_path / "local1"))
    assert first["events"][WRITES] == first["events"][REQUESTS] >= 3
    second, _ = _run(tmp_path / "2.json", _env(db, blobs, tmp_path / "local2"))  # another client
    assert second["events"][HITS] == second["events"][REQUESTS] == first["events"][REQUESTS]
    assert WRITES not in second["events"]
    assert second["params_sha256"] == first["params_sha256"]
    with Cache(db, blob_location=blobs) as cache:
        entries = cache.index.jit_entries()
        assert "train_step" in {e.name for e in entries}
        assert len(entries) == first["events"][WRITES]
        stats = {s.name: s for s in cache.index.jit_stats()}
        assert stats["train_step"].hits == 1 and stats["train_step"].misses == 1
        # stored once, as JAX compressed it: every blob intact under its digest
        assert all(cache.blobs.check(e.digest, e.size) is None for e in entries)
    runner = __import__("click.testing", fromlist=["CliRunner"]).CliRunner()
    from aot.cli.main import cli

    listed = runner.invoke(cli, ["--cache", db, "--blobs", blobs, "ls", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    jit_rows = [r for r in (rows if isinstance(rows, list) else rows["entries"]) if r.get("kind") == "jit"]
    assert "train_step" in {r["name"] for r in jit_rows}
    shown = runner.invoke(cli, ["--cache", db, "--blobs", blobs, "stats", "--json"])
    assert shown.exit_code == 0, shown.output
    assert "train_step" in shown.output


@pytest.mark.slow
def test_a_corrupt_blob_on_s3_is_a_miss_then_repaired(shared: tuple[str, str], tmp_path: Path) -> None:
    db, blobs = shared
    first, _ = _run(tmp_path / "1.json", _env(db, blobs))
    with Cache(db, blob_location=blobs) as cache:
        victim = next(e for e in cache.index.jit_entries() if e.name == "train_step")
        cache.blobs.store.write(victim.digest, b"\x28\xb5\x2f\xfd garbage")
        assert cache.blobs.check(victim.digest, victim.size) is not None
    second, err = _run(tmp_path / "2.json", _env(db, blobs))
    assert err.count(f"entry {victim.key}") == 1, err  # one warning
    assert second["events"][WRITES] == 1  # the damaged one was recompiled and written
    assert second["events"][HITS] == second["events"][REQUESTS] - 1
    assert second["params_sha256"] == first["params_sha256"]
    with Cache(db, blob_location=blobs) as cache:
        # repaired: the row names an intact blob (the same digest rewritten, or a new
        # one when the executable's bytes differ, e.g. JAX's recorded compile seconds)
        fixed = cache.index.jit_get(victim.key)
        assert fixed is not None and cache.blobs.check(fixed.digest, fixed.size) is None


@pytest.mark.slow
def test_four_cold_processes_compile_each_program_once(shared: tuple[str, str], tmp_path: Path) -> None:
    db, blobs = shared
    with Cache(db, blob_location=blobs):
        pass  # the schema, once, before the four start
    procs = [_start(tmp_path / f"{i}.json", _env(db, blobs)) for i in range(4)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    results = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(4)]
    programs = results[0]["events"][REQUESTS]
    assert sum(r["events"].get(WRITES, 0) for r in results) == programs  # each compiled once in all
    assert sum(r["events"].get(HITS, 0) for r in results) == 3 * programs
    assert len({r["params_sha256"] for r in results}) == 1


@pytest.mark.slow
def test_a_killed_claim_holder_does_not_stop_the_others(shared: tuple[str, str], tmp_path: Path) -> None:
    """With the default lease and wait bound: the holder is killed -9 at its first claim
    (mid-compile); the three others finish within the lease plus slack (seconds, not
    the old fixed five-minute claim)."""
    db, blobs = shared
    with Cache(db, blob_location=blobs):
        pass
    here = tmp_path / "claimed"

    def defaults(env: dict[str, str]) -> dict[str, str]:  # no claim or wait override
        return {k: v for k, v in env.items() if k not in ("AOT_JAX_CACHE_CLAIM_SECONDS", "AOT_JAX_CACHE_WAIT_SECONDS")}

    holder = _start(tmp_path / "h.json", defaults(_env(
        db, blobs, AOT_TEST_PAUSE=f"jit.claimed=touch:{here}+wait:{tmp_path / 'never'}",
    )))
    others: list[subprocess.Popen[str]] = []
    try:
        deadline = time.monotonic() + 120
        while not here.exists():
            assert holder.poll() is None, holder.communicate()[1]
            assert time.monotonic() < deadline, "the holder never claimed"
            time.sleep(0.05)
        others = [_start(tmp_path / f"{i}.json", defaults(_env(db, blobs))) for i in range(3)]
        os.kill(holder.pid, signal.SIGKILL)  # mid-compile, its claim held
        holder.wait(timeout=30)
        killed = time.monotonic()
        bound = 30 + 45  # the default lease (30 s), then start-up and compiles
        for proc in others:
            _, err = proc.communicate(timeout=max(1.0, killed + bound - time.monotonic()))
            assert proc.returncode == 0, err
    finally:
        for proc in [holder, *others]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(3)]
    assert sum(r["backend"]["waits"] for r in results) >= 1
    programs = results[0]["events"][REQUESTS]
    assert sum(r["events"].get(WRITES, 0) for r in results) == programs  # still compiled once in all
    assert len({r["params_sha256"] for r in results}) == 1
