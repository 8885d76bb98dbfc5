"""Signed artifacts: HMAC-SHA256 over the canonical manifest (which carries every blob
digest). A loader with the key refuses unsigned and tampered manifests; a loader
without a key can be told to require signatures.

The tamper test edits EACH field of a signed manifest in turn (type-preserving, and
nested values too) in the index, keeping the original hmac, and checks that loading
refuses it with IntegrityError (or CorruptArtifactError where the key or the argument
avals no longer match the fingerprints: also a refusal), before XLA sees any byte.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import sqlalchemy as sa

import aot
from aot.artifact import EXECUTABLE, Manifest
from aot.cache.admin import bundle as bundles
from aot.cache.cache import Cache
from aot.cache.index.schema import ARTIFACTS

from tests.reliability import reliability_workers as workers
from tests.reliability.helpers import TinyArtifacts, check_scaled

KEY = "reliability-signing-key"
OTHER_KEY = "another-key"


def rows(cache: Cache) -> list[dict[str, Any]]:
    return [json.loads(e.manifest) for e in cache.entries()]


def set_manifest(cache: Cache, key: str, manifest: dict[str, Any] | str) -> None:
    text = manifest if isinstance(manifest, str) else json.dumps(manifest, sort_keys=True)
    t = ARTIFACTS
    with cache.index.engine.begin() as conn:
        conn.execute(sa.update(t).where(t.c.key == key).values(manifest=text))


@pytest.fixture
def signed(tmp_path: Path, tiny: TinyArtifacts) -> Iterator[Cache]:
    with Cache(tmp_path / "cache", signing_key=KEY) as cache:
        for n in (1, 2):
            cache.put_artifact(tiny.by_size[n])
        yield cache


# ---------------------------------------------------------------- every manifest is signed


def test_every_stored_manifest_carries_an_hmac(tmp_path: Path, tiny: TinyArtifacts, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AOT_SIGNING_KEY", KEY)
    with Cache(tmp_path / "cache") as cache:  # the key from AOT_SIGNING_KEY
        assert cache.signing_key == KEY.encode()
        cache.put_artifact(tiny.by_size[1])  # put_artifact
        cache.compile(workers.scaled, aot.spec("f32[5]"), name="rel.signed")  # compile miss
        cache.put(aot.lower(workers.scaled, aot.spec("f32[6]"), name="rel.signed"))  # put
        cache.export_bundle(tmp_path / "b.bundle")
    with Cache(tmp_path / "other", signing_key=KEY) as other:
        other.import_bundle(tmp_path / "b.bundle")  # import
        # the recompile ladder writes back a signed artifact too
        (entry,) = [e for e in other.entries() if e.signature == "f32[5]"]
        data = json.loads(entry.manifest)
        victim = Manifest.from_dict(data)
        with other.index.engine.begin() as conn:  # damage the executable: forces a recompile
            t = ARTIFACTS
            conn.execute(sa.update(t).where(t.c.key == entry.key).values(state="quarantined"))
        fn = aot.load("rel.signed", other)
        np.testing.assert_allclose(np.asarray(fn(np.arange(5, dtype=np.float32))), np.arange(5) * 2.0 + 1)
        assert other.index.get(victim.key).ok
        for cache_rows in (rows(other), rows(Cache(tmp_path / "cache"))):
            assert len(cache_rows) == 3
            for manifest in cache_rows:
                assert isinstance(manifest.get("hmac"), str) and len(manifest["hmac"]) == 64


def test_the_signature_covers_every_field_but_itself(tiny: TinyArtifacts) -> None:
    from aot.signing import sign

    manifest = sign(tiny.by_size[1].manifest, KEY.encode())
    payload = json.loads(manifest.signed_payload())
    assert set(payload) == set(manifest.to_dict()) - {"hmac"}
    assert payload["blobs"] == manifest.to_dict()["blobs"]  # blob digests are covered


# ---------------------------------------------------------------- refusals


def test_a_keyed_loader_refuses_unsigned_artifacts(tmp_path: Path, tiny: TinyArtifacts, deserialize_spy: Any) -> None:
    with Cache(tmp_path / "cache") as unsigned:
        unsigned.put_artifact(tiny.by_size[1])
    with Cache(tmp_path / "cache", signing_key=KEY) as cache:
        (entry,) = cache.entries()
        with pytest.raises(aot.IntegrityError) as caught:
            cache.get(entry.key)
        message = str(caught.value)
        assert TinyArtifacts.NAME in message and entry.key[:12] in message
        assert "not signed" in message and "AOT_SIGNING_KEY" in message
        with pytest.raises(aot.AotError) as caught:
            aot.load(TinyArtifacts.NAME, cache)(np.arange(1, dtype=np.float32))
        assert isinstance(caught.value, (aot.IntegrityError, aot.CorruptArtifactError))
        assert "not signed" in str(caught.value)
    assert deserialize_spy.digests == []


def test_a_loader_with_another_key_refuses(signed: Cache, deserialize_spy: Any) -> None:
    with Cache(signed.location, signing_key=OTHER_KEY) as cache:
        for entry in cache.entries():
            with pytest.raises(aot.IntegrityError) as caught:
                cache.get(entry.key)
            assert "does not verify" in str(caught.value) and entry.key[:12] in str(caught.value)
    assert deserialize_spy.digests == []


def test_a_loader_without_a_key_can_require_signatures(tmp_path: Path, signed: Cache, tiny: TinyArtifacts) -> None:
    with Cache(signed.location, require_signatures=True) as cache:
        for entry in cache.entries():  # signed: accepted (presence only: no key to check)
            cache.get(entry.key)
    with Cache(tmp_path / "unsigned") as writer:
        writer.put_artifact(tiny.by_size[3])
    with Cache(tmp_path / "unsigned", require_signatures=True) as cache:
        (entry,) = cache.entries()
        with pytest.raises(aot.IntegrityError) as caught:
            cache.get(entry.key)
        assert "not signed" in str(caught.value) and entry.key[:12] in str(caught.value)
        writer = Cache(tmp_path / "unsigned")
        writer.export_bundle(tmp_path / "u.bundle")
        with pytest.raises(aot.IntegrityError):
            Cache(tmp_path / "strict", require_signatures=True).import_bundle(tmp_path / "u.bundle")
        assert Cache(tmp_path / "strict").entries() == []


# ---------------------------------------------------------------- tamper every field


def _tampered(value: Any) -> Any:
    """A different value of the same type (nested: one leaf changed)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.5
    if isinstance(value, str):
        if len(value) == 64 and all(c in "0123456789abcdef" for c in value):
            return value[:-1] + ("0" if value[-1] != "0" else "1")  # still a digest
        return value + "x"
    if isinstance(value, list):
        if not value:
            return [0]
        return [_tampered(value[0]), *value[1:]]
    if isinstance(value, dict):
        if not value:
            return {"x": 1}
        first = sorted(value)[0]
        return {**value, first: _tampered(value[first])}
    if value is None:
        return {"flops": 1.0}
    raise TypeError(value)


