"""aot release ls/show/promote/rollback and aot history, over a warmed cache."""

from __future__ import annotations

import json

import aot
from aot.cache.index.refs import RefOrigin
from tests.cli.helpers import Invoke


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
    shown = json.loads(invoke("release", "show", "prod", "--json").stdout)
    assert sorted(m["key"] for m in shown["members"]) == sorted(e.key for e in entries[:3])
    back = invoke("release", "rollback", "candidate")
    assert back.exit_code == 0 and back.stdout.endswith(", 2 members\n"), back.output
    again = invoke("release", "rollback", "candidate")
    assert again.exit_code == 1 and "nothing to roll back to" in again.output
    missing = invoke("release", "show", "nope")
    assert missing.exit_code == 1 and "no release labelled 'nope'" in missing.output
    name = entries[0].name
    history = json.loads(invoke("history", name, "--json").stdout)["history"]
    assert history and all(h["name"] == name for h in history)
    assert history[0]["source"].startswith("warmup")
    assert invoke("history", name).stdout.splitlines()[0].split("  ")[1] == history[0]["key"][:12]
