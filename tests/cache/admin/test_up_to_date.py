"""A copy with nothing to do is decided read-only (cache/admin/up_to_date.py): the same
report as the writer's path, the destination's SQL index never opened; anything to
copy, repair or write goes through the writer's path, which does it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import aot
from aot.cache.admin import transfer
from aot.cache.admin.transfer import TransferReport, copy_entries, pull, push
from aot.cache.admin.up_to_date import UpToDate
from aot.cache.index.refs import RefOrigin

BAD_KEY = "f" * 64  # a row whose name the rule refuses (stored before the rule)


def _payload(body: bytes, seconds: int = 2) -> bytes:
    from jax._src import compilation_cache as cc  # only to build a payload as JAX does

    return cc.compress_executable(cc.combine_executable_and_time(body, seconds))


def _jit(cache: aot.Cache, name: str, body: bytes) -> str:
    """Stores a jit entry as JAX's ``put`` through aot.jax_cache does; its key."""
    key = f"jit_{name}-{hashlib.sha256(name.encode() + body).hexdigest()}"
    backend = aot.jax_cache.JaxCacheBackend(cache, compile_once=False)
    try:
        backend.put(key, _payload(body))
    finally:
        backend.close()
    return key


def _refused_row(cache: aot.Cache) -> None:
    """A row whose name the rule refuses (an older version stored it): a copy fails it."""
    import dataclasses

    row = cache.entries("tiny")[0]
    cache.index.bulk_insert([dataclasses.replace(row, key=BAD_KEY, name="bad\x01name")])


@pytest.fixture
def source(tmp_path: Path, compiled) -> Iterator[aot.Cache]:  # noqa: ANN001
    """A folder cache: 4 entries with their refs, one more quarantined, a release, a
    jit entry and a row whose name the rule refuses."""
    cache = aot.Cache(tmp_path / "source")
    for artifact in compiled.all():
        cache.put(artifact)
    tiny = cache.entries("tiny")[0]
    origin = RefOrigin("test", release="prod")
    cache.set_refs([tiny], origin, release_id=cache.index.open_release("prod", origin))
    _jit(cache, "train_step", b"step" * 100)
    _refused_row(cache)
    yield cache
    cache.close()


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[UpToDate | None]:
    """What each copy's read-only pass decided (None: the writer's path)."""
    decided: list[UpToDate | None] = []
    real = transfer.up_to_date

    def recorded(*args: Any, **kwargs: Any) -> UpToDate | None:
        decided.append(real(*args, **kwargs))
        return decided[-1]

    monkeypatch.setattr(transfer, "up_to_date", recorded)
    return decided


def _writer_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "up_to_date", lambda *args, **kwargs: None)


def _same(report: TransferReport) -> dict[str, Any]:
    return {k: v for k, v in report.to_dict().items() if k != "seconds"}


def _copied_once(source: aot.Cache, tmp_path: Path, **kwargs: Any) -> Path:
    dest = tmp_path / "dest"
    first = push(source, dest, **kwargs)
    assert len(first.copied) == 5 and [k for k, _ in first.failed] == [BAD_KEY]  # 4 entries, 1 jit
    return dest


@pytest.mark.parametrize("options", [
    {}, {"names": ["mlp.*"]}, {"names": ["train*"]}, {"refs": True}, {"jobs": 3}, {"release": "prod"},
], ids=["all", "glob", "jit-glob", "refs", "jobs", "release"])
def test_an_up_to_date_copy_reports_what_the_writers_path_reports(
    source: aot.Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spy: list[UpToDate | None],
    options: dict[str, Any],
) -> None:
    dest = _copied_once(source, tmp_path)
    if not options.get("refs"):  # a slot declared otherwise there: kept (--refs would write it)
        _declared_otherwise(dest)
    names = options.pop("names", None)
    spy.clear()
    fast = {"push": _same(push(source, dest, names, **options)), "pull": None}
    with aot.Cache(dest) as here:
        fast["pull"] = _same(pull(here, source.location, names, **options))
    decided = list(spy)
    _writer_only(monkeypatch)
    slow = {"push": _same(push(source, dest, names, **options))}
    with aot.Cache(dest) as here:
        slow["pull"] = _same(pull(here, source.location, names, **options))
    assert fast == slow
    refused = [{"key": BAD_KEY, "reason": "the name holds the control character '\\x01' at position 3"}]
    assert fast["push"]["failed"] == ([] if names or options.get("release") else refused)
    if options.get("release"):  # records a new set of the label: a write, the writer's path
        assert decided == [] and fast["push"]["refs"]["release"] == "prod"
        return
    assert len(decided) == 2 and all(d is not None for d in decided)
    assert fast["push"]["copied"] == fast["push"]["bytes_copied"] == 0
    assert fast["push"]["skipped"] == {None: 5, "mlp.*": 3, "train*": 1}[names[0] if names else None]
    if not options.get("refs") and names != ["train*"]:
        assert len(fast["push"]["refs"]["kept"]) == 1 and fast["push"]["refs"]["set"] == []


