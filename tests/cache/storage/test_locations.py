"""aot.cache.storage.locations: a location's kind by scheme, and opening its store.

An unknown scheme is refused, never taken for a local folder; an object-store URL
without its driver names the extra to install.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aot.cache.storage.content import ContentStore, digest_of
from aot.cache.storage.folder import FolderObjectStore
from aot.errors import CacheError

PAYLOAD = b"HloModule jit_forward, entry_computation_layout={(f32[8,128])->f32[8,128]}\n" * 400


def test_open_object_store_picks_the_class_by_scheme(tmp_path: Path, sqlite_url: str) -> None:
    from aot.cache.storage.database import SqlObjectStore
    from aot.cache.storage.locations import classify_location, open_object_store

    folder = open_object_store(str(tmp_path / "a"))
    assert isinstance(folder, FolderObjectStore) and folder.root == tmp_path / "a"
    by_url = open_object_store(f"file://{tmp_path / 'a'}")
    assert isinstance(by_url, FolderObjectStore) and by_url.root == tmp_path / "a"
    # the same layout: what one writes, the other reads
    ContentStore(folder).put(PAYLOAD)
    assert ContentStore(by_url).get(digest_of(PAYLOAD)) == PAYLOAD
    sql = open_object_store(sqlite_url)
    try:
        assert isinstance(sql, SqlObjectStore)
        ContentStore(sql).put(PAYLOAD)
        assert ContentStore(sql).get(digest_of(PAYLOAD)) == PAYLOAD
    finally:
        sql.close()
    assert classify_location("postgresql+psycopg://u:secret@h/db").kind == "database"
    assert classify_location("sqlite:////tmp/x.sqlite").kind == "database"
    assert classify_location("s3://bucket/prefix").kind == "object"
    assert classify_location("relative/folder").kind == "folder"


@pytest.mark.parametrize(
    "location", ["ftp://host/blobs", "mysql://u@h/db", "s4://bucket/x", "http://example.com/blobs"]
)
def test_an_unknown_scheme_is_refused_never_a_local_folder(
    location: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aot.cache.storage.locations import open_object_store

    monkeypatch.chdir(tmp_path)
    with pytest.raises(CacheError, match="scheme"):
        open_object_store(location)
    assert list(tmp_path.iterdir()) == []


def test_an_object_store_url_without_its_driver_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """s3:// used to become a local folder named 's3:'; without the fsspec store or its
    library it is a CacheError naming the extra to install."""
    import sys

    import aot
    from aot.cache.storage.locations import open_object_store

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "aot.cache.storage.fsspec_store", None)  # as if not installed
    with pytest.raises(CacheError, match=r"pip install 'jax-aot\[s3\]'"):
        open_object_store("s3://bucket/prefix")
    with pytest.raises(CacheError, match=r"jax-aot\[gcs\]"):
        aot.Cache(str(tmp_path / "cache"), blob_location="gs://bucket/prefix")
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "gs:").exists()
    with pytest.raises(CacheError, match="cannot hold a cache index"):
        aot.Cache("s3://bucket/prefix")


def test_a_location_is_a_frozen_value() -> None:
    import dataclasses

    from aot.cache.storage.locations import FOLDER, Location, classify_location

    where = classify_location("file:///srv/cache")
    assert where == Location(FOLDER, "/srv/cache", "file")
    assert where.to_dict() == {"kind": "folder", "target": "/srv/cache", "scheme": "file"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        where.kind = "object"  # type: ignore[misc]
