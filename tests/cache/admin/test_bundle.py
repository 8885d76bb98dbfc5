"""Bundles: export some names into one file, import into another cache (every digest
checked first, nothing written on any problem), and serve from it."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import zstandard

import aot
from aot.cache.admin.bundle import MAGIC, read_bundle
from aot.errors import CacheError, CorruptArtifactError, IntegrityError


def _check_served(cache: aot.Cache, compiled) -> None:  # noqa: ANN001
    fn = aot.load(compiled.MLP_NAME, cache=cache)
    assert len(fn.signatures) == 3
    for batch in compiled.MLP_BATCHES:
        out = fn(compiled.params, compiled.inputs[batch])
        np.testing.assert_array_equal(np.asarray(out), compiled.expected[batch])


def _is_empty(cache: aot.Cache) -> bool:
    return cache.entries() == [] and list(cache.blobs.digests()) == [] and cache.index.blob_rows() == []


def _rewrite(
    path: Path, header: dict, blobs: list[bytes], out: Path, *, checksum: bool = False
) -> Path:
    """A hand-made bundle (a valid container around whatever header we give it)."""
    payload = json.dumps(header).encode()
    body = struct.pack("<Q", len(payload)) + payload + b"".join(blobs)
    out.write_bytes(MAGIC + zstandard.ZstdCompressor(write_checksum=checksum).compress(body))
    return out


def _unpack(path: Path) -> tuple[dict, list[bytes]]:
    raw = path.read_bytes()
    body = zstandard.ZstdDecompressor().stream_reader(raw[len(MAGIC):]).read()
    (n,) = struct.unpack("<Q", body[:8])
    header = json.loads(body[8 : 8 + n])
    blobs, offset = [], 8 + n
    for blob in header["blobs"]:
        blobs.append(body[offset : offset + blob["size"]])
        offset += blob["size"]
    return header, blobs


@pytest.fixture
def source(open_folder_cache, compiled):  # noqa: ANN001, ANN201
    cache = open_folder_cache()
    for artifact in compiled.all():
        cache.put(artifact)
    return cache


def test_export_from_every_backend_then_import_and_serve(
    cache: aot.Cache, compiled, tmp_path: Path  # noqa: ANN001
) -> None:
    for artifact in compiled.all():
        cache.put(artifact)
    report = cache.export_bundle(tmp_path / "out" / "mlp.aotb", ["mlp.*"])
    assert sorted(report.entries) == sorted(a.manifest.key for a in compiled.mlp.values())
    assert report.bytes == Path(report.path).stat().st_size > 0
    json.dumps(report.to_dict())

    target = aot.Cache(tmp_path / "target")
    try:
        imported = target.import_bundle(report.path)
        assert sorted(imported.imported) == sorted(report.entries) and imported.skipped == ()
        assert {e.name for e in target.entries()} == {compiled.MLP_NAME}
        _check_served(target, compiled)
        assert target.verify().ok
    finally:
        target.close()


def test_import_into_every_backend_then_serve(cache: aot.Cache, source, compiled, tmp_path: Path) -> None:  # noqa: ANN001
    path = source.export_bundle(tmp_path / "all.aotb").path  # every name
    report = cache.import_bundle(path)
    assert len(report.imported) == 4
    _check_served(cache, compiled)
    tiny = aot.load(compiled.TINY_NAME, cache=cache)
    np.testing.assert_array_equal(np.asarray(tiny(*compiled.tiny_inputs)), compiled.tiny_expected)
    assert cache.verify().ok
    assert sorted(cache.blobs.digests()) == sorted(source.blobs.digests())

    again = cache.import_bundle(path)  # idempotent
    assert again.imported == () and sorted(again.skipped) == sorted(report.imported)
    assert len(cache.entries()) == 4


def test_export_with_nothing_to_export(source, tmp_path: Path) -> None:  # noqa: ANN001
    with pytest.raises(CacheError, match="nothing to export"):
        source.export_bundle(tmp_path / "none.aotb", ["no.such.*"])
    assert not (tmp_path / "none.aotb").exists()


def _contents(path: Path) -> dict[str, tuple[str, dict[str, bytes]]]:
    return {a.manifest.key: (a.manifest.to_json(), dict(a.blobs)) for a in read_bundle(path)}


def test_a_flipped_byte_is_refused_and_nothing_is_written(
    source, compiled, tmp_path: Path  # noqa: ANN001
) -> None:
    path = Path(source.export_bundle(tmp_path / "good.aotb", ["tiny", "mlp.*"]).path)
    good = path.read_bytes()
    reference = _contents(path)
    # Every byte of the magic and of the start and end of the zstd frame, and a stride
    # through the compressed header and blobs. A few bits of zstd's framing change
    # nothing decoded (an unused flag, a larger window, spare table bits): such a
    # bundle may be read, but then exactly as exported; any other flip is refused.
    positions = sorted(
        set(range(0, 64)) | set(range(len(good) - 16, len(good))) | set(range(64, len(good), 131))
    )
    damaged_path = tmp_path / "damaged.aotb"
    changed = []
    refused = 0
    for position in positions:
        for bit in (0x01, 0x80):
            damaged = bytearray(good)
            damaged[position] ^= bit
            damaged_path.write_bytes(bytes(damaged))
            try:
                got = _contents(damaged_path)  # all that import_bundle reads and checks
            except CorruptArtifactError:
                refused += 1
                continue
            if got != reference:
                changed.append((position, bit))
    assert changed == [], f"damaged bundles read with altered contents at (offset, bit) {changed[:10]}"
    assert refused > 0.9 * 2 * len(positions)

    target = aot.Cache(tmp_path / "target")
    try:
        damaged = bytearray(good)
        damaged[len(good) // 2] ^= 0x04
        damaged_path.write_bytes(bytes(damaged))
        with pytest.raises(CorruptArtifactError):
            target.import_bundle(damaged_path)
        assert _is_empty(target)  # nothing written
        target.import_bundle(path)  # the intact one is accepted
        _check_served(target, compiled)
    finally:
        target.close()


def test_a_bundle_without_the_content_checksum_is_refused(source, tmp_path: Path) -> None:  # noqa: ANN001
    """Blob digests do not cover the manifests; zstd's content checksum does."""
    header, blobs = _unpack(Path(source.export_bundle(tmp_path / "b.aotb", ["tiny"]).path))
    path = _rewrite(tmp_path / "b.aotb", header, blobs, tmp_path / "unchecked.aotb")
    with pytest.raises(CorruptArtifactError, match="checksum"):
        read_bundle(path)


