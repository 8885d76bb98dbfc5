"""aot stats: what the serving processes counted, in text and JSON; --zero."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import aot
from tests.cli.helpers import Invoke

STATS_KEYS = {"location", "env", "stored", "rows", "totals", "jit"}
ROW_KEYS = {
    "env_fp", "name", "signature", "calls", "loads", "load_seconds", "saved_seconds", "misses",
    "miss_reason", "recompiles", "recompile_seconds", "recompile_reason", "created_at",
    "updated_at", "this_environment", "target",
}


def _serve(cache_dir: Path, calls: int) -> None:
    cache = aot.Cache(cache_dir)
    fn = aot.load("tiny", cache=cache)
    x, y = np.arange(8, dtype=np.float32), np.ones(8, np.float32)
    for _ in range(calls):
        fn(x, y).block_until_ready()
    with pytest.raises(aot.SignatureNotFoundError):
        fn(x[:4], y)
    cache.close()


def test_stats(invoke: Invoke, warmed, cache_dir: Path) -> None:  # noqa: ANN001
    _serve(cache_dir, 3)
    result = invoke("stats")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "NAME", "SIGNATURE", "TARGET", "ENV", "CALLS", "LOADS", "LOAD", "TIME", "SAVED", "RECOMPILES",
    ]
    assert re.fullmatch(r"tiny\s+x: f32\[8\], y: f32\[8\]  cpu x8  this\s+3\s+1\s+\S+s\s+\S+s\s+0", lines[1]), lines[1]
    assert lines[2:4] == [
        "misses (calls with no stored executable for their signature):",
        "  tiny (x: f32[4], y: f32[8])  1  last: no stored signature",  # named like the entry
    ]
    assert re.fullmatch(
        rf"3 calls on 1 signature; 1 load in \S+s, saving \S+s of compiling; 1 miss; 0 recompiles "
        rf"\(sqlite:///{re.escape(str(cache_dir / 'index.sqlite'))}\)", lines[4],
    ), lines[4]
    assert len(lines) == 5
    data = json.loads(invoke("stats", "tiny", "--json").stdout)
    assert set(data) == STATS_KEYS and all(set(r) == ROW_KEYS for r in data["rows"])
    assert data["totals"]["calls"] == 3 and data["totals"]["misses"] == 1 and data["stored"] is True
    assert [r["target"] for r in data["rows"]] == ["cpu x8", "cpu x8"]
    assert invoke("stats", "mlp.*").stdout.startswith("no statistics for 'mlp.*' in ")
    assert json.loads(invoke("stats", "--env", "this", "--json").stdout)["totals"]["calls"] == 3


def test_stats_zero(invoke: Invoke, warmed, cache_dir: Path) -> None:  # noqa: ANN001
    _serve(cache_dir, 2)
    assert invoke("stats", "--zero").stdout == "zeroed the statistics of 2 signatures\n"
    assert json.loads(invoke("stats", "--json").stdout)["rows"] == []
    assert json.loads(invoke("stats", "--zero", "--json").stdout) == {"zeroed": 0}
    # the entry keeps its use count (gc needs it)
    assert [r["hits"] for r in json.loads(invoke("ls", "tiny", "--json").stdout)["entries"]] == [2]


def test_stats_of_a_read_only_cache(invoke: Invoke, warmed, cache_dir: Path) -> None:  # noqa: ANN001
    result = invoke("--read-only", "stats")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        f"no statistics in sqlite:///{cache_dir / 'index.sqlite'}",
        "(a process serving a read-only cache keeps its statistics in memory; give it a "
        "local tier (--local, AOT_LOCAL) to keep them there)",
    ]
    _serve(cache_dir, 2)  # a writable server stored some: a read-only reader shows them
    assert json.loads(invoke("--read-only", "stats", "--json").stdout)["totals"]["calls"] == 2
    assert "read-only" in invoke("--read-only", "stats", "--zero").output


def test_stats_name_arguments_like_ls_never_cut_inside_an_aval(invoke: Invoke, warmed, cache_dir: Path) -> None:  # noqa: ANN001
    """A pytree signature (the MLP's params) is shown by argument name with inner levels
    folded, served rows and missed ones alike, not the flat signature cut mid-aval."""
    from fixtures.models import mlp_input, mlp_param_specs

    import jax

    params = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), mlp_param_specs())
    cache = aot.Cache(cache_dir)
    fn = aot.load("mlp.forward", cache=cache)
    fn(params, np.asarray(mlp_input(8))).block_until_ready()
    with pytest.raises(aot.SignatureNotFoundError):
        fn(params, np.zeros((9, 784), np.float32))
    cache.close()
    lines = invoke("stats", "mlp.*").stdout.splitlines()
    assert re.fullmatch(
        r"mlp\.forward  params: \[\{2 arrays\}, \{2 arrays\}, \{2 arrays\}\], x: f32\[8,784\]\s+cpu x8  this\s+1\s+1\s.*",
        lines[1],
    ), lines
    assert "  mlp.forward (params: [{2 arrays}, {2 arrays}, {2 arrays}], x: f32[9,784])  1  last: no stored signature" in lines


def test_stats_json_reads_no_manifest(invoke: Invoke, warmed, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """--json shows flat signatures only: no entry's manifest is read for it (on a large
    index that was most of the command's time)."""
    from aot.cache.index.reader import SqliteReader

    _serve(cache_dir, 2)
    text = invoke("stats", "tiny").stdout
    assert "x: f32[8], y: f32[8]" in text  # the text names the arguments from the manifest

    def refused(*args: object) -> None:
        raise AssertionError("aot stats --json read a manifest")

    for method in ("signature_manifests", "signature_keys"):
        monkeypatch.setattr(SqliteReader, method, refused, raising=False)
    read: list[str] = []
    manifests = SqliteReader.manifests

    def counted(self, keys):  # noqa: ANN001, ANN202 - the target column's: one per environment
        read.extend(keys)
        return manifests(self, keys)

    monkeypatch.setattr(SqliteReader, "manifests", counted)
    result = invoke("stats", "--json")
    assert len(read) <= 1  # this host's environment is known: not even one
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(r["signature"], r["calls"], r["misses"]) for r in data["rows"]] == [
        ("f32[8], f32[8]", 2, 0), ("f32[4], f32[8]", 0, 1),
    ]


