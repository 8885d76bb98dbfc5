"""aot.load's read-ahead (aot.cache.serving.read_ahead): XLA deserializes the served
executable of a folder cache while the load imports and checks, the load uses it only
for the digest it verified itself, and a wrong guess, a corrupt blob or another
environment's row change nothing a caller sees."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import aot
import aot.rehydrate
from aot import ahead
from aot.cache.serving import read_ahead
from aot.cache.storage.content import compress
from aot.fingerprint import environment_fingerprint

X = np.arange(8, dtype=np.float32)


def _double(x):  # noqa: ANN001, ANN202
    return x * 2.0


def _plus_one(x):  # noqa: ANN001, ANN202
    return x + 1.0


@pytest.fixture(autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    yield
    assert ahead.pending() == []  # whatever a load did not take is dropped when it returns


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    with aot.Cache(tmp_path / "cache") as cache:
        cache.compile(_double, "f32[8]", name="m.double")
        cache.compile(_plus_one, "f32[8]", name="m.plus_one")
    return tmp_path / "cache"


@pytest.fixture
def xla_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(thread name, sha256 of the bytes) of every executable handed to XLA."""
    seen: list[tuple[str, str]] = []
    client_class = type(jax.devices()[0].client)
    real = client_class.deserialize_executable

    def spy(self: Any, serialized: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((threading.current_thread().name, hashlib.sha256(bytes(serialized)).hexdigest()))
        return real(self, serialized, *args, **kwargs)

    monkeypatch.setattr(client_class, "deserialize_executable", spy)
    return seen


def _served_digest(folder: Path, name: str) -> str:
    with aot.Cache(folder, read_only=True) as cache:
        (entry,) = cache.entries(name)
        return str(entry.exe_digest)


def _load_after_the_reader_began(monkeypatch: pytest.MonkeyPatch) -> None:
    """The load reaches its executable only once the reader has started on one, so
    that the test does not depend on which thread is first."""
    began = threading.Event()
    real_begin, real_take = ahead.begin, ahead.take

    def begin(j: ahead.Job) -> bool:
        started = real_begin(j)
        began.set()
        return started

    def take(*args: Any) -> Any:
        assert began.wait(30)
        return real_take(*args)

    monkeypatch.setattr(ahead, "begin", begin)
    monkeypatch.setattr(aot.rehydrate, "take", take)


def test_an_eager_load_runs_the_executable_xla_deserialized_ahead(folder, xla_calls, monkeypatch) -> None:  # noqa: ANN001
    _load_after_the_reader_began(monkeypatch)
    fn = aot.load("m.double", cache=str(folder))
    np.testing.assert_array_equal(np.asarray(fn(X)), X * 2.0)
    digest = _served_digest(folder, "m.double")
    assert [d for _, d in xla_calls] == [digest]  # deserialized once, not twice
    assert xla_calls[0][0].startswith("aot-read-ahead")


def test_without_the_reader_the_load_deserializes_itself(folder, xla_calls, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv(read_ahead.READ_AHEAD_ENV, "0")
    fn = aot.load("m.double", cache=str(folder))
    np.testing.assert_array_equal(np.asarray(fn(X)), X * 2.0)
    assert xla_calls == [(threading.current_thread().name, _served_digest(folder, "m.double"))]


def test_a_wrong_guess_is_dropped_and_the_load_serves_its_own_program(folder, xla_calls, monkeypatch) -> None:  # noqa: ANN001
    other = read_ahead.guess(folder / "index.sqlite", "m.plus_one", environment_fingerprint().digest)
    assert len(other) == 1
    monkeypatch.setattr(read_ahead, "guess", lambda *_: other)
    _load_after_the_reader_began(monkeypatch)
    fn = aot.load("m.double", cache=str(folder))
    np.testing.assert_array_equal(np.asarray(fn(X)), X * 2.0)
    assert sorted(d for _, d in xla_calls) == sorted([other[0][0], _served_digest(folder, "m.double")])


def test_bytes_that_do_not_match_their_digest_never_reach_xla(folder, xla_calls) -> None:  # noqa: ANN001
    digest = _served_digest(folder, "m.double")
    path = folder / "blobs" / digest[:2] / f"{digest}.zst"
    path.chmod(0o644)
    path.write_bytes(compress(b"another program"))  # a valid frame, wrong bytes
    with pytest.raises(aot.CorruptArtifactError, match="digest mismatch"):
        aot.load("m.double", cache=str(folder), strict=True)
    assert xla_calls == []


def test_the_served_ref_is_guessed_not_the_newest_row(tmp_path: Path) -> None:
    with aot.Cache(tmp_path / "cache") as cache:
        v1 = cache.compile_entry(_double, "f32[8]", name="m.f").entry
        v2 = cache.compile_entry(_plus_one, "f32[8]", name="m.f").entry
        assert cache.compile_entry(_double, "f32[8]", name="m.f").entry.key == v1.key  # rolled back
    assert v2.created_at >= v1.created_at
    guessed = read_ahead.guess(tmp_path / "cache" / "index.sqlite", "m.f", environment_fingerprint().digest)
    assert [g[0] for g in guessed] == [v1.exe_digest]
    fn = aot.load("m.f", cache=str(tmp_path / "cache"))
    np.testing.assert_array_equal(np.asarray(fn(X)), X * 2.0)


def test_rows_of_another_environment_are_never_guessed(folder) -> None:  # noqa: ANN001
    assert read_ahead.guess(folder / "index.sqlite", "m.double", "0" * 64) == []
    assert len(read_ahead.guess(folder / "index.sqlite", "m.double", environment_fingerprint().digest)) == 1


def test_a_name_with_more_signatures_than_the_limit_is_not_read_ahead(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    with aot.Cache(tmp_path / "cache") as cache:
        cache.compile(_double, "f32[8]", name="m.buckets")
        cache.compile(_double, "f32[4]", name="m.buckets")
    index, env = tmp_path / "cache" / "index.sqlite", environment_fingerprint().digest
    assert len(read_ahead.guess(index, "m.buckets", env)) == 2
    monkeypatch.setattr(read_ahead, "MAX_AHEAD", 1)
    assert read_ahead.guess(index, "m.buckets", env) == []


@pytest.mark.parametrize(
    "options",
    [{"lazy": True}, {"background": True}, {"release": "prod"}],
    ids=["lazy", "background", "release"],
)
def test_loads_that_do_not_deserialize_now_are_not_read_ahead(folder, options) -> None:  # noqa: ANN001
    kwargs = {"lazy": False, "background": False, "release": None, **options}
    assert read_ahead.start("m.double", str(folder), **kwargs) is None


def test_databases_missing_folders_and_the_switch_are_not_read_ahead(folder, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    eager = {"lazy": False, "background": False, "release": None}
    assert read_ahead.start("m.double", "sqlite:///" + str(folder / "index.sqlite"), **eager) is None
    assert read_ahead.start("m.double", str(tmp_path / "nowhere"), **eager) is None
    assert read_ahead.start("m.unknown", str(folder), **eager) is None
    monkeypatch.setenv(read_ahead.READ_AHEAD_ENV, "off")
    assert read_ahead.start("m.double", str(folder), **eager) is None
    monkeypatch.delenv(read_ahead.READ_AHEAD_ENV)
    reader = read_ahead.start("m.double", str(folder), **eager)
    assert reader is not None
    reader.close()


def test_an_open_folder_cache_is_read_ahead_and_its_executable_used(folder, xla_calls, monkeypatch, tmp_path) -> None:  # noqa: ANN001
    eager = {"lazy": False, "background": False, "release": None}
    with aot.Cache(tmp_path / "elsewhere", blob_location=tmp_path / "blobs") as other:
        assert read_ahead.start("m.double", other, **eager) is None  # blobs outside the folder
    _load_after_the_reader_began(monkeypatch)
    with aot.Cache(folder, read_only=True) as cache:
        fn = aot.load("m.double", cache=cache)
        np.testing.assert_array_equal(np.asarray(fn(X)), X * 2.0)
    assert len(xla_calls) == 1 and xla_calls[0][0].startswith("aot-read-ahead")


def test_a_signed_cache_is_never_read_ahead(folder, monkeypatch) -> None:  # noqa: ANN001
    from aot.cache.index.entry import INDEX_FILE
    from aot.signing import SIGNING_KEY_ENV

    assert (read_ahead.SIGNING_KEY_ENV, read_ahead.INDEX_FILE) == (SIGNING_KEY_ENV, INDEX_FILE)
    eager = {"lazy": False, "background": False, "release": None}
    with aot.Cache(folder, signing_key="k") as signed:
        assert read_ahead.start("m.double", signed, **eager) is None
    monkeypatch.setenv(SIGNING_KEY_ENV, "k")
    assert read_ahead.start("m.double", str(folder), **eager) is None


def test_a_read_ahead_of_a_read_only_folder_creates_no_file(folder) -> None:  # noqa: ANN001
    before = sorted(p.name for p in folder.iterdir())
    reader = read_ahead.start("m.double", str(folder), lazy=False, background=False, release=None)
    assert reader is not None
    reader.close()
    assert sorted(p.name for p in folder.iterdir()) == before  # no -wal / -shm


_WHEN_XLA_STARTS = """
import json, sys
import aot
from aot import ahead

seen = {}
real_begin = ahead.begin

def begin(j):
    seen.setdefault("imported", sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules))
    return real_begin(j)

ahead.begin = begin
fn = aot.load("m.double", cache=sys.argv[1])
print(json.dumps(seen))
"""


def test_xla_starts_before_the_load_imports_its_stores_and_value_objects(folder) -> None:  # noqa: ANN001
    """The read-ahead runs first: what it needs imports in milliseconds, and the modules
    the load itself needs (the content store, the fingerprint's value objects, the
    index's SQLAlchemy layer) import while XLA already works."""
    slow = ["aot.fingerprint", "aot.cache.storage.content", "aot.cache.storage.folder", "aot.cache.store", "sqlalchemy"]
    proc = subprocess.run(
        [sys.executable, "-c", _WHEN_XLA_STARTS, str(folder), json.dumps(slow)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report.get("imported") == [], report  # "imported" absent: XLA was never started ahead