def test_truncated_and_foreign_files_are_refused(source, tmp_path: Path) -> None:  # noqa: ANN001
    good = Path(source.export_bundle(tmp_path / "good.aotb").path).read_bytes()
    target = aot.Cache(tmp_path / "target")
    try:
        for name, data in [
            ("empty", b""),
            ("not-a-bundle", b"PK\x03\x04 a zip file, say"),
            ("truncated", good[: len(good) // 2]),
            ("trailing", good + b"\x00"),
        ]:
            path = tmp_path / f"{name}.aotb"
            path.write_bytes(data)
            with pytest.raises(CorruptArtifactError):
                target.import_bundle(path)
        with pytest.raises(CacheError, match="cannot read bundle"):
            target.import_bundle(tmp_path / "missing.aotb")
        assert _is_empty(target)
    finally:
        target.close()


def test_a_blob_that_does_not_match_its_digest_is_refused(source, tmp_path: Path) -> None:  # noqa: ANN001
    header, blobs = _unpack(Path(source.export_bundle(tmp_path / "b.aotb", ["tiny"]).path))
    blobs[0] = bytes([blobs[0][0] ^ 1]) + blobs[0][1:]
    path = _rewrite(tmp_path / "b.aotb", header, blobs, tmp_path / "bad.aotb", checksum=True)
    with pytest.raises(CorruptArtifactError, match="does not match its digest"):
        read_bundle(path)


def _rename_dtypes(header: dict, old: str, new: str) -> dict:
    return json.loads(json.dumps(header).replace(f'"{old}"', f'"{new}"'))


def test_a_header_is_judged_only_once_its_checksum_holds(source, tmp_path: Path) -> None:  # noqa: ANN001
    """A dtype this jax lacks is an incompatible bundle when the checksum holds, and a
    damaged one when it does not (a flipped bit once spelled "fl7at32" and was blamed on
    the jax version)."""
    header, blobs = _unpack(Path(source.export_bundle(tmp_path / "b.aotb", ["tiny"]).path))
    header = _rename_dtypes(header, "float32", "fl7at32")
    path = _rewrite(tmp_path / "b.aotb", header, blobs, tmp_path / "newer.aotb", checksum=True)
    with pytest.raises(aot.IncompatibleEnvironmentError, match="fl7at32"):
        read_bundle(path)
    damaged = bytearray(path.read_bytes())
    damaged[-1] ^= 0x01  # the content checksum
    path.write_bytes(bytes(damaged))
    with pytest.raises(CorruptArtifactError, match="checksum|malformed zstd"):
        read_bundle(path)


@pytest.mark.parametrize("name", ["bad\nname", "", "x" * 600, "tab\there", "del\x7f"])
def test_names_that_are_not_allowed_are_refused_one_by_one(source, tmp_path: Path, name: str) -> None:  # noqa: ANN001
    """An entry whose name breaks the name rule is left out (and reported); the other
    entries of the bundle are imported (a bad name used to refuse the whole bundle)."""
    header, blobs = _unpack(Path(source.export_bundle(tmp_path / "b.aotb").path))
    bad = next(i for i, m in enumerate(header["manifests"]) if m["name"] == "tiny")
    header["manifests"][bad]["name"] = name
    path = _rewrite(tmp_path / "b.aotb", header, blobs, tmp_path / "bad.aotb", checksum=True)
    target = aot.Cache(tmp_path / "target")
    try:
        report = target.import_bundle(path)
        assert [r.key for r in report.refused] == [header["manifests"][bad]["key"]]
        assert "name" in report.refused[0].reason
        assert len(report.imported) == len(header["manifests"]) - 1
        assert name not in {e.name for e in target.entries()}
        assert target.verify().ok  # no blob of the refused entry was written
    finally:
        target.close()


def test_a_digest_that_names_a_path_is_refused(source, tmp_path: Path) -> None:  # noqa: ANN001
    header, blobs = _unpack(Path(source.export_bundle(tmp_path / "b.aotb", ["tiny"]).path))
    header["blobs"][0]["digest"] = "../../escape"
    path = _rewrite(tmp_path / "b.aotb", header, blobs, tmp_path / "bad.aotb", checksum=True)
    with pytest.raises(CorruptArtifactError):
        read_bundle(path)
    assert not (tmp_path / "escape").exists()


def test_signed_bundles(open_folder_cache, compiled, tmp_path: Path) -> None:  # noqa: ANN001
    signed = open_folder_cache(signing_key="k1")
    signed.put(compiled.tiny)
    path = signed.export_bundle(tmp_path / "signed.aotb").path

    same_key = aot.Cache(tmp_path / "same", signing_key="k1")
    other_key = aot.Cache(tmp_path / "other", signing_key="k2")
    try:
        assert len(same_key.import_bundle(path).imported) == 1
        with pytest.raises(IntegrityError):
            other_key.import_bundle(path)
        assert _is_empty(other_key)
    finally:
        same_key.close()
        other_key.close()

    # An unsigned bundle is refused by a cache that requires signatures.
    plain = aot.Cache(tmp_path / "plain")
    strict = aot.Cache(tmp_path / "strict", require_signatures=True)
    try:
        plain.put(compiled.tiny)
        unsigned = plain.export_bundle(tmp_path / "unsigned.aotb").path
        with pytest.raises(IntegrityError, match="not signed"):
            strict.import_bundle(unsigned)
        assert _is_empty(strict)
    finally:
        plain.close()
        strict.close()


def test_one_glob_may_be_given_as_a_string(source, compiled, tmp_path: Path) -> None:  # noqa: ANN001
    report = source.export_bundle(tmp_path / "tiny.aotb", "tiny")
    assert report.entries == (compiled.tiny.manifest.key,)


def test_import_repairs_entries_whose_blobs_are_missing_or_corrupt(
    cache: aot.Cache, source, compiled, tmp_path: Path  # noqa: ANN001
) -> None:
    """Importing a good bundle over entries whose rows exist but whose blobs
    are gone or damaged reported "0 imported (5 already present)" and serving still
    failed. Import checks the blobs of the rows it would skip and restores them."""
    path = source.export_bundle(tmp_path / "all.aotb").path
    cache.import_bundle(path)
    mlp = {e.signature: e for e in cache.entries(compiled.MLP_NAME)}
    missing, corrupt, intact = sorted(mlp.values(), key=lambda e: e.signature)[:3]
    cache.blobs.delete(missing.exe_digest)
    cache.blobs.store.write(corrupt.hlo_digest, b"\x28\xb5\x2f\xfd rot")
    report = cache.import_bundle(path)
    assert sorted(report.repaired) == sorted([missing.key, corrupt.key])
    assert report.imported == () and intact.key in report.skipped and len(report.skipped) == 2
    assert cache.verify().ok
    _check_served(cache, compiled)
    assert [e.state for e in cache.entries()] == ["ok"] * 4


def test_export_leaves_out_names_no_cache_would_accept(source, compiled, tmp_path: Path) -> None:  # noqa: ANN001
    """A row stored under a name the name rule refuses (before the rule existed) is
    not exported: the bundle would not import anywhere."""
    import sqlalchemy as sa

    from aot.cache.index.schema import ARTIFACTS

    bad = source.entries(compiled.TINY_NAME)[0]
    t = ARTIFACTS
    with source.index.engine.begin() as conn:
        conn.execute(sa.update(t).where(t.c.key == bad.key).values(name="tiny\nx"))
    report = source.export_bundle(tmp_path / "b.aotb")
    assert [r.key for r in report.refused] == [bad.key] and bad.key not in report.entries
    target = aot.Cache(tmp_path / "target")
    try:
        assert len(target.import_bundle(report.path).imported) == 3
    finally:
        target.close()