def test_stats_prometheus_prints_the_text_format(invoke: Invoke, warmed, cache_dir: Path) -> None:  # noqa: ANN001
    from prometheus_client.parser import text_string_to_metric_families

    _serve(cache_dir, 3)
    result = invoke("stats", "--prometheus")
    assert result.exit_code == 0, result.output
    samples = {
        (s.name, s.labels.get("name")): s.value
        for family in text_string_to_metric_families(result.stdout) for s in family.samples
    }
    assert samples[("aot_index_calls_total", "tiny")] == 3
    assert samples[("aot_index_loads_total", "tiny")] == 1
    assert samples[("aot_index_misses_total", "tiny")] == 1
    assert "# TYPE aot_index_calls_total counter" in result.stdout


def test_stats_prometheus_labels_target_and_release(invoke: Invoke, warmed, cache_dir: Path) -> None:  # noqa: ANN001
    """Each series says what it ran on and which releases serve its signature; a missed
    signature belongs to no release (issue 52)."""
    from aot.cache.index.refs import RefOrigin

    with aot.Cache(cache_dir) as cache:
        (tiny,) = [e for e in cache.entries() if e.name == "tiny"]
        for label in ("prod", "candidate"):
            cache.index.declare_release(label, [(tiny.name, tiny.signature, tiny.env_fp, tiny.key)], RefOrigin("ci"))
    _serve(cache_dir, 3)
    env = tiny.env_fp[:12]
    lines = [line for line in invoke("stats", "--prometheus").stdout.splitlines()
             if line.startswith("aot_index_calls_total")]
    assert lines == [
        f'aot_index_calls_total{{env="{env}",name="tiny",release="",target="cpu x8"}} 0.0',
        f'aot_index_calls_total{{env="{env}",name="tiny",release="candidate,prod",target="cpu x8"}} 3.0',
    ]