def tamper_cases(manifest: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for field in sorted(manifest):
        if field == "hmac":
            continue
        changed = copy.deepcopy(manifest)
        changed[field] = _tampered(manifest[field])
        cases.append((field, changed))
        if isinstance(manifest[field], dict):  # also every direct child of a mapping
            for sub in sorted(manifest[field]):
                changed = copy.deepcopy(manifest)
                changed[field][sub] = _tampered(manifest[field][sub])
                cases.append((f"{field}.{sub}", changed))
    for label, edit in (("hmac flipped", lambda m: m.update(hmac=_tampered(m["hmac"]))),
                        ("hmac removed", lambda m: m.pop("hmac"))):
        changed = copy.deepcopy(manifest)
        edit(changed)
        cases.append((label, changed))
    return cases


def test_tampering_any_field_is_refused(signed: Cache, tiny: TinyArtifacts, deserialize_spy: Any) -> None:
    (entry,) = [e for e in signed.entries() if e.signature == "f32[2]"]
    original = json.loads(entry.manifest)
    cases = tamper_cases(original)
    assert len(cases) > len(original)  # every field, nested fields, the hmac itself
    outcomes: dict[str, str] = {}
    parsed = Manifest.from_dict(original).to_dict()
    for label, changed in cases:
        assert changed != original, label
        try:
            if Manifest.from_dict(changed).to_dict() == parsed:
                # a derived value (a fingerprint's digest is recomputed from its
                # parts on reading): the manifest the loader sees is unchanged
                outcomes[label] = "no effect (derived)"
                continue
        except aot.AotError:
            pass
        set_manifest(signed, entry.key, changed)
        with Cache(signed.location, signing_key=KEY) as reader:
            with pytest.raises((aot.IntegrityError, aot.CorruptArtifactError, aot.IncompatibleEnvironmentError)) as caught:
                reader.get(entry.key)
            message = str(caught.value)
            assert entry.key[:12] in message or TinyArtifacts.NAME in message, (label, message)
            assert "recompile" in message or "aot verify" in message or "key" in message, (label, message)
            outcomes[label] = type(caught.value).__name__
    set_manifest(signed, entry.key, original)
    check_scaled(signed.get(entry.key), 2)  # the untampered manifest still loads
    assert deserialize_spy.digests == [tiny.by_size[2].manifest.blobs[EXECUTABLE].digest]
    # where nothing else can notice, the signature does
    for field in ("name", "signature_hmac_only", "args", "out_avals", "device_ids", "xla_name",
                  "blobs.executable", "compile_seconds", "created_at", "hmac flipped", "hmac removed"):
        if field in outcomes:
            assert outcomes[field] in ("IntegrityError", "CorruptArtifactError"), (field, outcomes[field])
    assert outcomes["name"] == outcomes["xla_name"] == outcomes["blobs.executable"] == "IntegrityError"
    assert outcomes["hmac flipped"] == outcomes["hmac removed"] == "IntegrityError"
    print(f"{len(cases)} tampered manifests refused: " + ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())))


