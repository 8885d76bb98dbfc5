"""Compile claims: warm-up runners without --shard compile each entry once in total,
and a holder's heartbeat keeps a long compile's claim alive (aot.cache.warmup.claims,
aot.cache.index.claim_heartbeat.ClaimHeartbeat)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import aot
from aot.cache.index.claim_heartbeat import ClaimHeartbeat
from aot.cache.index.sql import Index
from aot.cache.warmup.run import ItemResult, expand, load_manifest, run_warmup
from tests.cli.helpers import MANIFEST, REPO


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def _mlp_and_tiny() -> list:
    return [i for i in expand(load_manifest(MANIFEST)) if not i.pmap][:3]


def test_an_entry_claimed_by_a_live_runner_is_passed_over_and_compiled_when_its_claim_expires(tmp_path: Path) -> None:
    items = _mlp_and_tiny()
    scratch = run_warmup(str(tmp_path / "scratch"), items, claims=False)
    keys = [r.key for r in scratch.results]
    assert all(keys) and len(set(keys)) == len(items)
    cache = aot.Cache(str(tmp_path / "cache"))
    try:
        # Another runner holds the first entry's compile (for a short while: then it "dies").
        assert cache.index.jit_claim(keys[0], "other runner", 1.5) is None
        order: list[str] = []
        report = run_warmup(cache, items, claims=True, claim_seconds=1.5, on_result=lambda r: order.append(r.key))
    finally:
        cache.close()
    assert report.ok and report.compiled == len(items) and report.waited == 0
    # The claimed entry was passed over, the others compiled first; its holder's claim
    # expired, so this runner compiled it itself.
    assert order == [*keys[1:], keys[0]]
    with aot.Cache(str(tmp_path / "cache")) as again:
        assert again.index.jit_claim_holder(keys[0]) is None  # released after the store


def test_a_runner_waits_for_an_entry_another_runner_stores(tmp_path: Path) -> None:
    items = _mlp_and_tiny()[:2]
    location = str(tmp_path / "cache")
    scratch = run_warmup(location + "-scratch", items, claims=False)
    keys = [r.key for r in scratch.results]
    cache = aot.Cache(location)
    other = aot.Cache(location)
    try:
        assert cache.index.jit_claim(keys[0], "other runner", 600) is None

        def on_result(result: ItemResult) -> None:
            if result.key == keys[1]:  # meanwhile the other runner stores its entry
                run_warmup(other, items[:1], claims=False)
                other.index.jit_unclaim([keys[0]], "other runner")

        report = run_warmup(cache, items, claims=True, on_result=on_result)
    finally:
        cache.close()
        other.close()
    first = report.results[0]
    assert (first.key, first.status, first.waited) == (keys[0], "hit", True)
    assert report.compiled == 1 and report.waited == 1
    assert "1 waited for" in report.summary()


def _held(index: Index, key: str) -> str | None:
    return index.jit_claim_holder(key)


def test_the_heartbeat_keeps_a_claim_alive_past_claim_seconds(index: Index) -> None:
    seconds = 0.6
    assert index.jit_claim("k" * 64, "holder", seconds) is None
    start = time.monotonic()
    with ClaimHeartbeat(index, "holder", seconds) as beat:
        beat.hold("k" * 64)
        assert beat.wait_beats(4, timeout=30)  # each beat extends the claim by 0.6 s
        assert time.monotonic() - start > seconds
        assert index.jit_claim("k" * 64, "another", seconds) == "holder"  # still held
        beat.drop("k" * 64)
    # Without its heartbeat, the claim expires and another holder takes it.
    deadline = time.monotonic() + 30
    while _held(index, "k" * 64) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert index.jit_claim("k" * 64, "another", seconds) is None


def test_extending_a_claim_someone_else_holds_extends_nothing(index: Index) -> None:
    assert index.jit_claim("a" * 64, "one", 60) is None
    assert index.jit_claim_extend(["a" * 64, "b" * 64], "two", 60) == set()
    assert index.jit_claim_extend(["a" * 64], "one", 60) == {"a" * 64}


def test_grant_gives_a_key_to_one_asker_until_it_is_released_or_handed_on(tmp_path: Path) -> None:
    from aot.cache.warmup.claims import WarmupClaims

    key = "c" * 64
    with aot.Cache(str(tmp_path / "cache")) as cache, WarmupClaims(cache, claim_seconds=60) as claims:
        assert claims.grant(key, "first asker")
        assert cache.index.jit_claim_holder(key) == claims.holder
        assert not claims.grant(key, "second asker")  # another process of this warm-up compiles it
        claims.hand_on(key)  # the first asker hands its item to a worker, which asks again
        assert claims.grant(key, "worker")
        assert not claims.grant(key, "third asker")
        claims.release_key(key)
        assert cache.index.jit_claim_holder(key) is None
        assert cache.index.jit_claim(key, "another runner", 60) is None
        assert not claims.grant(key, "after another runner claimed it")
        cache.index.jit_unclaim([key], "another runner")
        assert claims.grant(key)
    with aot.Cache(str(tmp_path / "cache")) as cache:
        assert cache.index.jit_claim_holder(key) is None  # released when the warm-up ended
