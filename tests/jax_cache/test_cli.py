"""KIND jit entries in the command line: ls, stats, verify, push (folder caches, no compile)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import aot
from aot.cache.cache import Cache
from aot.cli.main import cli


def _payload(body: bytes, seconds: int = 2) -> bytes:
    from jax._src import compilation_cache as cc  # only to build a payload as JAX does

    return cc.compress_executable(cc.combine_executable_and_time(body, seconds))


def _filled(folder: Path) -> None:
    backend = aot.jax_cache.JaxCacheBackend(Cache(str(folder)), owns=True)
    try:
        assert backend.get("jit_train_step-" + "a" * 64) is None  # a miss, then JAX's put
        backend.put("jit_train_step-" + "a" * 64, _payload(b"step" * 100))
        backend.put("jit_eval-" + "b" * 64, _payload(b"eval" * 100))
        assert backend.get("jit_train_step-" + "a" * 64) is not None  # a hit
    finally:
        backend.close()


def test_ls_shows_kind_and_stats_per_function(tmp_path: Path) -> None:
    _filled(tmp_path / "c")
    runner = CliRunner()
    table = runner.invoke(cli, ["--cache", str(tmp_path / "c"), "ls"])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0].split()[:3] == ["KIND", "KEY", "NAME"]
    assert [line.split()[:3] for line in lines[1:3]] == [["jit", "b" * 12, "eval"], ["jit", "a" * 12, "train_step"]]
    assert lines[-1].startswith("2 entries")
    listed = json.loads(runner.invoke(cli, ["--cache", str(tmp_path / "c"), "ls", "--json"]).output)
    assert {(e["kind"], e["name"]) for e in listed["entries"]} == {("jit", "eval"), ("jit", "train_step")}
    stats = json.loads(runner.invoke(cli, ["--cache", str(tmp_path / "c"), "stats", "--json"]).output)
    by_name = {s["name"]: s for s in stats["jit"]}
    assert (by_name["train_step"]["hits"], by_name["train_step"]["misses"]) == (1, 1)
    assert by_name["train_step"]["saved_seconds"] > 0  # the compile time measured from the miss
    shown = runner.invoke(cli, ["--cache", str(tmp_path / "c"), "stats"])
    assert "train_step" in shown.output and "FUNCTION" in shown.output


def test_verify_removes_a_damaged_jit_entry_and_push_carries_the_rest(tmp_path: Path) -> None:
    _filled(tmp_path / "c")
    runner = CliRunner()
    with Cache(str(tmp_path / "c")) as cache:
        victim = next(e for e in cache.index.jit_entries() if e.name == "eval")
        cache.blobs.store.write(victim.digest, b"garbage")
    checked = runner.invoke(cli, ["--cache", str(tmp_path / "c"), "verify"])
    assert checked.exit_code == 1
    assert "jit entry: blob" in checked.output
    assert "removed 1 jit entry" in checked.output and "quarantined" not in checked.output
    assert [e.name for e in Cache(str(tmp_path / "c")).index.jit_entries()] == ["train_step"]
    pushed = runner.invoke(cli, ["--cache", str(tmp_path / "c"), "push", str(tmp_path / "d")])
    assert pushed.exit_code == 0, pushed.output
    with Cache(str(tmp_path / "d")) as copy:
        entries = copy.index.jit_entries()
        assert [e.name for e in entries] == ["train_step"]
        assert copy.blobs.check(entries[0].digest, entries[0].size) is None
    assert runner.invoke(cli, ["--cache", str(tmp_path / "d"), "verify"]).exit_code == 0


def test_gc_does_not_take_an_index_of_jit_entries_only_for_a_lost_one(tmp_path: Path) -> None:
    _filled(tmp_path / "c")
    runner = CliRunner()
    collected = runner.invoke(cli, ["--cache", str(tmp_path / "c"), "gc", "--yes", "--json"])
    assert collected.exit_code == 0, collected.output
    with Cache(str(tmp_path / "c")) as cache:
        entries = cache.index.jit_entries()
        assert len(entries) == 2 and all(cache.blobs.check(e.digest, e.size) is None for e in entries)
        cache.index.jit_delete([e.key for e in entries])  # emptied by its own deletion: not "lost"
    again = runner.invoke(cli, ["--cache", str(tmp_path / "c"), "gc", "--yes", "--json"])
    assert again.exit_code == 0, again.output


def test_rm_plans_then_removes_jit_entries_by_name_and_key_prefix(tmp_path: Path) -> None:
    _filled(tmp_path / "c")
    runner = CliRunner()
    where = ["--cache", str(tmp_path / "c")]
    with Cache(str(tmp_path / "c")) as cache:
        eval_entry = next(e for e in cache.index.jit_entries() if e.name == "eval")
    planned = runner.invoke(cli, [*where, "--json", "rm", "eval", "--dry-run"])
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.output)
    assert [(v["kind"], v["key"]) for v in plan["entries"]] == [("jit", eval_entry.key)]
    assert plan["blobs"] == [eval_entry.digest] and plan["bytes_freed"] > 0 and not plan["executed"]
    with Cache(str(tmp_path / "c")) as cache:
        assert len(cache.index.jit_entries()) == 2  # a dry run removes nothing
    removed = runner.invoke(cli, [*where, "rm", "jit_train_step-aaaa", "--yes"])
    assert removed.exit_code == 0, removed.output
    assert "removed 1 entry and 1 blob" in removed.output and "train_step (jit)" in removed.output
    with Cache(str(tmp_path / "c")) as cache:
        assert [e.name for e in cache.index.jit_entries()] == ["eval"]
        assert cache.blobs.check(eval_entry.digest, eval_entry.size) is None
        assert eval_entry.digest in cache.blobs.digests()
    assert runner.invoke(cli, [*where, "rm", "nothing_like_it"]).exit_code == 1


def test_show_a_jit_entry_by_jax_key_and_by_name(tmp_path: Path) -> None:
    _filled(tmp_path / "c")
    runner = CliRunner()
    where = ["--cache", str(tmp_path / "c")]
    shown = runner.invoke(cli, [*where, "show", "jit_train_step-" + "a" * 64])
    assert shown.exit_code == 0, shown.output
    assert "KIND jit" in shown.output and "train_step" in shown.output
    assert "hits            1" in shown.output and "hmac            unsigned" in shown.output
    listed = json.loads(runner.invoke(cli, [*where, "--json", "show", "eval"]).output)
    [entry] = listed["entries"]
    with Cache(str(tmp_path / "c")) as cache:
        stored = next(e for e in cache.index.jit_entries() if e.name == "eval")
    assert (entry["kind"], entry["key"], entry["digest"], entry["size"]) == ("jit", stored.key, stored.digest, stored.size)
    assert entry["hmac_state"] == "unsigned" and entry["compile_seconds"] == stored.compile_seconds
    assert runner.invoke(cli, [*where, "show", "no_such_function"]).exit_code == 1
