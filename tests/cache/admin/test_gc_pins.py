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
target = "fixtures.models:tiny"
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
