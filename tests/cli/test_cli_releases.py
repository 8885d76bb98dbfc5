"""aot release ls/show/promote/rollback/rm and aot history, over a warmed cache."""

from __future__ import annotations

import json

import pytest

import aot
from aot.cache.index.refs import RefOrigin
from tests.aot.test_targets import needs_libtpu
from tests.cli.helpers import Invoke, one_line_error


def test_promote_rollback_and_history(invoke: Invoke, warmed, cache_dir) -> None:  # noqa: ANN001
    with aot.Cache(cache_dir) as cache:
        entries = cache.entries()
        first = cache.index.open_release("candidate", RefOrigin("ci", commit="c1"))
        cache.index.set_refs([(e.name, e.signature, e.env_fp, e.key) for e in entries[:2]],
                             RefOrigin("ci"), release_id=first)
        second = cache.index.open_release("candidate", RefOrigin("ci", commit="c2"))
        cache.index.set_refs([(e.name, e.signature, e.env_fp, e.key) for e in entries[:3]],
                             RefOrigin("ci"), release_id=second)
    assert invoke("release", "ls").stdout.startswith(f"candidate  set {second}  ")
    promoted = invoke("release", "promote", "candidate", "prod")
    assert promoted.exit_code == 0 and promoted.stdout.startswith("promoted prod: set ")
    assert promoted.stdout.endswith(", 3 members\n")
    # prod keeps candidate's provenance: the set promoted and its commit (issue 52).
    prod = invoke("release", "ls").stdout.splitlines()[1]
    assert prod.startswith("prod  set ") and prod.endswith(
        f"  promoted from candidate set {second}  commit c2  (no previous set)")
    assert json.loads(invoke("release", "ls", "--json").stdout)["releases"][1]["commit"] == "c2"
    shown = json.loads(invoke("release", "show", "prod", "--json").stdout)
    assert sorted(m["key"] for m in shown["members"]) == sorted(e.key for e in entries[:3])
    back = invoke("release", "rollback", "candidate")
    restored = json.loads(invoke("release", "show", "candidate", "--json").stdout)["id"]
    assert back.exit_code == 0, back.output
    assert back.stdout == f"rolled back candidate to set {first} (now set {restored}, 2 members); left set {second}\n"
    again = invoke("release", "rollback", "candidate")
    assert again.exit_code == 1
    assert (f"it has no earlier set to go back to (what it serves now, set {restored}, the rollback to "
            f"set {first}, the first set it was given)") in one_line_error(again)
    missing = invoke("release", "show", "nope")
    assert missing.exit_code == 1 and "no release labelled 'nope'" in missing.output
    name = entries[0].name
    history = json.loads(invoke("history", name, "--json").stdout)["history"]
    assert history and all(h["name"] == name for h in history)
    assert history[0]["source"].startswith("warmup")
    assert invoke("history", name).stdout.splitlines()[0].split("  ")[1] == history[0]["key"][:12]


# ---------------------------------------------------------------- release rm

REMOVAL_KEYS = {"executed", "releases", "unpinned", "still_pinned"}


@pytest.fixture
def labelled(warmed, cache_dir) -> dict[str, str]:  # noqa: ANN001
    """canary-2026-11 names tiny and mlp.forward's first bucket, prod names that bucket;
    neither entry keeps its ref (the refs moved on): only the labels pin them."""
    with aot.Cache(cache_dir) as cache:
        by_name = {e.name: e for e in cache.entries()}  # one entry of each name
        tiny, mlp = by_name["tiny"], by_name["mlp.forward"]
        canary = cache.index.open_release("canary-2026-11", RefOrigin("ci"))
        cache.set_refs([tiny, mlp], RefOrigin("ci"), release_id=canary)
        prod = cache.index.open_release("prod", RefOrigin("ci"))
        cache.set_refs([mlp], RefOrigin("ci"), release_id=prod)
        cache.index.drop_refs([(e.name, e.signature, e.env_fp) for e in (tiny, mlp)])
    return {"tiny": tiny.key, "mlp": mlp.key}


