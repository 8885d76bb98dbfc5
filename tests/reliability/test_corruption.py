"""Corrupt caches: the loader never deserializes bad bytes, and the cache heals.

Every scenario damages the entry of ``rel.tiny`` for f32[2] in a cache that also
holds f32[1] and f32[3], then checks:

* ``cache.get`` and a strict ``aot.load`` raise ``CorruptArtifactError`` whose message
  names the entry and says what to do; the entry is quarantined;
* a non-strict ``aot.load`` serves the signature by recompiling the intact portable
  HLO (or, when the manifest itself is unreadable, does not serve it at all);
* XLA's deserializer never sees bytes that differ from a digest recorded in a
  manifest (``deserialize_spy`` wraps ``jaxlib._jax.Client.deserialize_executable``,
  the one place that turns bytes into an executable);
* the next ``cache.compile`` heals the entry: state ok, outputs correct, verify clean.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import pytest
import sqlalchemy as sa

import aot
from aot.artifact import EXECUTABLE, PORTABLE_HLO, Manifest
from aot.cache.storage.content import compress
from aot.cache.cache import Cache
from aot.cache.index.schema import ARTIFACTS

from tests.reliability import reliability_workers as workers
from tests.reliability.helpers import TinyArtifacts, check_scaled

VICTIM = 2
NOWHERE = "0" * 64


# ---------------------------------------------------------------- raw access to blobs


def read_raw(cache: Cache, digest: str) -> bytes:
    stored = cache.blobs.store.read(digest)
    assert stored is not None, digest
    return stored


def write_raw(cache: Cache, digest: str, stored: bytes | None) -> None:
    """Overwrite (or with None, delete) the stored bytes, as disk rot or a bad copy would."""
    if stored is None:
        cache.blobs.store.delete([digest])
    else:
        cache.blobs.store.write(digest, stored)


def update_row(cache: Cache, key: str, **values: Any) -> None:
    t = ARTIFACTS
    with cache.index.engine.begin() as conn:
        conn.execute(sa.update(t).where(t.c.key == key).values(**values))


# ---------------------------------------------------------------- the damage


def flip_stored_byte(cache: Cache, entry: Any, role: str) -> None:
    digest = _digest(entry, role)
    raw = bytearray(read_raw(cache, digest))
    raw[len(raw) // 2] ^= 0x40
    write_raw(cache, digest, bytes(raw))


def flip_content_byte(cache: Cache, entry: Any, role: str) -> None:
    """A flipped byte of the executable, recompressed: the frame decodes cleanly, only
    the digest can tell (the worst case: XLA would happily load these bytes)."""
    digest = _digest(entry, role)
    data = bytearray(cache.blobs.get(digest))
    data[len(data) // 3] ^= 0x01
    write_raw(cache, digest, compress(bytes(data)))


def truncate(cache: Cache, entry: Any, role: str) -> None:
    digest = _digest(entry, role)
    raw = read_raw(cache, digest)
    write_raw(cache, digest, raw[: len(raw) // 2])


def remove(cache: Cache, entry: Any, role: str) -> None:
    write_raw(cache, _digest(entry, role), None)


def garbage_manifest(cache: Cache, entry: Any, role: str) -> None:
    update_row(cache, entry.key, manifest='{"format_version": 1, "name": 42, "blobs": "x"}')


def point_nowhere(cache: Cache, entry: Any, role: str) -> None:
    """The row and its manifest name an executable blob that does not exist."""
    data = entry.manifest_dict()
    data["blobs"][EXECUTABLE]["digest"] = NOWHERE
    manifest = Manifest.from_dict(data)  # still a valid manifest: its key is intact
    update_row(cache, entry.key, manifest=manifest.to_json(), exe_digest=NOWHERE)


def _digest(entry: Any, role: str) -> str:
    return entry.manifest_dict()["blobs"][role]["digest"]


EXECUTABLE_DAMAGE: dict[str, Callable[[Cache, Any, str], None]] = {
    "flipped stored byte": flip_stored_byte,
    "flipped executable byte": flip_content_byte,
    "truncated blob": truncate,
    "missing blob": remove,
    "row pointing nowhere": point_nowhere,
}

# what the error must say (besides the entry): what was wrong, what to do
EXPECTED_WHAT = {
    "flipped stored byte": r"corrupt|undecodable|digest mismatch|!= expected",
    "flipped executable byte": r"digest mismatch|!= expected",
    "truncated blob": r"truncated|undecodable",
    "missing blob": r"missing",
    "row pointing nowhere": r"missing",
    "garbage manifest": r"manifest",
}
TO_DO = r"aot verify|recompile"


# ---------------------------------------------------------------- fixtures




def victim(cache: Cache) -> Any:
    (entry,) = [e for e in cache.entries(TinyArtifacts.NAME) if e.signature == "f32[2]"]
    return entry


def good_digests(cache: Cache, tiny: TinyArtifacts) -> set[str]:
    """Executable digests recorded by manifests that were built by compiling."""
    return set(tiny.good_executables) | {e.exe_digest for e in cache.entries() if e.exe_digest != NOWHERE}


def assert_message(exc: BaseException, entry: Any, what: str) -> None:
    text = str(exc)
    assert TinyArtifacts.NAME in text or entry.key[:12] in text, f"names no entry: {text}"
    assert re.search(what, text), f"does not say what was wrong ({what}): {text}"
    assert re.search(TO_DO, text), f"does not say what to do: {text}"


def heal_and_check(make_cache: Callable[..., Cache], key: str) -> None:
    cache = make_cache()
    exe = cache.compile(workers.scaled, aot.spec(f"f32[{VICTIM}]"), name=TinyArtifacts.NAME)
    check_scaled(exe, VICTIM)
    entry = cache.index.get(key)
    assert entry is not None and entry.ok, entry
    check_scaled(cache.get(key), VICTIM)
    report = cache.verify()
    assert report.problems == (), report.to_dict()
    for n in (1, 2, 3):
        fn = aot.load(TinyArtifacts.NAME, cache, strict=True)
        out = fn(np.arange(n, dtype=np.float32))
        np.testing.assert_allclose(np.asarray(out), workers.expected_scaled(n))


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("damage", sorted(EXECUTABLE_DAMAGE))
def test_damaged_executable_strict(
    damage: str, make_cache: Callable[..., Cache], tiny: TinyArtifacts, deserialize_spy: Any
) -> None:
    cache = make_cache()
    entry = victim(cache)
    EXECUTABLE_DAMAGE[damage](cache, entry, EXECUTABLE)
    good = good_digests(cache, tiny)

    with pytest.raises(aot.CorruptArtifactError) as caught:
        cache.get(entry.key)
    assert_message(caught.value, entry, EXPECTED_WHAT[damage])

    with pytest.raises(aot.CorruptArtifactError) as caught:
        aot.load(TinyArtifacts.NAME, make_cache(), strict=True)
    assert_message(caught.value, entry, EXPECTED_WHAT[damage])
    assert cache.index.get(entry.key).ok  # strict=True never writes (logged, not quarantined)
    assert deserialize_spy.bad(good) == [], "XLA was handed bytes that match no manifest"

    heal_and_check(make_cache, entry.key)
    assert deserialize_spy.bad(good_digests(cache, tiny)) == []


@pytest.mark.parametrize("damage", sorted(EXECUTABLE_DAMAGE))
def test_damaged_executable_recompiles_from_intact_hlo(
    damage: str, make_cache: Callable[..., Cache], tiny: TinyArtifacts, deserialize_spy: Any
) -> None:
    cache = make_cache()
    entry = victim(cache)
    EXECUTABLE_DAMAGE[damage](cache, entry, EXECUTABLE)
    good = good_digests(cache, tiny)

    fn = aot.load(TinyArtifacts.NAME, make_cache())  # non-strict: the fallback ladder
    for n in (1, 2, 3):
        np.testing.assert_allclose(np.asarray(fn(np.arange(n, dtype=np.float32))), workers.expected_scaled(n))
    # the rebuilt executable replaced the quarantined row: a good blob, a good row
    healed = cache.index.get(entry.key)
    assert healed.ok and healed.exe_digest != NOWHERE
    assert cache.blobs.check(healed.exe_digest) is None
    assert deserialize_spy.bad(good | {healed.exe_digest}) == []
    heal_and_check(make_cache, entry.key)


def test_damaged_hlo_and_executable_cannot_be_served(
    make_cache: Callable[..., Cache], tiny: TinyArtifacts, deserialize_spy: Any
) -> None:
    cache = make_cache()
    entry = victim(cache)
    flip_content_byte(cache, entry, EXECUTABLE)
    truncate(cache, entry, PORTABLE_HLO)
    good = good_digests(cache, tiny)
    with pytest.raises(aot.CorruptArtifactError) as caught:
        aot.load(TinyArtifacts.NAME, make_cache())
    assert_message(caught.value, entry, r"cannot recompile|corrupt|truncated")
    assert not cache.index.get(entry.key).ok
    assert deserialize_spy.bad(good) == []
    heal_and_check(make_cache, entry.key)


def test_damaged_hlo_alone_is_reported_by_verify(make_cache: Callable[..., Cache], tiny: TinyArtifacts) -> None:
    cache = make_cache()
    entry = victim(cache)
    truncate(cache, entry, PORTABLE_HLO)
    check_scaled(cache.get(entry.key), VICTIM)  # the executable itself is intact
    report = cache.verify()
    assert [p.key for p in report.problems] == [entry.key]
    assert "portable_hlo" in report.problems[0].what
    assert report.quarantined == (entry.key,)
    heal_and_check(make_cache, entry.key)


def test_garbage_manifest(make_cache: Callable[..., Cache], tiny: TinyArtifacts, deserialize_spy: Any) -> None:
    cache = make_cache()
    entry = victim(cache)
    garbage_manifest(cache, entry, EXECUTABLE)
    good = good_digests(cache, tiny)

    with pytest.raises(aot.CorruptArtifactError) as caught:
        cache.get(entry.key)
    assert_message(caught.value, entry, EXPECTED_WHAT["garbage manifest"])

    fn = aot.load(TinyArtifacts.NAME, make_cache())
    assert not cache.index.get(entry.key).ok  # quarantined when the dispatcher read it
    np.testing.assert_allclose(np.asarray(fn(np.arange(3, dtype=np.float32))), workers.expected_scaled(3))
    with pytest.raises(aot.SignatureNotFoundError) as missing:
        fn(np.arange(VICTIM, dtype=np.float32))
    assert "f32[1]" in str(missing.value) and "f32[3]" in str(missing.value)
    report = cache.verify()
    assert [p.key for p in report.problems] == [entry.key] and "manifest" in report.problems[0].what
    assert deserialize_spy.bad(good) == []
    heal_and_check(make_cache, entry.key)


def test_index_columns_disagreeing_with_the_manifest_are_problems(
    make_cache: Callable[..., Cache], tiny: TinyArtifacts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row whose exe_digest column names a blob that does not exist (the manifest is
    intact): the executable still loads, but gc trusts the columns, so verify must
    flag the row, or gc would delete the real executable as an orphan."""
    from aot.cache.admin import maintenance

    cache = make_cache()
    entry = victim(cache)
    update_row(cache, entry.key, exe_digest=NOWHERE)
    report = cache.verify()
    assert [p.key for p in report.problems] == [entry.key], report.to_dict()
    assert "executable" in report.problems[0].what
    assert report.quarantined == (entry.key,)
    monkeypatch.setattr(maintenance, "ORPHAN_GRACE_SECONDS", 0.0)
    cache.gc()
    heal_and_check(make_cache, entry.key)
