"""``aot warmup --shard I/N`` and ``run_warmup(shard=..., executor=...)``: one CI
runner's share of a manifest, any concurrent.futures executor."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import random
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import pytest

import aot
from aot.cache.warmup.run import expand, load_manifest, run_warmup
from aot.cache.warmup.shard import (
    STATIC_BASE_SECONDS,
    estimate_costs,
    parse_shard,
    plan_shards,
    select_shard,
)
from tests.cli.helpers import MANIFEST, MANIFEST_LABELS, Invoke


@pytest.fixture(scope="module")
def items():  # noqa: ANN201
    return expand(load_manifest(MANIFEST))


def test_plan_is_an_exact_balanced_partition() -> None:
    rng = random.Random(13)
    for _ in range(200):
        costs = [rng.choice([0.1, 1.0, 7.5, 30.0]) * rng.random() for _ in range(rng.randint(0, 40))]
        count = rng.randint(1, 9)
        shards = plan_shards(costs, count)
        assert len(shards) == count
        flat = [i for shard in shards for i in shard]
        assert sorted(flat) == list(range(len(costs)))  # every item once: no gap, no overlap
        assert plan_shards(list(costs), count) == shards  # the same on every runner
        loads = [sum(costs[i] for i in shard) for shard in shards]
        if costs:  # longest-first greedy: no shard exceeds another by more than one item
            assert max(loads) - min(loads) <= max(costs) + 1e-9


@pytest.mark.parametrize("count", [1, 2, 3, 5, 7])
def test_shards_partition_the_manifest(items, count: int) -> None:  # noqa: ANN001
    chosen = [select_shard(items, (i, count)) for i in range(1, count + 1)]
    positions = [p for shard in chosen for p, _ in shard]
    assert sorted(positions) == list(range(len(items)))
    for shard in chosen:  # each shard keeps manifest order and the items themselves
        assert [p for p, _ in shard] == sorted(p for p, _ in shard)
        assert all(items[p] is item for p, item in shard)


@pytest.mark.parametrize("bad", ["0/3", "4/3", "3", "a/b", "1/0", (0, 2)])
def test_bad_shards_are_refused(bad) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="I/N|1 <= I <= N"):
        parse_shard(bad)


def test_costs_come_from_other_environments(items, warmed: Path) -> None:  # noqa: ANN001
    cache = aot.Cache(warmed)
    (tiny,) = cache.entries("tiny")
    # The same name and signature compiled by another environment (say, the last
    # jaxlib) in 100 s: this run's estimate. This environment's own entries never count.
    other = dataclasses.replace(tiny, key="f" * 64, env_fp="0" * 64, compile_seconds=100.0)
    cache.index.add(other, blob_sizes={})
    costs = estimate_costs(cache, items)
    by_label = {item.label: cost for item, cost in zip(items, costs)}
    assert by_label["tiny"].seconds == 100.0 and by_label["tiny"].source == "stored"
    assert all(c.source == "static" for label, c in by_label.items() if label != "tiny")
    # Static: 1 s plus 1 s per 64 MiB of inputs, so the larger batch costs more.
    assert STATIC_BASE_SECONDS < by_label["mlp.forward[batch=1]"].seconds < by_label["mlp.forward[batch=32]"].seconds
    # The 100 s entry gets a shard to itself; the other four share the second.
    shards = [[item.label for _, item in select_shard(items, (i, 2), cache)] for i in (1, 2)]
    assert ["tiny"] in shards
    assert sorted(sum(shards, [])) == sorted(MANIFEST_LABELS)


def test_three_shards_into_one_cache_then_verify_strict(invoke: Invoke) -> None:
    labels: list[str] = []
    for i in (1, 2, 3):
        if i == 3:  # two of three shards do not cover the manifest
            partial = invoke("verify", "--manifest", MANIFEST, "--strict")
            assert partial.exit_code == 1, partial.output
        result = invoke("warmup", MANIFEST, "--shard", f"{i}/3", "--json")
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert report["shard"] == f"{i}/3" and report["ok"] and report["hit"] == 0
        labels += [r["label"] for r in report["results"]]
    assert sorted(labels) == sorted(MANIFEST_LABELS)  # the union, with no overlap
    verified = invoke("verify", "--manifest", MANIFEST, "--strict")
    assert verified.exit_code == 0, verified.output
    assert "all 5 entries are stored for this environment" in verified.stdout
    text = invoke("warmup", MANIFEST, "--shard", "2/3")
    assert text.exit_code == 0 and " (shard 2/3): 0 compiled, " in text.stdout.splitlines()[-1]


@pytest.mark.parametrize("bad", ["0/3", "4/3", "three"])
def test_cli_refuses_bad_shards(invoke: Invoke, bad: str) -> None:
    result = invoke("warmup", MANIFEST, "--shard", bad)
    assert result.exit_code == 2
    assert "Invalid value for '--shard'" in result.stderr


def test_thread_pool_executor(items, tmp_path: Path) -> None:  # noqa: ANN001
    seen: list[str] = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        report = run_warmup(tmp_path / "c", items, executor=pool, on_result=lambda r: seen.append(r.label))
    assert report.ok, report.to_dict()
    assert [r.label for r in report.results] == MANIFEST_LABELS  # report in manifest order
    assert sorted(seen) == sorted(MANIFEST_LABELS) and report.compiled == 5
    cache = aot.Cache(tmp_path / "c")
    assert len(cache.entries()) == 5
    with pytest.raises(ValueError, match="jobs or executor"):
        run_warmup(cache, items, jobs=2, executor=ThreadPoolExecutor(1))


@pytest.mark.slow
def test_process_pool_executor_runs_one_shard(items, tmp_path: Path) -> None:  # noqa: ANN001
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        report = run_warmup(tmp_path / "c", items, executor=pool, shard=(1, 2))
    assert report.ok, report.to_dict()
    expected = [item.label for _, item in select_shard(items, (1, 2))]
    assert [r.label for r in report.results] == expected and report.compiled == len(expected)
    assert {r.index for r in report.results} == {p for p, _ in select_shard(items, (1, 2))}
    assert report.shard == (1, 2)
    stored = {e.signature for e in aot.Cache(tmp_path / "c").entries()}
    assert len(stored) == len(expected)