def _labels(invoke: Invoke) -> list[str]:
    return [r["label"] for r in json.loads(invoke("release", "ls", "--json").stdout)["releases"]]


def test_release_rm_then_gc_collects_only_what_the_label_pinned(invoke: Invoke, labelled) -> None:  # noqa: ANN001
    kept = invoke("gc", "--older-than", "0s", "--yes")
    assert kept.exit_code == 0 and kept.stdout.startswith("nothing to collect"), kept.output
    assert "`aot release rm LABEL` retires a label" in kept.stdout  # the advice names the verb
    set_id = json.loads(invoke("release", "show", "canary-2026-11", "--json").stdout)["id"]
    dry = invoke("release", "rm", "canary-2026-11", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.splitlines() == [
        "would remove 1 release label (canary-2026-11); would unpin 1 entry (gc may collect it) [plan]",
        f"  release canary-2026-11: current set {set_id} (2 members), no rollback set, 1 set in its history",
        f"  would unpin {labelled['tiny'][:12]}  tiny (f32[8], f32[8])",
        "  1 member stays pinned by a ref or another label (--json says which)",
    ]
    assert _labels(invoke) == ["canary-2026-11", "prod"]  # the dry run changed nothing
    assert invoke("gc", "--older-than", "0s", "--yes").stdout.startswith("nothing to collect")
    done = invoke("release", "rm", "canary-2026-11")  # not a terminal: no question
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("removed 1 release label (canary-2026-11); unpinned 1 entry (gc may collect it)\n")
    assert f"  unpinned {labelled['tiny'][:12]}  tiny (f32[8], f32[8])\n" in done.stdout
    assert _labels(invoke) == ["prod"]
    collected = json.loads(invoke("gc", "--older-than", "0s", "--yes", "--json").stdout)
    assert [v["key"] for v in collected["entries"]] == [labelled["tiny"]]
    assert labelled["mlp"] in {v["key"] for v in collected["pinned"]}  # prod still pins it
    names = [e["name"] for e in json.loads(invoke("ls", "--json").stdout)["entries"]]
    assert "tiny" not in names and names.count("mlp.forward") == 3


def test_release_rm_json_unknown_label_and_read_only(invoke: Invoke, labelled, cache_dir) -> None:  # noqa: ANN001
    assert len(aot.load("mlp.forward", cache=str(cache_dir), read_only=True, release="prod").signatures) == 1
    plan = json.loads(invoke("release", "rm", "canary-2026-11", "prod", "--dry-run", "--json").stdout)
    assert set(plan) == REMOVAL_KEYS and plan["executed"] is False
    assert [r["label"] for r in plan["releases"]] == ["canary-2026-11", "prod"]
    assert set(plan["releases"][0]) == {"label", "current", "rollback", "sets"}
    assert sorted(m["key"] for m in plan["unpinned"]) == sorted(labelled.values())
    assert plan["still_pinned"] == []
    unknown = one_line_error(invoke("release", "rm", "canary-2026-11", "canary-2026-12"))
    assert unknown == ("Error: no release labelled 'canary-2026-12' (did you mean 'canary-2026-11'?); the labels "
                       "are canary-2026-11, prod (`aot release ls` lists them)")
    read_only = one_line_error(invoke("release", "rm", "prod", "--read-only"))
    assert read_only.startswith(f"Error: cannot remove a release: the cache at {cache_dir} is read-only")
    assert _labels(invoke) == ["canary-2026-11", "prod"]
    with_json = json.loads(invoke("release", "rm", "prod", "--json").stdout)
    assert with_json["executed"] is True and [m["key"] for m in with_json["still_pinned"]] == [labelled["mlp"]]
    assert with_json["still_pinned"][0]["pinned_by"] == "release canary-2026-11"
    # A replica of this folder cache (the stdlib reader) loading the removed label fails at start-up.
    with pytest.raises(aot.ReleaseNotFoundError, match="no release labelled 'prod'"):
        aot.load("mlp.forward", cache=str(cache_dir), read_only=True, release="prod")


def test_release_rm_asks_on_a_terminal(invoke: Invoke, labelled, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setattr("aot.cli.releases.stdin_is_tty", lambda: True)
    monkeypatch.setattr("aot.cli.common.stdin_is_tty", lambda: True)
    refused = one_line_error(invoke("release", "rm", "prod", "--read-only", input="y\n"))  # not asked
    assert refused.startswith("Error: cannot remove a release: the cache at ")
    declined = invoke("release", "rm", "prod", input="n\n")
    assert declined.exit_code == 1
    assert "Remove 1 release label (unpins 0 entries)? [y/N]" in declined.stderr
    assert "Aborted: nothing was removed." in declined.stderr
    assert _labels(invoke) == ["canary-2026-11", "prod"]
    accepted = invoke("release", "rm", "prod", input="y\n")
    assert accepted.exit_code == 0, accepted.output
    lines = accepted.stdout.splitlines()  # the plan, then what was done (as gc does)
    assert lines[0].startswith("would remove 1 release label (prod); ") and lines[0].endswith(" [plan]")
    assert "removed 1 release label (prod); no entry unpinned" in lines
    assert _labels(invoke) == ["canary-2026-11"]
    assert invoke("release", "rm", "canary-2026-11", "--yes").exit_code == 0
    assert _labels(invoke) == []


def test_two_rollbacks_after_gc_land_on_stored_entries(invoke: Invoke, warmed, cache_dir) -> None:  # noqa: ANN001
    """issue 38: gc pinned prod's current set and one step back; a second rollback
    exited 0 onto a set whose entries gc had removed."""
    with aot.Cache(cache_dir) as cache:
        versions = [cache.compile_entry(lambda x, k=k: x * k, "f32[4]", name="roll.g").entry for k in (2.0, 3.0, 4.0)]
        for entry in versions:
            set_id = cache.index.open_release("prod", RefOrigin("ci"))
            cache.set_refs([entry], RefOrigin("ci"), release_id=set_id)
        cache.index.drop_refs([(versions[0].name, versions[0].signature, versions[0].env_fp)])
    for expected in (versions[1], versions[0]):
        assert invoke("gc", "--older-than", "0s", "--yes").exit_code == 0
        back = invoke("release", "rollback", "prod")
        assert back.exit_code == 0, back.output
        shown = json.loads(invoke("release", "show", "prod", "--json").stdout)
        assert [m["key"] for m in shown["members"]] == [expected.key]
        stored = [e["key"] for e in json.loads(invoke("ls", "roll.g", "--json").stdout)["entries"]]
        assert expected.key in stored
    assert invoke("verify", "--strict").exit_code == 0


# ---------------------------------------------------------------- the default release


def test_a_replica_naming_no_release_serves_the_declared_default(
    invoke: Invoke, warmed, cache_dir, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """After promote + rollback of prod, a replica without release= serves prod's set
    (the declared default), not the refs of the last warm-up (issue 38, item 6)."""
    monkeypatch.delenv("AOT_RELEASE", raising=False)
    with aot.Cache(cache_dir) as cache:
        mlp = sorted((e for e in cache.entries() if e.name == "mlp.forward"), key=lambda e: e.key)
        v1 = cache.index.open_release("prod", RefOrigin("ci"))
        cache.set_refs(mlp[:1], RefOrigin("ci"), release_id=v1)
        cand = cache.index.open_release("cand", RefOrigin("ci"))
        cache.set_refs(mlp, RefOrigin("ci"), release_id=cand)  # the refs: every bucket
    assert invoke("release", "default").stdout.startswith("no default release")
    assert invoke("release", "default", "prd").exit_code == 1  # an unknown label is refused
    assert invoke("release", "default", "prod").exit_code == 0
    assert invoke("release", "default", "--json").stdout.strip() == '{"default_release": "prod"}' or \
        json.loads(invoke("release", "default", "--json").stdout) == {"default_release": "prod"}
    assert invoke("release", "promote", "cand", "prod").exit_code == 0
    assert len(aot.load("mlp.forward", cache=str(cache_dir)).signatures) == len(mlp)
    assert invoke("release", "rollback", "prod").exit_code == 0
    served = aot.load("mlp.forward", cache=str(cache_dir))
    assert len(served.signatures) == 1  # prod's v1, not the candidate's refs
    monkeypatch.setenv("AOT_RELEASE", "cand")
    assert len(aot.load("mlp.forward", cache=str(cache_dir)).signatures) == len(mlp)
    monkeypatch.delenv("AOT_RELEASE")
    assert invoke("release", "default", "--clear").exit_code == 0
    assert len(aot.load("mlp.forward", cache=str(cache_dir)).signatures) == len(mlp)  # the refs


def test_a_mistyped_label_says_did_you_mean(warmed, cache_dir) -> None:  # noqa: ANN001
    with aot.Cache(cache_dir) as cache:
        entry = next(e for e in cache.entries() if e.name == "mlp.forward")
        prod = cache.index.open_release("prod", RefOrigin("ci"))
        cache.set_refs([entry], RefOrigin("ci"), release_id=prod)
    with pytest.raises(aot.ReleaseNotFoundError, match="did you mean 'prod'"):
        aot.load("mlp.forward", cache=str(cache_dir), release="prd")


def test_release_commands_say_did_you_mean_for_a_mistyped_label(invoke: Invoke, labelled, cache_dir) -> None:  # noqa: ANN001
    assert one_line_error(invoke("release", "promote", "cannary-2026-11", "prod")) == (
        "Error: no release labelled 'cannary-2026-11' (did you mean 'canary-2026-11'?); "
        "`aot release ls` lists the labels")
    assert one_line_error(invoke("release", "rollback", "prd")) == (
        "Error: no release labelled 'prd' (did you mean 'prod'?); `aot release ls` lists the labels")
    for command in ("show", "history", "default"):
        assert one_line_error(invoke("release", command, "prd")) == (
            f"Error: no release labelled 'prd' in {cache_dir} (did you mean 'prod'?); `aot release ls` lists them")
    assert one_line_error(invoke("release", "rm", "prd")) == (
        "Error: no release labelled 'prd' (did you mean 'prod'?); the labels are canary-2026-11, prod "
        "(`aot release ls` lists them)")
    # Nothing close: no guess.
    assert one_line_error(invoke("release", "promote", "staging", "prod")) == (
        "Error: no release labelled 'staging'; `aot release ls` lists the labels")
    assert _labels(invoke) == ["canary-2026-11", "prod"]


def test_rollback_onto_a_removed_entry_refuses_and_leaves_the_label(invoke: Invoke, warmed, cache_dir) -> None:  # noqa: ANN001
    """issue 38: `aot rm --force` of what a rollback would serve, then `release
    rollback` exited 0 onto a set replicas cannot serve."""
    with aot.Cache(cache_dir) as cache:
        versions = [cache.compile_entry(lambda x, k=k: x * k, "f32[4]", name="roll.h").entry for k in (2.0, 3.0)]
        for entry in versions:
            set_id = cache.index.open_release("prod", RefOrigin("ci"))
            cache.set_refs([entry], RefOrigin("ci"), release_id=set_id)
    before = json.loads(invoke("release", "show", "prod", "--json").stdout)
    assert invoke("rm", versions[0].key, "--force").exit_code == 0
    refused = invoke("release", "rollback", "prod")
    assert refused.exit_code == 1, refused.output
    line = one_line_error(refused)
    assert versions[0].key[:12] in line and "not stored" in line and "roll.h" in line
    after = json.loads(invoke("release", "show", "prod", "--json").stdout)
    assert after == before


# ---------------------------------------------------------------- why, show, ls follow the served release

MLP_WHY = ("why", "mlp.forward", "--arg", "@fixtures.models:mlp_param_specs", "--arg")


def _served(invoke: Invoke, *options: str) -> dict[str, str | None]:
    """``{batch: served_by}`` of mlp.forward's entries in `aot ls --json`."""
    entries = json.loads(invoke("ls", "mlp.forward", "--json", *options).stdout)["entries"]
    return {e["signature"].rsplit(", ", 1)[1]: e["served_by"] for e in entries}


def _shown(invoke: Invoke, *options: str) -> dict[str, str | None]:
    entries = json.loads(invoke("show", "mlp.forward", "--json", *options).stdout)["entries"]
    return {e["entry"]["signature"].rsplit(", ", 1)[1]: e["served_by"] for e in entries}


@pytest.mark.parametrize("how", ["AOT_RELEASE", "default", "--release"])
def test_why_show_and_ls_answer_for_the_release_a_replica_serves(
    invoke: Invoke, warmed, cache_dir, monkeypatch: pytest.MonkeyPatch, how: str,  # noqa: ANN001
) -> None:
    """issue 38, item 6: prod's set has mlp.forward's batch-1 bucket only, the refs have
    all three. `why` for batch 8 is a miss there, naming prod; ls/show mark per prod."""
    monkeypatch.delenv("AOT_RELEASE", raising=False)
    with aot.Cache(cache_dir) as cache:
        [one] = [e for e in cache.entries() if e.name == "mlp.forward" and e.signature.endswith("f32[1,784]")]
        prod = cache.index.open_release("prod", RefOrigin("ci"))
        cache.set_refs([one], RefOrigin("ci"), release_id=prod)
    everything = {"f32[1,784]": "ref", "f32[8,784]": "ref", "f32[32,784]": "ref"}
    assert _served(invoke) == everything and _shown(invoke) == everything  # as before: the refs
    assert invoke(*MLP_WHY, "f32[8,784]").exit_code == 0
    options: tuple[str, ...] = ()
    if how == "AOT_RELEASE":
        monkeypatch.setenv("AOT_RELEASE", "prod")
    elif how == "default":
        assert invoke("release", "default", "prod").exit_code == 0
    else:
        options = ("--release", "prod")
    per_prod = {"f32[1,784]": "release", "f32[8,784]": None, "f32[32,784]": None}
    assert _served(invoke, *options) == per_prod
    assert _shown(invoke, *options) == per_prod
    listed = invoke("ls", "mlp.forward", *options)
    assert "release [prod]" in listed.stdout and "as a replica of release prod serves" in listed.stdout
    shown = invoke("show", "mlp.forward", *options).stdout
    assert "served by release prod" in shown and "not served by release prod" in shown
    miss = invoke(*MLP_WHY, "f32[8,784]", *options)
    assert miss.exit_code == 1, miss.output
    assert "miss; not served by release prod" in miss.stdout
    data = json.loads(invoke(*MLP_WHY, "f32[8,784]", "--json", *options).stdout)
    assert (data["hit"], data["release"], data["not_in_release"], data["served_key"]) == (False, "prod", True, None)
    hit = invoke(*MLP_WHY, "f32[1,784]", *options)
    assert hit.exit_code == 0, hit.output
    assert f"key {one.key[:12]} (served: release prod names it)" in hit.stdout
    # The loader agrees: a replica of prod serves the one bucket.
    if how != "--release":
        assert len(aot.load("mlp.forward", cache=str(cache_dir)).signatures) == 1


def test_a_mistyped_release_for_ls_show_why_says_did_you_mean(invoke: Invoke, warmed, cache_dir) -> None:  # noqa: ANN001
    with aot.Cache(cache_dir) as cache:
        entry = next(e for e in cache.entries() if e.name == "mlp.forward")
        cache.set_refs([entry], RefOrigin("ci"), release_id=cache.index.open_release("prod", RefOrigin("ci")))
    for command in (("ls",), ("show", "mlp.forward"), (*MLP_WHY, "f32[8,784]")):
        line = one_line_error(invoke(*command, "--release", "prd"))
        assert "no release labelled 'prd'" in line and "did you mean 'prod'" in line, command


def test_release_history_shows_every_move_of_a_label(invoke: Invoke, warmed, cache_dir) -> None:  # noqa: ANN001
    with aot.Cache(cache_dir) as cache:
        entries = cache.entries()
        for commit, n in (("c1", 1), ("c2", 2)):
            set_id = cache.index.open_release("candidate", RefOrigin("ci", commit=commit))
            cache.index.set_refs([(e.name, e.signature, e.env_fp, e.key) for e in entries[:n]],
                                 RefOrigin("ci"), release_id=set_id)
    assert invoke("release", "promote", "candidate", "prod").exit_code == 0
    assert invoke("release", "rollback", "candidate").exit_code == 0
    assert invoke("release", "promote", "candidate", "prod").exit_code == 0
    assert invoke("release", "rollback", "prod").exit_code == 0
    moves = json.loads(invoke("release", "history", "prod", "--json").stdout)["history"]
    left, restored = moves[1]["id"], moves[2]["id"]
    # Each promotion names the set it promoted and keeps its commit (issue 52).
    promoted = [m["promoted_from"]["set"] for m in moves[1:]]
    assert [m["move"] for m in moves] == [
        f"rolled back to set {restored} from set {left}",
        f"promoted from candidate set {promoted[0]}", f"promoted from candidate set {promoted[1]}",
    ]
    assert [m["commit"] for m in moves] == ["c2", "c1", "c2"]  # a rollback restores the set's commit too
    assert [m["promoted_from"] for m in moves] == [
        None, {"label": "candidate", "set": promoted[0]}, {"label": "candidate", "set": promoted[1]},
    ]
    assert moves[0]["id"] > left > restored and moves[1]["previous"] == restored
    assert all(m["user"] and m["host"] and m["created_at"] for m in moves)
    text = invoke("release", "history", "candidate").stdout.splitlines()
    sets = [int(line[6:].split()[0]) for line in text]  # "* set 4  ..." / "  set 2  ..."
    assert text[0].startswith("* set ")
    # The rollback names the set it restored (the first, c1) and the one it left (c2),
    # and, having restored the first set, no earlier one to go back to.
    assert text[0].endswith(f"rolled back to set {sets[2]} from set {sets[1]}  commit c1  [cpu x8]  (no earlier set)")
    assert text[1].endswith(f"declared by ci  commit c2  [cpu x8 (2)]  (replaced set {sets[2]})")
    assert text[2].endswith("declared by ci  commit c1  [cpu x8]  (first set)")
    assert len(invoke("release", "history", "candidate", "--limit", "1").stdout.splitlines()) == 1
    missing = invoke("release", "history", "nope")
    assert missing.exit_code == 1 and "no release labelled 'nope'" in missing.output


@needs_libtpu
def test_release_show_and_history_name_each_member_target(invoke: Invoke, cache_dir) -> None:  # noqa: ANN001
    """A set holding one function for tpu:v5e:1x1 and tpu:v5e:2x2: the members no longer
    look the same (issue 43)."""
    base = ("compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--name", "tiny")
    for target in ("tpu:v5e:1x1", "tpu:v5e:2x2"):
        assert invoke(*base, "--target", target).exit_code == 0
    with aot.Cache(cache_dir) as cache:
        entries = cache.entries()
        first = cache.index.open_release("prod", RefOrigin("ci", commit="c1"))
        small = [e for e in entries if json.loads(e.manifest)["environment"]["parts"]["device_count"] == "1"]
        cache.index.set_refs([(e.name, e.signature, e.env_fp, e.key) for e in small], RefOrigin("ci"), release_id=first)
        second = cache.index.open_release("prod", RefOrigin("ci", commit="c2"))
        cache.index.set_refs([(e.name, e.signature, e.env_fp, e.key) for e in entries], RefOrigin("ci"), release_id=second)
    target = {e.key: "tpu:v5e:1x1" if e in small else "tpu:v5e:2x2" for e in entries}
    _, *members = invoke("release", "show", "prod").stdout.splitlines()
    assert sorted(members) == sorted(f"  {key[:12]}  {t}  tiny (f32[8], f32[8])" for key, t in target.items())
    shown = json.loads(invoke("release", "show", "prod", "--json").stdout)
    assert {m["key"]: m["target"] for m in shown["members"]} == target
    now, before = invoke("release", "history", "prod").stdout.splitlines()
    assert "  declared by ci  commit c2  [tpu:v5e:1x1, tpu:v5e:2x2]  (replaced set " in now
    assert before.endswith("  declared by ci  commit c1  [tpu:v5e:1x1]  (first set)")
    history = json.loads(invoke("release", "history", "prod", "--json").stdout)["history"]
    assert [h["targets"] for h in history] == [{"tpu:v5e:1x1": 1, "tpu:v5e:2x2": 1}, {"tpu:v5e:1x1": 1}]


# ---------------------------------------------------------------- releases over several warm-ups

SERVE_TOML = '''
[[function]]
name = "tiny"
function = "fixtures.models:tiny"
args = ["f32[{n}]", "f32[{n}]"]
vary = { n = SIZES }
'''

SHARDED_TOML = '''
[[function]]
name = "matmul"
function = "fixtures.models:matmul"
args = ["f32[2,3]", "f32[3,2]"]
'''


def _members(invoke: Invoke, label: str) -> list[tuple[str, str]]:
    shown = json.loads(invoke("release", "show", label, "--json").stdout)
    return sorted((m["name"], m["signature"]) for m in shown["members"])


def test_warmups_of_one_commit_build_one_release_and_another_commit_keeps_the_rest(
    invoke: Invoke, tmp_path, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    from aot.cache.index.refs import COMMIT_VARIABLES

    for variable in COMMIT_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    serve, sharded = tmp_path / "serve.toml", tmp_path / "sharded.toml"
    serve.write_text(SERVE_TOML.replace("SIZES", "[4, 8]"))
    sharded.write_text(SHARDED_TOML)
    both = [("matmul", "f32[2,3], f32[3,2]"), ("tiny", "f32[4], f32[4]"), ("tiny", "f32[8], f32[8]")]

    def history() -> list[dict]:
        return json.loads(invoke("release", "history", "candidate", "--json").stdout)["history"]

    # One CI job, one commit, two manifests: one release with the members of both.
    for manifest in (serve, sharded):
        result = invoke("warmup", manifest, "--release", "candidate", "--commit", "c1")
        assert result.exit_code == 0, result.output
    assert _members(invoke, "candidate") == both
    assert len(history()) == 1
    # Both manifests declared the set, and both are credited (issue 52).
    assert history()[0]["move"] == f"declared by warmup {serve}, warmup {sharded}"
    again = invoke("warmup", serve, "--release", "candidate", "--commit", "c1")
    assert again.exit_code == 0 and history()[0]["source"] == f"warmup {serve}, warmup {sharded}"

    # The next commit's first warm-up opens a new set that keeps the other manifest's
    # member, and says so; the second manifest's warm-up of that commit joins the set.
    serve.write_text(SERVE_TOML.replace("SIZES", "[4, 8, 16]"))
    first = invoke("warmup", serve, "--release", "candidate", "--commit", "c2")
    assert first.exit_code == 0, first.output
    # Once, on stderr (a warning), not in the summary on stdout.
    assert first.stderr.splitlines() == [
        "aot: WARNING: release candidate: kept 1 member of its previous set that this warm-up does not compile: "
        "matmul (f32[2,3], f32[3,2]) (a later warm-up of this run replaces them; --replace starts the label over)"
    ], first.stderr
    assert "kept" not in first.stdout, first.stdout
    assert _members(invoke, "candidate") == [both[0]] + [("tiny", f"f32[{n}], f32[{n}]") for n in (16, 4, 8)]
    second = invoke("warmup", sharded, "--release", "candidate", "--commit", "c2", "--json")
    assert second.exit_code == 0 and json.loads(second.stdout)["carried"] == [], second.output
    assert [h["commit"] for h in history()] == ["c2", "c1"]

    # --replace starts the label over with this run's entries.
    replaced = invoke("warmup", serve, "--release", "candidate", "--commit", "c3", "--replace")
    assert replaced.exit_code == 0, replaced.output
    assert _members(invoke, "candidate") == [("tiny", f"f32[{n}], f32[{n}]") for n in (16, 4, 8)]

    # --run joins warm-ups whatever their commits.
    assert invoke("warmup", serve, "--release", "candidate", "--run", "r9").exit_code == 0
    joined = invoke("warmup", sharded, "--release", "candidate", "--run", "r9", "--commit", "c4")
    assert joined.exit_code == 0, joined.output
    assert ("matmul", "f32[2,3], f32[3,2]") in _members(invoke, "candidate")
    assert [h["commit"] for h in history()][:2] == [None, "c3"]


def test_replace_needs_a_release(invoke: Invoke) -> None:
    result = invoke("warmup", "fixtures/warmup.toml", "--replace")
    assert result.exit_code == 2 and "give --release LABEL with it" in result.output


# ---------------------------------------------------------------- release diff

TINY = ("compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--name", "tiny")


def _stablehlo(cache: aot.Cache, key: str) -> str:
    return json.loads(cache.index.get(key).manifest)["program"]["parts"]["stablehlo"]


def test_release_diff_names_each_member_that_differs_and_why(invoke: Invoke, warmed, cache_dir) -> None:  # noqa: ANN001
    """prod serves tiny, allreduce and one mlp bucket; candidate has tiny compiled with
    a donation, the same mlp bucket and another: the diff says what promoting candidate
    to prod changes, and for tiny the parts that differ, as `aot why` names them."""
    assert invoke(*TINY, "--donate", "0").exit_code == 0
    with aot.Cache(cache_dir) as cache:
        entries = cache.entries()
        tiny, donated = sorted((e for e in entries if e.name == "tiny"),
                               key=lambda e: json.loads(e.manifest)["program"]["parts"]["donated"] == "[0]")
        mlp = sorted((e for e in entries if e.name == "mlp.forward"), key=lambda e: e.signature)
        allreduce = next(e for e in entries if e.name == "allreduce")
        for label, members, commit in (("prod", [tiny, allreduce, mlp[0]], "c1"),
                                       ("candidate", [donated, mlp[0], mlp[1]], "c2")):
            cache.index.declare_release(label, [(e.name, e.signature, e.env_fp, e.key) for e in members],
                                        RefOrigin("ci", commit=commit))
        hlo = _stablehlo(cache, tiny.key), _stablehlo(cache, donated.key)
    prod, candidate = (json.loads(invoke("release", "show", label, "--json").stdout)["id"]
                       for label in ("prod", "candidate"))
    result = invoke("release", "diff", "prod", "candidate")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"prod (set {prod}) -> candidate (set {candidate}): 1 added, 1 removed, 1 changed, 1 member the same",
        f"  - {allreduce.key[:12]}  cpu x8  allreduce (f32[8,1024])",
        f"  + {mlp[1].key[:12]}  cpu x8  mlp.forward ({mlp[1].signature})",
        f"  ~ {tiny.key[:12]} -> {donated.key[:12]}  cpu x8  tiny (f32[8], f32[8])",
        "      donated [] != [0]",
        f"      stablehlo {hlo[0]} != {hlo[1]}",
    ]
    data = json.loads(invoke("release", "diff", "prod", "candidate", "--json").stdout)
    assert (data["a"]["commit"], data["b"]["commit"], data["added"], data["removed"], data["changed"],
            data["same"]) == ("c1", "c2", 1, 1, 1, 1)
    assert data["changes"][2] == {
        "change": "changed", "name": "tiny", "signature": "f32[8], f32[8]", "key_a": tiny.key,
        "key_b": donated.key, "target_a": "cpu x8", "target_b": "cpu x8", "note": None,
        "differences": [{"part": "donated", "expected": "[]", "actual": "[0]"},
                        {"part": "stablehlo", "expected": hlo[0], "actual": hlo[1]}],
    }
    same = invoke("release", "diff", "prod", "prod")
    assert same.stdout == f"prod (set {prod}) -> prod (set {prod}): 0 added, 0 removed, 0 changed, 3 members the same\n"
    missing = invoke("release", "diff", "prod", "nope")
    assert missing.exit_code == 1 and "no release labelled 'nope'" in one_line_error(missing)
