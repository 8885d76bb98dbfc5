"""Compile claims at ``--jobs N`` and ``--isolate``: the parent process holds them and
grants each compile, its own and its worker processes' (aot.cache.warmup.parallel,
aot.cache.warmup.claims.WarmupClaims.grant); an entry another runner claimed is
deferred and waited for at the end. Folder caches (SQLite) with claims forced on; the
concurrent runners on PostgreSQL + S3 are in tests/cli/test_warmup_claims.py."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import aot
from aot.cache.warmup.run import ItemResult, WarmupItem, expand, parse_manifest, run_warmup
from tests.cli.helpers import REPO

MODES = ["jobs2", "isolate", "executor"]


@pytest.fixture
def run_mode(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """How the warm-up runs its compiles: ``--jobs 2``, ``--isolate``, or on an
    executor (each task claims its own compile; no pipe back to this process)."""
    mode = request.param
    if mode == "executor":
        with ThreadPoolExecutor(max_workers=2) as executor:
            yield {"executor": executor}
    else:
        yield {"jobs": 2, "isolate": mode == "isolate"}


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def _items() -> list[WarmupItem]:
    return expand(parse_manifest(
        '[[function]]\nname = "tiny"\nfunction = "fixtures.models:tiny"\n'
        'args = ["f32[{n}]", "f32[{n}]"]\nvary = { n = [2, 3, 5, 7] }\n'
    ))


def _keys(tmp_path: Path, items: list[WarmupItem]) -> list[str]:
    scratch = run_warmup(str(tmp_path / "scratch"), items, claims=False)
    keys = [r.key for r in scratch.results]
    assert all(keys) and len(set(keys)) == len(items)
    return keys


@pytest.mark.parametrize("run_mode", MODES, indirect=True)
def test_an_entry_claimed_by_a_dead_runner_is_compiled_after_its_claim_expires(
    tmp_path: Path, run_mode: dict[str, Any],
) -> None:
    items = _items()
    keys = _keys(tmp_path, items)
    cache = aot.Cache(str(tmp_path / "cache"))
    order: list[str | None] = []
    claim_live_at: dict[str, bool] = {}
    try:
        # A runner claimed the first entry, then died: no heartbeat extends its claim.
        assert cache.index.jit_claim(keys[0], "dead runner", 600) is None

        def on_result(result: ItemResult) -> None:
            order.append(result.key)
            claim_live_at[result.key] = cache.index.jit_claim_holder(keys[0]) == "dead runner"
            if set(order) == set(keys[1:]):  # ... and its claim expires now
                assert cache.index.jit_claim_extend([keys[0]], "dead runner", 0.0) == {keys[0]}

        report = run_warmup(cache, items, claims=True, claim_seconds=30, on_result=on_result, **run_mode)
        assert cache.index.jit_claim_holder(keys[0]) is None  # released at the end
    finally:
        cache.close()
    assert report.ok and report.compiled == len(items) and report.waited == 0, report.summary()
    # Passed over while its claim lived, compiled here once it expired.
    assert order[-1] == keys[0]
    assert not claim_live_at[keys[0]]
    assert [r.key for r in report.results] == keys


@pytest.mark.parametrize("run_mode", MODES, indirect=True)
def test_a_runner_waits_for_the_entry_another_runner_stores(tmp_path: Path, run_mode: dict[str, Any]) -> None:
    items = _items()
    keys = _keys(tmp_path, items)
    location = str(tmp_path / "cache")
    cache = aot.Cache(location)
    other = aot.Cache(location)
    try:
        assert cache.index.jit_claim(keys[1], "other runner", 600) is None
        done: list[str | None] = []

        def on_result(result: ItemResult) -> None:
            done.append(result.key)
            if set(done) == {keys[0], *keys[2:]}:  # meanwhile the other runner stores its entry
                run_warmup(other, items[1:2], claims=False)
                other.index.jit_unclaim([keys[1]], "other runner")

        report = run_warmup(cache, items, claims=True, on_result=on_result, **run_mode)
    finally:
        cache.close()
        other.close()
    waited = report.results[1]
    assert (waited.key, waited.status, waited.waited) == (keys[1], "hit", True)
    assert (report.compiled, report.hit, report.waited) == (len(items) - 1, 1, 1), report.summary()


def test_the_claim_of_a_worker_that_dies_is_released_with_its_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    items = _items()[:2]
    keys = dict(zip([i.label for i in items], _keys(tmp_path, items)))
    monkeypatch.setenv("AOT_TEST_PAUSE", "warmup.compiling=kill")  # each worker dies at its compile
    cache = aot.Cache(str(tmp_path / "cache"))
    held_at_failure: dict[str, str | None] = {}
    try:
        def on_result(result: ItemResult) -> None:
            held_at_failure[result.label] = cache.index.jit_claim_holder(keys[result.label])

        report = run_warmup(cache, items, jobs=2, isolate=True, claims=True, on_result=on_result)
    finally:
        cache.close()
    assert report.failed == len(items)
    assert all("worker process died" in (r.error or "") for r in report.results)
    # Each claim was taken (the worker reached its compile) and released with its
    # failure, not kept until the warm-up ended: other runners need not wait for it.
    assert held_at_failure == {label: None for label in keys}


_KILLED_RUNNER = """
import sys
from aot.cache.warmup.run import expand, parse_manifest, run_warmup
run_warmup(sys.argv[1], expand(parse_manifest(sys.argv[2])), jobs=2, claims=True, claim_seconds=float(sys.argv[3]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["folder", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_the_entries_of_a_runner_killed_mid_compile_are_compiled_once_its_claims_expire(
    tmp_path: Path, request: pytest.FixtureRequest, backend: str,
) -> None:
    import os
    import subprocess
    import sys

    items = _items()
    keys = _keys(tmp_path, items)
    location = str(tmp_path / "cache") if backend == "folder" else request.getfixturevalue("postgres_url")
    text = '[[function]]\nname = "tiny"\nfunction = "fixtures.models:tiny"\nargs = ["f32[{n}]", "f32[{n}]"]\nvary = { n = [2, 3, 5, 7] }\n'
    # Runner A claims, reaches its first compile and is killed there (kill -9): it
    # leaves its claims, which last 8 s past its last heartbeat.
    env = dict(os.environ, AOT_TEST_PAUSE="warmup.compiling=kill")
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_RUNNER, location, text, "8"], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=300,
    )
    assert killed.returncode == -9, killed.stderr
    with aot.Cache(location) as cache:
        held = {k for k in keys if cache.index.jit_claim_holder(k) is not None}
        assert held and cache.lookup(keys[0]) is None
        order: list[str | None] = []
        report = run_warmup(cache, items, jobs=2, claims=True, on_result=lambda r: order.append(r.key))
    assert report.ok and report.compiled == len(items) and report.waited == 0, report.summary()
    # The dead runner's entries were passed over while its claims lived, then compiled here.
    assert set(order[-len(held):]) == held


@pytest.mark.postgres
def test_an_executor_warm_up_of_a_shared_cache_claims_by_default(tmp_path: Path, postgres_url: str) -> None:
    """A PostgreSQL index turns claims on without ``claims=``: an executor's warm-up
    passes over the entry another runner holds and loads what that runner stored."""
    items = _items()
    keys = _keys(tmp_path, items)
    cache = aot.Cache(postgres_url)
    other = aot.Cache(postgres_url)
    try:
        assert cache.index.jit_claim(keys[2], "other runner", 600) is None
        done: list[str | None] = []

        def on_result(result: ItemResult) -> None:
            done.append(result.key)
            if set(done) == {k for i, k in enumerate(keys) if i != 2}:
                run_warmup(other, items[2:3], claims=False)
                other.index.jit_unclaim([keys[2]], "other runner")

        with ThreadPoolExecutor(max_workers=2) as executor:
            report = run_warmup(cache, items, executor=executor, on_result=on_result)
    finally:
        cache.close()
        other.close()
    assert (report.results[2].status, report.results[2].waited) == ("hit", True)
    assert (report.compiled, report.waited) == (len(items) - 1, 1), report.summary()