def test_a_swapped_executable_with_a_matching_manifest_digest_is_refused(
    signed: Cache, tiny: TinyArtifacts, deserialize_spy: Any
) -> None:
    """The attacker replaces the executable and fixes the manifest's digest to match."""
    (entry,) = [e for e in signed.entries() if e.signature == "f32[2]"]
    other = tiny.by_size[5]  # a real executable of another program, not in this cache
    evil = other.blobs[other.manifest.blobs[EXECUTABLE].digest]
    digest = signed.blobs.put(evil)
    manifest = json.loads(entry.manifest)
    manifest["blobs"][EXECUTABLE] = {"digest": digest, "size": len(evil)}
    set_manifest(signed, entry.key, manifest)
    with pytest.raises(aot.IntegrityError):
        signed.get(entry.key)
    # The altered row is skipped with its reason; the name's signed rows still serve.
    fn = aot.load(TinyArtifacts.NAME, signed, strict=True)
    assert [reason for key, _, reason in fn.skipped if key == entry.key] != []
    assert "f32[2]" not in fn.signatures
    with pytest.raises(aot.IntegrityError, match="refused"):  # stored, but refused: not "not stored"
        fn(np.zeros(2, np.float32))
    assert digest not in deserialize_spy.digests


def test_a_tampered_bundle_is_refused_before_anything_is_written(signed: Cache, tmp_path: Path) -> None:
    import struct

    import zstandard

    signed.export_bundle(tmp_path / "s.bundle")
    raw = (tmp_path / "s.bundle").read_bytes()
    payload = zstandard.ZstdDecompressor().stream_reader(raw[8:]).read()
    (n,) = struct.unpack("<Q", payload[:8])
    header = json.loads(payload[8 : 8 + n])
    header["manifests"][1]["xla_name"] += "x"  # the second entry only
    text = json.dumps(header).encode()
    tampered = bundles.MAGIC + zstandard.ZstdCompressor(write_checksum=True).compress(
        struct.pack("<Q", len(text)) + text + payload[8 + n :]
    )
    (tmp_path / "t.bundle").write_bytes(tampered)
    with Cache(tmp_path / "dst", signing_key=KEY) as dst:
        with pytest.raises(aot.IntegrityError) as caught:
            dst.import_bundle(tmp_path / "t.bundle")
        assert "does not verify" in str(caught.value)
        assert dst.entries() == [] and list(dst.blobs.digests()) == []
        dst.import_bundle(tmp_path / "s.bundle")  # the untampered one imports
        assert len(dst.entries()) == 2


def test_verify_reports_tampered_and_unsigned_entries(signed: Cache, tiny: TinyArtifacts) -> None:
    """`aot verify` on a cache opened with the key flags what a loader would refuse."""
    entries = {e.signature: e for e in signed.entries()}
    manifest = json.loads(entries["f32[2]"].manifest)
    manifest["xla_name"] += "x"
    set_manifest(signed, entries["f32[2]"].key, manifest)
    with Cache(signed.location) as unsigned_writer:
        unsigned_writer.put_artifact(tiny.by_size[3])
    report = signed.verify()
    flagged = {p.key: p.what for p in report.problems}
    assert set(flagged) == {entries["f32[2]"].key, tiny.by_size[3].manifest.key}, report.to_dict()
    assert "does not verify" in flagged[entries["f32[2]"].key]
    assert "not signed" in flagged[tiny.by_size[3].manifest.key]
    assert signed.index.get(entries["f32[1]"].key).ok
    # reported, not quarantined: `aot verify` run with a wrong key must not condemn
    # (and gc delete) good entries; a loader with the key refuses the bad one anyway
    assert report.quarantined == ()
    with pytest.raises(aot.IntegrityError):
        signed.get(entries["f32[2]"].key)
    with Cache(signed.location) as keyless:
        assert keyless.verify().problems == ()


def test_a_refused_unsigned_signature_is_reported_as_refused_not_as_not_stored(
    tmp_path: Path, tiny: TinyArtifacts,
) -> None:
    with Cache(tmp_path / "cache") as unsigned:
        unsigned.put_artifact(tiny.by_size[1])
    with Cache(tmp_path / "cache", signing_key=KEY) as cache:
        (entry,) = cache.entries()
        fn = aot.load(TinyArtifacts.NAME, cache, allow_empty=True)
        with pytest.raises(aot.IntegrityError) as caught:
            fn(np.arange(1, dtype=np.float32))
        message = str(caught.value)
        assert "nothing is stored" not in message and "refused" in message
        assert entry.key[:12] in message and "not signed" in message
        assert "expected an artifact signed" in message and "aot push" in message
        explanation = cache.explain(TinyArtifacts.NAME, aot.spec("f32[1]"))
        assert not explanation.hit and explanation.refused is not None
        assert "refused" in explanation.describe() and "not signed" in explanation.describe()
        assert explanation.to_dict()["refused"]
