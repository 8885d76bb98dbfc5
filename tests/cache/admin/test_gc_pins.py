"""gc keeps what refs and releases pin; --superseded follows refs; --manifest drops the
refs of signatures a manifest no longer lists. SQLite and PostgreSQL indexes."""

from __future__ import annotations

from pathlib import Path

import pytest

import aot
from aot.cache.index.refs import RefOrigin

MANIFEST = '''
[[function]]
name = "pin.f"
function = "fixtures.models:tiny"
args = ["f32[{n}]", "f32[{n}]"]
vary = { n = [SIZES] }
'''


@pytest.fixture
def cache(index_url: str, tmp_path: Path) -> aot.Cache:
    with aot.Cache(index_url, blob_location=str(tmp_path / "blobs")) as c:
        yield c


def test_superseded_follows_the_ref_and_pins_are_kept(cache: aot.Cache) -> None:
    old = cache.compile_entry(lambda x: x + 1.0, "f32[2]", name="pin.g").entry
    new = cache.compile_entry(lambda x: x + 2.0, "f32[2]", name="pin.g").entry
    # Declare the older one served (a rollback): --superseded removes the newer one.
    cache.set_refs([old], RefOrigin("rollback"))
    plan = cache.gc(superseded=True, dry_run=True)
    assert [v.key for v in plan.entries] == [new.key]
    # A release pins the newer one: nothing goes, and the plan says why.
    set_id = cache.index.open_release("candidate", RefOrigin("test"))
    cache.index.set_refs([(new.name, new.signature, new.env_fp, new.key)], RefOrigin("t"), release_id=set_id)
    cache.set_refs([old], RefOrigin("rollback"))
    plan = cache.gc(superseded=True)
    assert plan.entries == ()
    assert [(v.key, v.reason) for v in plan.pinned] == [(new.key, f"pinned: release candidate (superseded by {old.key[:12]})")]
    assert {e.key for e in cache.entries("pin.g")} == {old.key, new.key}


def test_gc_manifest_drops_refs_of_signatures_no_longer_listed(
    cache: aot.Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.cli.helpers import REPO
    from aot.cache.warmup.run import expand, load_manifest, run_warmup

    monkeypatch.chdir(REPO)
    first = tmp_path / "first.toml"
    first.write_text(MANIFEST.replace("SIZES", "2, 3"))
    assert run_warmup(cache, expand(load_manifest(first))).ok
    second = tmp_path / "second.toml"
    second.write_text(MANIFEST.replace("SIZES", "3"))
    assert run_warmup(cache, expand(load_manifest(second))).ok
    other = cache.compile_entry(lambda x: x * 5.0, "f32[7]", name="unlisted").entry
    assert cache.gc(dry_run=True).entries == ()  # f32[2] is still ref'd: kept
    plan = cache.gc(manifest=str(second))
    assert plan.dropped_refs == (("pin.f", "f32[2], f32[2]"),)
    assert [v.signature for v in plan.entries] == ["f32[2], f32[2]"]
    assert [e.signature for e in cache.entries("pin.f")] == ["f32[3], f32[3]"]
    assert [r.signature for r in cache.refs_named("pin.f")] == ["f32[3], f32[3]"]
    assert [e.key for e in cache.entries("unlisted")] == [other.key]


def _three_releases(cache: aot.Cache) -> list:
    """prod's sets 1, 2, 3 name versions a, b, c of one slot; no ref pins any of them."""
    versions = [cache.compile_entry(lambda x, k=k: x + k, "f32[2]", name="roll.f").entry for k in (1.0, 2.0, 3.0)]
    for entry in versions:
        set_id = cache.index.open_release("prod", RefOrigin("warmup"))
        cache.index.set_refs([(entry.name, entry.signature, entry.env_fp, entry.key)], RefOrigin("w"), release_id=set_id)
    cache.index.drop_refs([(e.name, e.signature, e.env_fp) for e in versions[:1]])
    return versions


def test_gc_keeps_every_set_a_rollback_can_reach(cache: aot.Cache) -> None:
    """issue 38: gc pinned the current set and one step back; a second rollback landed
    on collected entries and prod served nothing."""
    a, b, c = _three_releases(cache)
    plan = cache.gc(older_than="0s")
    assert plan.entries == ()
    assert {(v.key, v.reason) for v in plan.pinned} >= {
        (a.key, "pinned: release prod (rollback target, 2 steps back) (unused for more than 0s)"),
        (b.key, "pinned: release prod (rollback target) (unused for more than 0s)"),
    }
    for expected in (b, a):  # two rollbacks, with a gc after each: each lands on a stored entry
        back = cache.index.rollback("prod", RefOrigin("rollback prod"))
        assert back.keys() == {expected.key}
        cache.gc(older_than="0s")
        assert cache.index.get(expected.key) is not None
    # prod is at a's set now: c (rolled back from) is no longer reachable, and goes.
    assert cache.index.get(c.key) is None


def test_release_rm_unpins_every_set_down_the_chain(cache: aot.Cache) -> None:
    a, b, c = _three_releases(cache)
    plan = cache.index.plan_release_removal(["prod"])
    assert {m.key for m in plan.unpinned} == {a.key, b.key, c.key}


@pytest.mark.parametrize("damage", ["removed", "quarantined"])
def test_rollback_refuses_a_set_naming_an_entry_not_stored_or_not_intact(cache: aot.Cache, damage: str) -> None:
    """issue 38: after `aot rm --force` of a rollback target, `release rollback` exited
    0 onto a set replicas cannot serve. It refuses now, naming the entry, and the
    label stays where it was."""
    from aot.cache.admin.removal import remove
    from aot.errors import CacheError

    a, b, c = _three_releases(cache)
    before = cache.index.release_set("prod")
    assert before is not None and before.keys() == {c.key}
    if damage == "removed":
        remove(cache, b.key, force=True)
        assert cache.index.get(b.key) is None
    else:
        cache.index.quarantine(b.key, "test")
    with pytest.raises(CacheError) as refused:
        cache.rollback("prod")
    message = str(refused.value)
    assert "\n" not in message and b.key[:12] in message
    assert ("not stored" if damage == "removed" else "quarantined") in message
    assert f"stays on set {before.id}" in message
    after = cache.index.release_set("prod")
    assert after is not None and (after.id, after.keys()) == (before.id, {c.key})
    assert len(cache.index.release_history("prod")) == 3
