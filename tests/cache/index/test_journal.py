"""Release sets and captured GPUs journaled as blobs (schema 11): each change writes the
new blob and deletes the old one, gc keeps a journaled blob while its declaration lives,
``release rm`` takes the blobs along; SQLite and PostgreSQL indexes."""

from __future__ import annotations

from pathlib import Path

import pytest

import aot
from aot.cache.index.entry import BLOB_COLUMNS
from aot.cache.index.journal import RELEASE, TARGET, JournaledRelease, JournaledTarget, read_journal
from aot.cache.index.refs import RefOrigin, ReleaseMember
from aot.cache.index.schema import blob_columns
from aot.cache.index.targets import CapturedTarget
from tests.cache.conftest import Compiled


def test_gc_counts_every_blob_column_of_the_schema() -> None:
    """The one list gc's queries union is the schema's columns marked as blob references."""
    assert set(BLOB_COLUMNS) == set(blob_columns())


@pytest.fixture
def cache(index_url: str, tmp_path: Path) -> aot.Cache:
    with aot.Cache(index_url, blob_location=str(tmp_path / "blobs")) as c:
        yield c


def _journaled(cache: aot.Cache) -> dict[tuple[str, str], JournaledRelease | JournaledTarget]:
    out = {}
    for key, digest in cache.index.journal_rows().items():
        data = cache.blobs.get(digest)
        assert data is not None, key
        found = read_journal(data)
        assert found is not None, key
        out[key] = found
    return out


def test_each_change_of_a_set_is_journaled_and_the_old_blob_goes(cache: aot.Cache, compiled: Compiled) -> None:
    tiny = cache.put_artifact(compiled.tiny)
    mlp = cache.put_artifact(compiled.mlp[1])
    set_id, _ = cache.index.declare_release("prod", [(tiny.name, tiny.signature, tiny.env_fp, tiny.key)],
                                            RefOrigin("ci", commit="c1"), run="run-1")
    first = cache.index.journal_rows()[(RELEASE, str(set_id))]
    (journaled,) = _journaled(cache).values()
    assert isinstance(journaled, JournaledRelease)
    assert (journaled.id, journaled.label, journaled.commit, journaled.previous) == (set_id, "prod", "c1", None)
    assert journaled.members == (ReleaseMember(tiny.name, tiny.signature, tiny.env_fp, tiny.key),)

    # A shard of the same run adds to the set: journaled again, the old blob deleted.
    cache.index.declare_release("prod", [(mlp.name, mlp.signature, mlp.env_fp, mlp.key)],
                                RefOrigin("ci", commit="c1"), run="run-1")
    second = cache.index.journal_rows()[(RELEASE, str(set_id))]
    assert second != first and not cache.blobs.has(first)
    assert {m.key for m in _journaled(cache)[(RELEASE, str(set_id))].members} == {tiny.key, mlp.key}  # type: ignore[union-attr]

    promoted = cache.promote("prod", "canary")
    assert (RELEASE, str(promoted.id)) in cache.index.journal_rows()
    cache.index.put_captured_target(CapturedTarget(
        name="fleet", platform="cuda", config="gpu_device_info { }\n", config_digest="sha256:" + "0" * 64,
        versions="{}", device_kind="NVIDIA H200", host="h", user="u",
    ))
    target = _journaled(cache)[(TARGET, "fleet")]
    assert isinstance(target, JournaledTarget) and target.values["device_kind"] == "NVIDIA H200"

    # gc keeps every journaled blob while its set or capture lives (even unused, old).
    plan = cache.gc(older_than="0s", dry_run=True)
    assert not set(plan.blobs) & set(cache.index.journal_rows().values())

    # release rm takes the label's journal blobs along: a repair cannot bring it back.
    blobs = dict(cache.index.journal_rows())
    cache.remove_release("canary")
    assert (RELEASE, str(promoted.id)) not in cache.index.journal_rows()
    assert not cache.blobs.has(blobs[(RELEASE, str(promoted.id))])
    assert cache.blobs.has(blobs[(RELEASE, str(set_id))])


def test_a_set_written_without_a_journal_is_journaled_by_the_next_change(
    index_url: str, tmp_path: Path, compiled: Compiled,
) -> None:
    """An index opened alone (no blob store: as a schema 10 one migrated) records the set
    without a journal; the next change through a cache journals every set missing one."""
    from aot.cache.index.sql import Index

    with aot.Cache(index_url, blob_location=str(tmp_path / "blobs")) as cache:
        tiny = cache.put_artifact(compiled.tiny)
    with Index(index_url) as alone:
        old, _ = alone.declare_release("prod", [(tiny.name, tiny.signature, tiny.env_fp, tiny.key)], RefOrigin("ci"))
        assert alone.journal_rows() == {}
    with aot.Cache(index_url, blob_location=str(tmp_path / "blobs")) as cache:
        new = cache.promote("prod", "canary")
        assert set(cache.index.journal_rows()) == {(RELEASE, str(old)), (RELEASE, str(new.id))}
