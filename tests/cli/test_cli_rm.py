"""aot rm, and the confirmation that destructive commands ask for on a terminal."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

import aot
from tests.cli.helpers import MLP_TREE, Invoke, one_line_error, store_for_another_environment

RM_KEYS = {"target", "signatures", "env", "executed", "entries", "blobs", "bytes_freed", "pinned"}
VICTIM_KEYS = {"kind", "key", "name", "signature", "arguments", "environment", "status", "stored_size", "pinned_by"}


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """stdin is a terminal: destructive commands ask."""
    monkeypatch.setattr("aot.cli.common.stdin_is_tty", lambda: True)
    monkeypatch.setattr("aot.cli.maintenance.stdin_is_tty", lambda: True)


def _names(invoke: Invoke) -> list[str]:
    return [e["name"] for e in json.loads(invoke("ls", "--json").stdout)["entries"]]


def _stored_blobs(cache_dir: Path) -> int:
    return len(list((cache_dir / "blobs").rglob("*.zst")))


# ---------------------------------------------------------------- rm


def test_rm_by_name_removes_the_entries_and_their_blobs(invoke: Invoke, warmed, cache_dir) -> None:
    key = json.loads(invoke("ls", "tiny", "--json").stdout)["entries"][0]["key"]
    assert _stored_blobs(cache_dir) == 15  # 5 entries: executable, HLO, manifest
    result = invoke("rm", "tiny")  # not a terminal: no question
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("removed 1 entry and 3 blobs, freeing ")
    assert lines[1].startswith(f"  {key[:12]}  tiny (x: f32[8], y: f32[8])  ")
    assert _names(invoke) == ["allreduce"] + ["mlp.forward"] * 3
    assert _stored_blobs(cache_dir) == 12
    assert invoke("verify").stdout.endswith(": ok\n")  # no orphan left behind


def test_rm_a_glob_with_a_signature_filter(invoke: Invoke, warmed) -> None:
    plan = json.loads(invoke("rm", "mlp.*", "--signature", "x: f32[1,784]", "--dry-run", "--json").stdout)
    assert set(plan) == RM_KEYS and plan["executed"] is False
    (victim,) = plan["entries"]
    assert set(victim) == VICTIM_KEYS
    assert victim["signature"].endswith(", f32[1,784]") and victim["environment"] == "this"
    # Its executable is its own; the three buckets share no portable HLO either.
    assert len(plan["blobs"]) == 3 and plan["bytes_freed"] > 0  # and its manifest
    assert _names(invoke).count("mlp.forward") == 3  # a dry run
    flat = "f32[512], f32[784,512], f32[512], f32[512,512], f32[10], f32[512,10], f32[8,784]"
    both = invoke("rm", "mlp.forward", "--signature", flat, "--signature", "x: f32[32,784]")
    assert both.exit_code == 0, both.output
    assert both.stdout.splitlines()[0].startswith("removed 2 entries and 6 blobs, freeing ")
    left = json.loads(invoke("ls", "mlp.forward", "--json").stdout)["entries"]
    assert [e["signature"].rsplit(", ", 1)[1] for e in left] == ["f32[1,784]"]


def test_rm_signature_aliases_and_no_match(invoke: Invoke, warmed) -> None:
    plan = json.loads(invoke("rm", "tiny", "--signature", "float32[8], float32[8]", "--dry-run", "--json").stdout)
    assert len(plan["entries"]) == 1
    none = invoke("rm", "tiny", "--signature", "x: f32[4]")
    assert none.exit_code == 0, none.output
    assert none.stdout == "nothing to remove: no entry of 'tiny' with those signatures\n"


@pytest.mark.parametrize(
    "signature,message",
    [
        ("x: f32[8], f32[8]", "'f32[8]' has no path; name every leaf"),
        ("x: fp32[8]", "unknown dtype 'fp32' (did you mean f32?)"),
        # the whole signature is quoted, then the part that does not parse
        ("float32[1, 8], f32[8", "Invalid value for '--signature': malformed signature 'float32[1, 8], f32[8': "
                                 "malformed spec 'f32[8': this '[' is never closed (column 4: 'f32' >>> '[8')"),
    ],
)
def test_rm_bad_signature_is_a_usage_error(invoke: Invoke, warmed, signature: str, message: str) -> None:
    line = one_line_error(invoke("rm", "tiny", "--signature", signature), code=2)
    assert message in line


def test_rm_by_key_prefix(invoke: Invoke, warmed) -> None:
    key = json.loads(invoke("ls", "allreduce", "--json").stdout)["entries"][0]["key"]
    result = invoke("rm", key[:8], "--json")
    assert result.exit_code == 0, result.output
    assert [v["key"] for v in json.loads(result.stdout)["entries"]] == [key]
    assert "allreduce" not in _names(invoke)


def test_rm_keeps_blobs_another_entry_shares(invoke: Invoke, warmed, cache_dir) -> None:
    """The same program under two names shares its portable HLO blob (and, compiled in
    one process, its executable too)."""
    compiled = invoke("compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--name", "tiny.copy")
    assert compiled.exit_code == 0, compiled.output
    (tiny,) = json.loads(invoke("ls", "tiny", "--json").stdout)["entries"]
    shared = {tiny["exe_digest"], tiny["hlo_digest"]}
    blobs = _stored_blobs(cache_dir)
    result = json.loads(invoke("rm", "tiny.copy", "--json").stdout)
    assert not shared & set(result["blobs"])
    assert _stored_blobs(cache_dir) == blobs - len(result["blobs"])
    assert aot.load("tiny", cache=cache_dir, read_only=True).signatures == ["f32[8], f32[8]"]


def test_rm_env_this_keeps_other_environments(invoke: Invoke, warmed, cache_dir) -> None:
    foreign = store_for_another_environment(cache_dir, "tiny", device_count="4")
    plan = json.loads(invoke("rm", "tiny", "--env", "this", "--dry-run", "--json").stdout)
    assert foreign not in [v["key"] for v in plan["entries"]] and len(plan["entries"]) == 1
    everything = json.loads(invoke("rm", "tiny", "--env", "all", "--dry-run", "--json").stdout)
    envs = sorted(v["environment"] for v in everything["entries"])
    assert envs == ["device_count 4", "this"]
    text = invoke("rm", "tiny", "--dry-run").stdout
    assert "(env device_count 4)" in text and text.startswith("would remove 2 entries and ")


def test_rm_unknown_target(invoke: Invoke, warmed, cache_dir) -> None:
    line = one_line_error(invoke("rm", "mlp.froward"))
    assert line == (
        f"Error: no entry named 'mlp.froward' (as a name glob) and no key starting with it in "
        f"the cache at {cache_dir} (did you mean 'mlp.forward'?); `aot ls` lists what is stored"
    )


def test_rm_on_a_read_only_cache(invoke: Invoke, warmed, cache_dir) -> None:
    line = one_line_error(invoke("rm", "tiny", "--read-only"))
    assert line.startswith(f"Error: cannot remove entries: the cache at {cache_dir} is read-only")
    assert "tiny" in _names(invoke)


def test_rm_asks_on_a_terminal(invoke: Invoke, warmed, terminal) -> None:
    declined = invoke("rm", "mlp.*", input="n\n")
    assert declined.exit_code == 1
    plan = declined.stdout.splitlines()
    assert plan[0].startswith("would remove 3 entries and 9 blobs, freeing ") and plan[0].endswith(" [plan]")
    assert sum(MLP_TREE in line for line in plan) == 3  # each entry, by argument name
    err = declined.stderr.splitlines()
    assert len(err) == 2
    assert err[0].startswith("Remove 3 entries (") and err[0].endswith(")? [y/N]: n")
    assert err[1] == "Aborted: nothing was removed."
    assert _names(invoke).count("mlp.forward") == 3
    accepted = invoke("rm", "mlp.*", input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert "\nremoved 3 entries and 9 blobs, freeing " in accepted.stdout
    assert "mlp.forward" not in _names(invoke)


def test_rm_yes_does_not_ask(invoke: Invoke, warmed, terminal) -> None:
    result = invoke("rm", "tiny", "--yes")
    assert result.exit_code == 0, result.output
    assert "[y/N]" not in result.output and "tiny" not in _names(invoke)


# ---------------------------------------------------------------- gc confirmation


def test_gc_asks_on_a_terminal(invoke: Invoke, warmed, terminal) -> None:
    _unpin(warmed)  # a warm-up pins what it warmed (its refs); these test eviction
    declined = invoke("gc", "--max-size", "1", input="\n")  # the default is no
    assert declined.exit_code == 1
    plan = declined.stdout.splitlines()
    assert plan[0].startswith("would remove 5 entries and 15 blobs, freeing ")
    assert not plan[0].endswith("[dry run]") and len(plan) == 6
    assert declined.stderr.splitlines() == [
        declined.stderr.splitlines()[0], "Aborted: nothing was removed.",
    ]
    question = declined.stderr.splitlines()[0]
    assert question.startswith("Remove 5 entries and 15 blobs (") and question.endswith(")? [y/N]: ")
    assert len(_names(invoke)) == 5
    accepted = invoke("gc", "--max-size", "1", input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert "\nremoved 5 entries and 15 blobs, freeing " in accepted.stdout
    assert _names(invoke) == []


def test_gc_does_not_ask_with_yes_dry_run_or_nothing_to_do(invoke: Invoke, warmed, terminal) -> None:
    assert "[y/N]" not in invoke("gc", "--max-size", "1", "--dry-run").output
    assert invoke("gc").stdout.startswith("nothing to collect")
    result = invoke("gc", "--max-size", "1", "--yes", "--json")
    assert result.exit_code == 0 and "[y/N]" not in result.output
    assert json.loads(result.stdout)["executed"] is True


def test_gc_json_on_a_terminal_asks_on_stderr(invoke: Invoke, warmed, terminal) -> None:
    _unpin(warmed)  # a warm-up pins what it warmed (its refs); these test eviction
    result = invoke("gc", "--max-size", "1", "--json", input="y\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["executed"] is True  # stdout holds only the JSON
    assert "Remove 5 entries and 15 blobs" in result.stderr


def _unpin(cache_dir: Path) -> None:
    with aot.Cache(cache_dir) as cache:
        cache.index.drop_refs([r.slot for r in cache.index.refs()])


def _last_used(cache_dir: Path, when: dt.datetime) -> None:
    """Every entry of the cache at ``cache_dir`` was last used at ``when``."""
    with aot.Cache(str(cache_dir)) as cache:
        for entry in cache.entries():
            cache.index.touch(entry.key, when=when)


def test_gc_older_than_accepts_unambiguous_units(invoke: Invoke, warmed: Path) -> None:
    _unpin(warmed)  # a warm-up pins what it warmed (its refs); these test eviction
    # The entries' ages are set here: the session's warmed template may be of any age.
    for age in ("30d", "12h", "15min", "2w", "1mo", "1month", "90s", "2 weeks"):
        _last_used(warmed, dt.datetime.now(dt.timezone.utc))  # used just now
        result = invoke("gc", "--older-than", age, "--dry-run")
        assert result.exit_code == 0, (age, result.output)
        assert result.stdout.startswith("nothing to collect"), age
    # Used 20 days ago: older than two weeks, younger than a month (30 days).
    _last_used(warmed, dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=20))
    for age, collected in (("2w", 5), ("2 weeks", 5), ("12h", 5), ("30d", 0), ("1mo", 0), ("1month", 0)):
        plan = json.loads(invoke("gc", "--older-than", age, "--dry-run", "--json").stdout)
        assert len(plan["entries"]) == collected, age
    plan = json.loads(invoke("gc", "--older-than", "0s", "--dry-run", "--json").stdout)
    assert len(plan["entries"]) == 5
    assert plan["entries"][0]["reason"] == "unused for more than 0s"


def test_gc_lists_signatures_by_argument_name_never_cut_inside_an_aval(invoke: Invoke, warmed, cache_dir) -> None:  # noqa: ANN001
    """gc prints its victims and pinned entries like ls and rm: by argument name, inner
    levels folded, not the flat signature cut in the middle of an aval."""
    pinned = invoke("gc", "--max-size", "1", "--dry-run").stdout.splitlines()
    assert any(
        line.startswith("  ") and " mlp.forward (params: [{2 arrays}, {2 arrays}, {2 arrays}], x: f32[32,784])  " in line
        for line in pinned
    ), pinned
    _unpin(cache_dir)
    plan = invoke("gc", "--max-size", "1", "--dry-run").stdout.splitlines()
    assert sorted(line.split("  ")[2] for line in plan[1:]) == [
        "allreduce (x: f32[8,1024])",
        "mlp.forward (params: [{2 arrays}, {2 arrays}, {2 arrays}], x: f32[1,784])",
        "mlp.forward (params: [{2 arrays}, {2 arrays}, {2 arrays}], x: f32[32,784])",
        "mlp.forward (params: [{2 arrays}, {2 arrays}, {2 arrays}], x: f32[8,784])",
        "tiny (x: f32[8], y: f32[8])",
    ]
    entry = json.loads(invoke("gc", "--max-size", "1", "--dry-run", "--json").stdout)["entries"][0]
    assert entry["arguments"] and all(set(a) == {"path", "aval"} for a in entry["arguments"])


# ---------------------------------------------------------------- rm of what a release pins


@pytest.fixture
def prod_on_superseded(warmed, cache_dir) -> str:  # noqa: ANN001
    """prod names an entry a newer one of its slot supersedes (the ref moved on)."""
    from aot.cache.index.refs import RefOrigin

    with aot.Cache(cache_dir) as cache:
        old = cache.compile_entry(lambda x: x + 1.0, "f32[2]", name="pinned.f").entry
        cache.compile_entry(lambda x: x + 2.0, "f32[2]", name="pinned.f")
        set_id = cache.index.open_release("prod", RefOrigin("ci"))
        cache.index.set_refs([(old.name, old.signature, old.env_fp, old.key)], RefOrigin("ci"), release_id=set_id)
        cache.compile_entry(lambda x: x + 2.0, "f32[2]", name="pinned.f")  # the ref back on the newer one
    return old.key


def test_rm_of_a_release_member_refuses_without_force_naming_the_label(
    invoke: Invoke, prod_on_superseded: str,
) -> None:
    """issue 38: rm deleted what prod serves, and the plan called it "(superseded)"."""
    key = prod_on_superseded
    dry = invoke("rm", "pinned.f", "--dry-run")
    assert dry.exit_code == 0, dry.output
    [line] = [line for line in dry.stdout.splitlines() if key[:12] in line]
    assert line.endswith("(pinned by release prod)") and "superseded" not in line
    plan = json.loads(invoke("rm", key, "--dry-run", "--json").stdout)
    assert plan["pinned"] == [key] and plan["entries"][0]["pinned_by"] == ["prod"]
    refused = invoke("rm", key)
    assert refused.exit_code == 1
    assert "release label prod pins" in refused.output and "--force" in refused.output
    assert "(pinned by release prod)" in refused.output  # the plan, then why not
    assert key in [e["key"] for e in json.loads(invoke("ls", "pinned.f", "--json").stdout)["entries"]]
    forced = invoke("rm", key, "--force")
    assert forced.exit_code == 0, forced.output
    assert forced.stdout.startswith("removed 1 entry")
    assert key not in [e["key"] for e in json.loads(invoke("ls", "pinned.f", "--json").stdout)["entries"]]


def test_rm_confirmation_plan_shows_the_label(invoke: Invoke, prod_on_superseded: str, terminal) -> None:  # noqa: ANN001
    asked = invoke("rm", prod_on_superseded, "--force", input="n\n")
    assert asked.exit_code == 1
    assert "(pinned by release prod)" in asked.output and "superseded" not in asked.output


def test_verify_strict_fails_on_a_dangling_release_member_and_ref(
    invoke: Invoke, prod_on_superseded: str, cache_dir: Path,
) -> None:
    """issue 38: after rm of the served entry, verify --manifest M --strict said ok
    while a strict server refuses that signature."""
    from tests.cli.helpers import MANIFEST

    assert invoke("verify", "--manifest", MANIFEST, "--strict").exit_code == 0
    assert invoke("rm", prod_on_superseded, "--force").exit_code == 0
    gate = invoke("verify", "--manifest", MANIFEST, "--strict")
    assert gate.exit_code == 1, gate.output
    assert f"dangling: release prod of pinned.f (f32[2]) names {prod_on_superseded[:12]}: not stored" in gate.stdout
    assert invoke("verify").exit_code == 0  # integrity alone: nothing damaged
    data = json.loads(invoke("verify", "--strict", "--json").stdout)
    assert not data["ok"] and [d["declared_by"] for d in data["dangling"]] == ["release prod"]
    # The served ref's blob goes: the entry is quarantined, and the ref dangles too.
    with aot.Cache(cache_dir) as cache:
        served = cache.refs_named("tiny")[0].key
        entry = cache.index.get(served)
    digest = entry.exe_digest
    for path in (cache_dir / "blobs").rglob(f"{digest}*"):
        path.unlink()
    strict = invoke("verify", "--strict")
    assert strict.exit_code == 1
    assert f"dangling: ref of tiny (f32[8], f32[8]) names {served[:12]}: quarantined" in strict.stdout
