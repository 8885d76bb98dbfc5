"""Refs, their history, releases and the cache's description, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest

from aot.cache.index.refs import RefOrigin, ReleaseMember
from aot.cache.index.sql import Index
from aot.errors import CacheError

ENV = "env-cpu-1"
SIG = "x: f32[8]"


def origin(source: str = "test", **kw: str) -> RefOrigin:
    return RefOrigin(source, host="h", user="u", commit=kw.pop("commit", None), **kw)


def test_a_ref_names_the_key_set_last_and_keeps_its_history(index: Index) -> None:
    index.set_refs([("m", SIG, ENV, "k1")], origin("warmup v1"))
    index.set_refs([("m", SIG, ENV, "k2")], origin("warmup v2"))
    index.set_refs([("m", SIG, ENV, "k1")], origin("warmup v1 again"))
    [ref] = index.refs_named("m")
    assert (ref.key, ref.source) == ("k1", "warmup v1 again")
    history = index.ref_history("m")
    assert [h.key for h in history] == ["k1", "k2", "k1"]
    assert history[0].seq > history[1].seq > history[2].seq


def test_setting_a_ref_to_the_key_it_names_adds_no_history(index: Index) -> None:
    assert len(index.set_refs([("m", SIG, ENV, "k1")], origin())) == 1
    assert index.set_refs([("m", SIG, ENV, "k1")], origin()) == []
    assert len(index.ref_history("m")) == 1


def test_refs_are_per_signature_and_environment(index: Index) -> None:
    index.set_refs([("m", SIG, ENV, "a"), ("m", "x: f32[16]", ENV, "b"), ("m", SIG, "env-2", "c")], origin())
    assert {(r.signature, r.env_fp): r.key for r in index.refs_named("m")} == {
        (SIG, ENV): "a", ("x: f32[16]", ENV): "b", (SIG, "env-2"): "c",
    }
    assert sorted(r.key for r in index.refs_named("m", ENV)) == ["a", "b"]
    assert [r.name for r in index.refs("m*")] == ["m", "m", "m"]
    assert index.drop_refs([("m", SIG, "env-2")]) == 1
    assert len(index.refs_named("m")) == 2


def test_concurrent_setters_leave_the_ref_at_the_latest_history_record(index: Index) -> None:
    def set_many(worker: int) -> None:
        for i in range(10):
            index.set_refs([("m", SIG, ENV, f"k{worker}-{i}")], origin())

    threads = [threading.Thread(target=set_many, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    [ref] = index.refs_named("m")
    assert ref.key == index.ref_history("m", limit=1)[0].key


def test_release_promote_and_rollback(index: Index) -> None:
    first = index.open_release("candidate", origin("warmup"))
    index.set_refs([("m", SIG, ENV, "k1")], origin(release="candidate"), release_id=first)
    index.promote("candidate", "prod", origin("promote"))
    second = index.open_release("candidate", origin("warmup"))
    index.set_refs([("m", SIG, ENV, "k2")], origin(release="candidate"), release_id=second)
    index.promote("candidate", "prod", origin("promote"))

    prod = index.release_set("prod")
    assert prod is not None and prod.keys() == {"k2"}
    assert index.rollback("prod", origin("rollback"), require_stored=False).keys() == {"k1"}
    assert [r.label for r in index.releases()] == ["candidate", "prod"]
    assert len(index.release_history("prod")) == 3
    with pytest.raises(CacheError, match="cannot roll back release .*: it has no earlier set to go back to") as raised:
        index.rollback("prod", origin("rollback"))
    assert "aot release promote OTHER prod" in str(raised.value)
    with pytest.raises(CacheError, match="no release labelled 'nope'"):
        index.promote("nope", "prod", origin())


def test_shards_of_one_run_share_a_release_set(index: Index) -> None:
    a = index.open_release("rc", origin(), run="commit-1")
    b = index.open_release("rc", origin(), run="commit-1")
    c = index.open_release("rc", origin(), run="commit-2")
    assert a == b != c
    index.add_release_members(c, [ReleaseMember("m", SIG, ENV, "k")])
    release = index.release_set("rc", name="m")
    assert release is not None and release.previous == a and release.keys() == {"k"}


def test_pins_cover_refs_and_live_releases(index: Index) -> None:
    index.set_refs([("m", SIG, ENV, "served")], origin())
    s1 = index.open_release("prod", origin())
    index.add_release_members(s1, [ReleaseMember("m", SIG, ENV, "oldest")])
    s2 = index.open_release("prod", origin())
    index.add_release_members(s2, [ReleaseMember("m", SIG, ENV, "previous")])
    s3 = index.open_release("prod", origin())
    index.add_release_members(s3, [ReleaseMember("m", SIG, ENV, "current")])
    pins = index.pinned_keys()
    assert set(pins) == {"served", "previous", "current", "oldest"}  # every set a rollback reaches
    assert pins["previous"] == "release prod (rollback target)"
    assert pins["oldest"] == "release prod (rollback target, 2 steps back)"


def test_invalid_labels_are_refused(index: Index) -> None:
    with pytest.raises(CacheError, match="invalid release label"):
        index.open_release("two words", origin())


def test_the_first_description_recorded_stays(index: Index) -> None:
    assert index.description() is None
    first = index.describe("s3://bucket/blobs", "zstd", 3)
    again = index.describe("/elsewhere", "zstd", 3)
    assert first == again and again.blob_location == "s3://bucket/blobs"


def test_removing_a_release_keeps_a_set_recorded_after_the_plan(index: Index) -> None:
    first = index.open_release("canary", origin("warmup"))
    index.set_refs([("m", SIG, ENV, "k1")], origin(release="canary"), release_id=first)
    plan = index.plan_release_removal(["canary"])
    assert plan.unpinned == ()  # k1 is not stored: nothing for gc to collect
    assert [(m.key, why) for m, why in plan.still_pinned] == [("k1", "served ref of m")]
    second = index.open_release("canary", origin("warmup"))  # a warm-up, after the plan
    index.set_refs([("m", SIG, ENV, "k2")], origin(release="canary"), release_id=second)
    assert index.remove_releases(plan).executed
    [kept] = index.releases()
    assert (kept.label, kept.id) == ("canary", second)
    assert index.release_history("canary") == [kept]
    assert index.pinned_keys() == {"k2": "served ref of m"}
    with pytest.raises(CacheError, match="its previous set .* is gone"):
        index.rollback("canary", origin("rollback"))


def test_a_promotion_keeps_the_set_it_promoted_and_its_commit(index: Index) -> None:
    """prod promoted from candidate says which set, at which commit, however the
    promoter's own environment names none; a rollback restores the set's commit too
    (issue 52)."""
    first, _ = index.declare_release("candidate", [("m", SIG, ENV, "k1")], origin("warmup serve.toml", commit="c1"))
    promoted = index.promote("candidate", "prod", origin("promote candidate"))
    assert (promoted.promoted_from, promoted.commit, promoted.move()) == (
        ("candidate", first), "c1", f"promoted from candidate set {first}",
    )
    second, _ = index.declare_release("candidate", [("m", SIG, ENV, "k2")], origin("warmup serve.toml", commit="c2"))
    again = index.promote("candidate", "prod", origin("promote candidate", commit="cd-pipeline"))
    assert (again.promoted_from, again.commit) == (("candidate", second), "c2")  # the set's commit wins
    back = index.rollback("prod", origin("rollback prod"), require_stored=False)
    assert (back.rolled_back, back.commit) == ((promoted.id, again.id), "c1")


def test_a_run_set_credits_each_manifest_that_declared_members(index: Index) -> None:
    run = "commit c1"
    set_id, _ = index.declare_release("candidate", [("m", SIG, ENV, "k1")], origin("warmup serve.toml"), run=run)
    index.declare_release("candidate", [("t", SIG, ENV, "k2")], origin("warmup train.toml"), run=run)
    index.declare_release("candidate", [("m", SIG, ENV, "k1")], origin("warmup serve.toml"), run=run)  # a shard again
    index.declare_release("candidate", [], origin("warmup empty.toml"), run=run)  # declared nothing
    release = index.release_set("candidate")
    assert release is not None and release.id == set_id
    assert release.move() == "declared by warmup serve.toml, warmup train.toml"
