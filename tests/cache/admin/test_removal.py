"""aot rm in the library (aot.cache.admin.removal) on every backend, and superseded entries."""

from __future__ import annotations

from dataclasses import replace

import pytest

import aot
from aot.cache.index.served import superseded_keys
from aot.cache.reports.listing import list_entries
from aot.cache.admin.removal import SignatureFilter, execute_removal, plan_removal


def test_plan_then_execute_removes_rows_then_unshared_blobs(cache, compiled) -> None:  # noqa: ANN001
    for artifact in compiled.all():
        cache.put(artifact)
    before = set(cache.blobs.digests())
    plan = plan_removal(cache, "mlp.*", signatures=["x: f32[2,784]"])
    (victim,) = plan.entries
    assert victim.signature.endswith("f32[2,784]") and victim.environment == "this"
    assert not plan.executed and len(plan.blobs) == 3 and plan.bytes_freed > 0  # executable, HLO, manifest
    assert set(cache.blobs.digests()) == before  # planning changes nothing
    done = execute_removal(cache, plan)
    assert done.executed and set(done.blobs) == set(plan.blobs)
    assert set(cache.blobs.digests()) == before - set(plan.blobs)
    assert sorted(e.signature.rsplit(", ", 1)[1] for e in cache.entries("mlp.forward")) == ["f32[1,784]", "f32[4,784]"]
    assert cache.verify().ok


def test_a_blob_referenced_meanwhile_is_kept(cache, compiled) -> None:  # noqa: ANN001
    """Between the plan and its execution another entry starts using a planned blob."""
    entry = cache.put(compiled.tiny)
    plan = plan_removal(cache, "tiny")
    assert set(plan.blobs) == {entry.exe_digest, entry.hlo_digest, entry.manifest_digest}
    manifest_size = cache.blobs.stored_size(entry.manifest_digest)
    twin = replace(compiled.tiny.manifest, name="tiny.twin")  # same blobs, other name
    from aot.artifact import Artifact
    from aot.fingerprint import combined_key

    program = replace(twin.program, parts=tuple((k, "tiny.twin" if k == "name" else v) for k, v in twin.program.parts))
    twin = replace(twin, program=program, key=combined_key(program, twin.environment))
    cache.put_artifact(Artifact(twin, dict(compiled.tiny.blobs)))
    done = execute_removal(cache, plan)
    # The twin's manifest is another blob: only tiny's, which nothing else references, goes.
    assert done.blobs == (entry.manifest_digest,) and done.bytes_freed == manifest_size
    assert cache.artifact(cache.entries("tiny.twin")[0]).blob("executable")


def test_an_ambiguous_or_unknown_target(cache, compiled) -> None:  # noqa: ANN001
    for artifact in compiled.all():
        cache.put(artifact)
    with pytest.raises(aot.ArtifactNotFoundError, match="did you mean 'tiny'"):
        plan_removal(cache, "tinny")
    keys = sorted(e.key for e in cache.entries())
    plan = plan_removal(cache, keys[0][:6])
    assert [v.key for v in plan.entries] == [keys[0]]


def test_signature_filters() -> None:
    assert SignatureFilter.parse("float32[8], f32[8]").flat == "f32[8], f32[8]"
    named = SignatureFilter.parse("params[0]['b']: f32[512], x: bfloat16[2]")
    assert named.leaves == (("params[0]['b']", "f32[512]"), ("x", "bf16[2]"))
    with pytest.raises(aot.SpecError, match="has no path"):
        SignatureFilter.parse("x: f32[8], f32[8]")


def test_superseded_keys(open_folder_cache, compiled, foreign) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    old = cache.put(compiled.tiny)
    changed = replace(compiled.tiny.manifest.program, parts=tuple(
        (k, "sha256:changed" if k == "stablehlo" else v) for k, v in compiled.tiny.manifest.program.parts
    ))
    from aot.artifact import Artifact
    from aot.fingerprint import combined_key

    manifest = replace(compiled.tiny.manifest, program=changed, key=combined_key(changed, compiled.tiny.manifest.environment))
    new = cache.put_artifact(Artifact(manifest, dict(compiled.tiny.blobs)))
    other_env = cache.put(foreign(compiled.tiny, device_count="4"))
    # The legacy rule, for slots without a ref: the newest intact entry serves.
    assert superseded_keys(cache.entries()) == {old.key: new.key}
    # put declared `old` (its ref); a row stored beside it without a put, as a copy
    # stores one, serves nothing until a warm-up or put declares it.
    rows = {r.entry.key: r for r in list_entries(cache).rows}
    assert rows[old.key].status == "ok" and rows[new.key].status == "superseded"
    assert rows[other_env.key].environment.short() == "device_count 4"
    cache.quarantine(new, "test")  # a quarantined newer row supersedes nothing
    assert superseded_keys(cache.entries()) == {}
    plan = cache.gc(superseded=True, dry_run=True)
    assert [v.key for v in plan.entries] == [new.key]  # only the quarantined one


def test_rm_refuses_an_entry_a_release_pins_without_force(tmp_path) -> None:  # noqa: ANN001
    """issue 38: ``rm`` deleted what a release serves, without a word."""
    import aot
    from aot.cache.admin.removal import execute_removal, plan_removal, remove
    from aot.cache.index.refs import RefOrigin
    from aot.errors import CacheError

    with aot.Cache(tmp_path / "cache") as cache:
        old = cache.compile_entry(lambda x: x + 1.0, "f32[2]", name="pinned.f").entry
        cache.compile_entry(lambda x: x + 2.0, "f32[2]", name="pinned.f")  # supersedes old
        set_id = cache.index.open_release("prod", RefOrigin("ci"))
        cache.index.set_refs([(old.name, old.signature, old.env_fp, old.key)], RefOrigin("ci"), release_id=set_id)
        plan = plan_removal(cache, old.key)
        assert [v.pinned_by for v in plan.entries] == [("prod",)]
        assert plan.to_dict()["pinned"] == [old.key]
        with pytest.raises(CacheError, match=r"release label prod pins .*--force"):
            execute_removal(cache, plan)
        assert cache.index.get(old.key) is not None
        assert remove(cache, old.key, force=True).executed
        assert cache.index.get(old.key) is None