def _declared_otherwise(dest: Path) -> Any:
    """Points one mlp.forward slot at another key there (as the destination's own
    declaration); its ref as it was."""
    with aot.Cache(dest) as there:
        ref = there.refs_named("mlp.forward")[0]
        other = next(e for e in there.entries("mlp.forward") if e.key != ref.key)
        there.index.set_refs([(ref.name, ref.signature, ref.env_fp, other.key)], RefOrigin("theirs"))
    return ref


def test_an_up_to_date_copy_never_opens_an_sql_index(source: aot.Cache, tmp_path: Path) -> None:
    dest = _copied_once(source, tmp_path)
    here, there = aot.Cache(source.location), aot.Cache(dest)
    try:
        report = copy_entries(here, there)
        assert (len(report.copied), len(report.skipped), len(report.failed)) == (0, 5, 1)
        assert here._index is None and there._index is None  # read through the stdlib reader only
    finally:
        here.close()
        there.close()


def _first(cache: aot.Cache) -> Any:
    return cache.entries()[0]  # the first entry a copy takes (mlp.forward, oldest)


def _last(cache: aot.Cache) -> Any:
    return cache.entries("tiny")[0]  # one of the batch


DAMAGE: dict[str, Callable[[aot.Cache, Any], None]] = {
    "missing-blob": lambda c, e: c.blobs.delete(e.exe_digest),
    "corrupt-blob": lambda c, e: c.blobs.store.write(e.hlo_digest, b"rot"),
    "quarantined-row": lambda c, e: c.quarantine(e, "a test"),
}


@pytest.mark.parametrize("which", [_first, _last], ids=["first", "batched"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_blob_there_goes_through_the_writer_and_is_repaired(
    source: aot.Cache, tmp_path: Path, spy: list[UpToDate | None], damage: str, which: Callable[[aot.Cache], Any],
) -> None:
    dest = _copied_once(source, tmp_path)
    with aot.Cache(dest) as there:
        entry = which(there)
        DAMAGE[damage](there, entry)
    spy.clear()
    report = push(source, dest)
    assert spy == [None]
    if damage == "quarantined-row":  # stored again over it (the writer's path says "copied")
        assert report.copied == (entry.key,) and len(report.skipped) == 4
    else:
        assert report.repaired == (entry.key,) and len(report.skipped) == 4
    with aot.Cache(dest) as there:
        assert there.verify().ok and there.lookup(entry.key).ok
    assert push(source, dest).repaired == () and spy[-1] is not None  # up to date again: read-only


def test_a_missing_row_ref_or_jit_entry_goes_through_the_writer(
    source: aot.Cache, tmp_path: Path, spy: list[UpToDate | None],
) -> None:
    dest = _copied_once(source, tmp_path)
    with aot.Cache(dest) as there:
        gone = _last(there)
        there.index.delete([gone.key])  # its blobs stay: found intact, not copied again
        jit = there.index.jit_entries()[0]
        there.index.jit_delete([jit.key])
        ref = there.refs_named("mlp.forward")[0]
        there.index.drop_refs([ref.slot])
    spy.clear()
    report = push(source, dest)
    assert spy == [None]
    assert sorted(report.copied) == sorted([gone.key, jit.key]) and report.bytes_copied > 0
    assert [(m.name, m.key) for m in report.refs.set] == [(ref.name, ref.key)]  # tiny's ref was still there
    with aot.Cache(dest) as there:
        assert there.refs_named("mlp.forward")[0].key == ref.key and there.index.jit_get(jit.key) is not None
    again = push(source, dest)
    assert spy[-1] is not None and (len(again.copied), len(again.skipped)) == (0, 5)


def test_refs_overwrite_of_another_key_goes_through_the_writer(
    source: aot.Cache, tmp_path: Path, spy: list[UpToDate | None],
) -> None:
    dest = _copied_once(source, tmp_path)
    ref = _declared_otherwise(dest)
    spy.clear()
    kept = push(source, dest)  # the destination's own ref: kept, nothing written
    assert spy[-1] is not None and [m.key for m in kept.refs.kept] == [ref.key]
    forced = push(source, dest, refs=True)
    assert spy[-1] is None and [m.key for m in forced.refs.set] == [ref.key] and forced.refs.kept == ()
