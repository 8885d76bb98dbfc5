"""Hostile input: only typed ``aot.AotError`` s, never another exception, never a write
outside the cache, never an import.

Property tests (hypothesis; bounded, derandomized, no example database) over spec
strings, warmup manifests (TOML), treedef JSON, manifest JSON (random and mutated valid
manifests, which are then resolved against this runtime), and bundle files (random
bytes, bad magic, truncations, flipped bytes, malformed zstd, hostile headers), plus
targeted cases: a zstd frame that asks for a huge window, lying blob sizes, duplicate
blob entries, names with control characters, ``../`` and absolute paths, and manifests
naming a module that must not be imported.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import struct
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh

import aot
from aot import treedef as treedefs
from aot.artifact import Manifest
from aot.rehydrate import executable_info
from aot.cache.admin import bundle as bundles
from aot.cache.cache import Cache

from tests.reliability.helpers import TinyArtifacts, snapshot

try:
    from aot.cache.warmup import run as warmup
except ImportError:  # pragma: no cover - the warmup module is someone else's work
    warmup = None

FUZZ = settings(
    max_examples=150, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
FEW = settings(FUZZ, max_examples=40)


def only_aot_errors(call: Any, *args: Any, **kwargs: Any) -> Any:
    """Runs ``call``; an AotError is fine (returned), anything else fails the test."""
    try:
        return call(*args, **kwargs)
    except aot.AotError as exc:
        assert str(exc), "an error without a message"
        return exc


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


# ---------------------------------------------------------------- spec strings

spec_like = st.from_regex(
    r"\A\s?(f32|bf16|i8|u64|bool|c64|float32|pred|x|F32|)\s?\[[0-9, \-x_+.e٣]{0,14}\]"
    r"(@[A-Za-z_,+() '\"None]{0,16})?\s?\Z"
)


@FUZZ
@given(st.one_of(st.text(max_size=40), spec_like))
def test_spec_strings(text: str) -> None:
    result = only_aot_errors(aot.spec, text)
    if isinstance(result, aot.AotError):  # quotes the spec, says what is expected
        assert repr(text) in str(result) and re.search("expected|pass mesh|the mesh", str(result)), str(result)
    else:
        assert isinstance(result, jax.ShapeDtypeStruct) and all(d >= 0 for d in result.shape)


@FUZZ
@given(spec_like)
def test_spec_strings_with_a_mesh(text: str) -> None:
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    only_aot_errors(aot.spec, text, mesh=mesh)


@FEW
@given(st.recursive(
    st.text(max_size=16) | spec_like | st.integers() | st.floats() | st.none() | st.binary(max_size=4),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3)
    | st.tuples(c, c),
    max_leaves=8,
))
def test_spec_pytrees(tree: Any) -> None:
    only_aot_errors(aot.spec, tree)


# ---------------------------------------------------------------- warmup manifests (TOML)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic strings
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def toml_document(tables: list[dict[str, Any]], extra: dict[str, Any]) -> str:
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in extra.items()]
    for table in tables:
        lines.append("[[function]]")
        lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


toml_scalars = (
    st.text(max_size=20) | spec_like | st.integers(-(2**63), 2**63 - 1) | st.booleans()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["fixtures.models:tiny", "os:system", "@fixtures.models:mlp_param_specs",
                       "f32[{batch},784]", "{batch}", "data=4,model=2", "data=0", "data", "../../etc:x"])
)
toml_values = st.recursive(
    toml_scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(min_size=1, max_size=6), c, max_size=3),
    max_leaves=8,
)
FUNCTION_KEYS = ["name", "function", "target", "args", "args_from", "kwargs", "static", "vary", "pmap",
                 "mesh", "in_shardings", "out_shardings", "donate", "bogus"]
function_tables = st.dictionaries(st.sampled_from(FUNCTION_KEYS), toml_values, max_size=7)


@pytest.mark.skipif(warmup is None, reason="cache/warmup/run.py is not there yet")
@FUZZ
@given(st.lists(function_tables, max_size=3), st.dictionaries(st.sampled_from(["title", "function"]), toml_scalars, max_size=1))
def test_warmup_manifest_structures(tmp_path_factory: Any, tables: list[dict[str, Any]], extra: dict[str, Any]) -> None:
    path = tmp_path_factory.mktemp("toml") / "warmup.toml"
    path.write_text(toml_document(tables, extra), encoding="utf-8")
    manifest = only_aot_errors(warmup.load_manifest, path)
    if not isinstance(manifest, aot.AotError):
        assume(math.prod(len(v) for f in manifest.functions for _, v in f.vary) < 10_000)
        only_aot_errors(warmup.expand, manifest)


@pytest.mark.skipif(warmup is None, reason="cache/warmup/run.py is not there yet")
@FUZZ
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_warmup_manifest_text(tmp_path_factory: Any, content: str | bytes) -> None:
    path = tmp_path_factory.mktemp("toml") / "warmup.toml"
    if isinstance(content, str):
        path.write_text("[[function]]\n" + content, encoding="utf-8", errors="surrogatepass")
    else:
        path.write_bytes(content)
    only_aot_errors(warmup.load_manifest, path)


# ---------------------------------------------------------------- treedef JSON

KINDS = ["leaf", "none", "tuple", "list", "dict", "namedtuple", "custom", "bogus"]
tree_nodes = st.recursive(
    st.fixed_dictionaries({"t": st.sampled_from(["leaf", "none"])}) | json_values,
    lambda children: st.fixed_dictionaries(
        {"t": st.sampled_from(KINDS), "c": st.lists(children, max_size=3)},
        optional={
            "k": st.lists(json_values, max_size=3),
            "fields": st.lists(st.text(max_size=5), max_size=3) | json_values,
            "type": st.sampled_from(["collections:OrderedDict", "builtins:int", "x:y", "reliability_workers:Pair",
                                     "jax.tree_util:Partial", ":", "", "a.b:c.d"]) | json_values,
            "aux": json_values,
        },
    ),
    max_leaves=10,
)


@FUZZ
@given(tree_nodes)
def test_treedef_json(data: Any) -> None:
    only_aot_errors(treedefs.from_json, data)


def test_treedef_json_too_deep() -> None:
    deep: dict[str, Any] = {"t": "leaf"}
    for _ in range(5000):
        deep = {"t": "tuple", "c": [deep]}
    assert isinstance(only_aot_errors(treedefs.from_json, deep), aot.CorruptArtifactError)


@pytest.mark.parametrize("kind", ["custom", "namedtuple"])
def test_treedef_json_never_imports_a_module(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A manifest naming a module must not make the loader import it (import-time code
    would run, from a manifest that may come from a bundle)."""
    marker = tmp_path / "imported"
    (tmp_path / "rel_side_effect.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nimport collections\nX = collections.namedtuple('X', ['a'])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    node = {"t": kind, "type": "rel_side_effect:X", "c": [{"t": "leaf"}]}
    node.update({"fields": ["a"]} if kind == "namedtuple" else {"aux": None})
    result = only_aot_errors(treedefs.from_json, node)
    assert not marker.exists(), "from_json imported a module named by the manifest"
    assert "rel_side_effect" not in sys.modules
    if kind == "custom":
        assert isinstance(result, aot.UnsupportedComputationError)
        assert "import the module that registers it before loading" in str(result)
    else:  # rebuilt from its fields, like any namedtuple whose class is not loaded
        assert result.num_leaves == 1


# ---------------------------------------------------------------- manifest JSON


@pytest.fixture(scope="module")
def valid_manifest(tiny: TinyArtifacts) -> dict[str, Any]:
    return tiny.by_size[3].manifest.to_dict()


@FUZZ
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300), json_values.map(json.dumps)))
def test_manifest_json_text(text: str | bytes) -> None:
    only_aot_errors(Manifest.from_json, text)


def test_manifest_json_too_deep() -> None:
    for text in ("[" * 100_000, '{"a":' * 100_000):
        assert isinstance(only_aot_errors(Manifest.from_json, text), aot.CorruptArtifactError)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@FUZZ
@given(st.data())
def test_mutated_manifests_resolve_only_to_aot_errors(valid_manifest: dict[str, Any], data: st.DataObject) -> None:
    """Mutate one field (anywhere, also where the key does not notice: avals, shardings,
    devices, trees), then parse it and resolve it against this runtime."""
    mutated = copy.deepcopy(valid_manifest)
    paths = _paths(mutated)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = mutated
        try:
            for part in path[:-1]:
                parent = parent[part]
            if data.draw(st.booleans()) and isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent[path[-1]] = data.draw(json_values)
        except (KeyError, IndexError, TypeError):
            continue
    manifest = only_aot_errors(Manifest.from_dict, mutated)
    if not isinstance(manifest, aot.AotError):
        only_aot_errors(executable_info, manifest)


# ---------------------------------------------------------------- bundles


@pytest.fixture(scope="module")
def valid_bundle(tiny: TinyArtifacts, tmp_path_factory: Any) -> bytes:
    folder = tmp_path_factory.mktemp("bundle")
    with Cache(folder / "cache") as cache:
        for n in (1, 2):
            cache.put_artifact(tiny.by_size[n])
        cache.export_bundle(folder / "b.bundle")
    return (folder / "b.bundle").read_bytes()


def split_bundle(raw: bytes) -> tuple[dict[str, Any], list[bytes]]:
    payload = zstandard.ZstdDecompressor().stream_reader(raw[len(bundles.MAGIC):]).read()
    (n,) = struct.unpack("<Q", payload[:8])
    header = json.loads(payload[8 : 8 + n])
    blobs, offset = [], 8 + n
    for b in header["blobs"]:
        blobs.append(payload[offset : offset + b["size"]])
        offset += b["size"]
    return header, blobs


def make_bundle(header: Any, blobs: list[bytes], *, header_len: int | None = None,
                compressor: zstandard.ZstdCompressor | None = None) -> bytes:
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    payload = struct.pack("<Q", len(text) if header_len is None else header_len) + text + b"".join(blobs)
    return bundles.MAGIC + (compressor or zstandard.ZstdCompressor(level=1, write_checksum=True)).compress(payload)


def read(tmp_path_factory: Any, raw: bytes) -> Any:
    path = tmp_path_factory.mktemp("in") / "x.bundle"
    path.write_bytes(raw)
    return only_aot_errors(bundles.read_bundle, path)


@FUZZ
@given(st.binary(max_size=400))
def test_bundle_random_bytes(tmp_path_factory: Any, raw: bytes) -> None:
    read(tmp_path_factory, raw)
    read(tmp_path_factory, bundles.MAGIC + raw)
    read(tmp_path_factory, bundles.MAGIC + zstandard.ZstdCompressor(write_checksum=True).compress(raw))
    read(tmp_path_factory, bundles.MAGIC + zstandard.ZstdCompressor().compress(raw))


@FUZZ
@given(st.data())
def test_bundle_truncated_or_flipped(tmp_path_factory: Any, valid_bundle: bytes, data: st.DataObject) -> None:
    raw = bytearray(valid_bundle)
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
        result = read(tmp_path_factory, bytes(raw))
        assert isinstance(result, aot.CorruptArtifactError), "a truncated bundle was accepted"
    else:
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= data.draw(st.integers(1, 255))
        result = read(tmp_path_factory, bytes(raw))
        if not isinstance(result, aot.AotError):
            # a flip in a field nothing covers (created_at, compile_seconds: only a
            # signature covers the whole manifest); every blob still matches its digest
            for artifact in result:
                for ref in artifact.manifest.blobs.values():
                    assert hashlib.sha256(artifact.blobs[ref.digest]).hexdigest() == ref.digest


@FUZZ
@given(st.data())
def test_bundle_hostile_headers(tmp_path_factory: Any, valid_bundle: bytes, data: st.DataObject) -> None:
    header, blobs = split_bundle(valid_bundle)
    paths = _paths(header)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = header
        try:
            for part in path[:-1]:
                parent = parent[part]
            parent[path[-1]] = data.draw(json_values | st.sampled_from(
                ["../../etc/passwd", "/etc/passwd", "a\x00b", "\x1b[31mred", "C:\\Windows", 2**64, -1]
            ))
        except (KeyError, IndexError, TypeError):
            continue
    if data.draw(st.booleans()):
        blobs = data.draw(st.permutations(blobs))
    read(tmp_path_factory, make_bundle(header, blobs))


def test_bundle_targeted(tmp_path_factory: Any, valid_bundle: bytes) -> None:
    header, blobs = split_bundle(valid_bundle)
    cases: dict[str, tuple[bytes, str]] = {}
    cases["bad magic"] = (b"AOTBNDL2" + valid_bundle[8:], "not a jax-aot bundle")
    cases["empty"] = (b"", "not a jax-aot bundle")
    cases["magic only"] = (bundles.MAGIC, "zstd")
    cases["no zstd checksum"] = (
        make_bundle(header, blobs, compressor=zstandard.ZstdCompressor(write_checksum=False)), "checksum"
    )
    # a frame that declares a 1 GiB window (a decompression-memory bomb)
    big = zstandard.ZstdCompressor(compression_params=zstandard.ZstdCompressionParameters(
        window_log=30, write_checksum=True, write_content_size=False,
    ))
    payload = struct.pack("<Q", len(json.dumps(header))) + json.dumps(header).encode() + b"".join(blobs)
    streamed = big.compressobj()
    huge = bundles.MAGIC + streamed.compress(payload) + streamed.flush()
    assert zstandard.get_frame_parameters(huge[8:]).window_size == 1 << 30
    cases["huge window"] = (huge, "zstd")
    cases["header length lies (huge)"] = (make_bundle(header, blobs, header_len=2**63), "too large")
    cases["header length lies (long)"] = (make_bundle(header, blobs, header_len=10**6), "truncated")
    cases["header length lies (short)"] = (make_bundle(header, blobs, header_len=10), "header")
    cases["header not JSON"] = (make_bundle(b"\xff\xfe not json", blobs), "header")
    cases["header too deep"] = (make_bundle(b"[" * 100_000, []), "header")
    h = copy.deepcopy(header)
    h["blobs"][0]["size"] += 1
    cases["blob size lies (larger)"] = (make_bundle(h, blobs), "")
    h = copy.deepcopy(header)
    h["blobs"][0]["size"] -= 1
    cases["blob size lies (smaller)"] = (make_bundle(h, blobs), "")
    h = copy.deepcopy(header)
    h["blobs"][0]["size"] = 2**40
    cases["blob size absurd"] = (make_bundle(h, blobs), "size")
    h = copy.deepcopy(header)
    h["blobs"].append(h["blobs"][0])
    cases["duplicate blob entry"] = (make_bundle(h, blobs + [blobs[0]]), "twice")
    h = copy.deepcopy(header)
    h["manifests"].append(h["manifests"][0])
    cases["duplicate entry"] = (make_bundle(h, blobs), "twice")
    h = copy.deepcopy(header)
    h["blobs"] = h["blobs"][:-1]
    cases["missing blob"] = (make_bundle(h, blobs[:-1]), "missing")
    cases["trailing bytes"] = (make_bundle(header, blobs + [b"x"]), "unexpected bytes")
    cases["trailing garbage after the frame"] = (valid_bundle + b"\0garbage", "zstd")
    # a changed manifest under the original content checksum: refused whole, and also
    # with the checksum cut short (the stream reader then skipped the check: accepted)
    h = copy.deepcopy(header)
    h["manifests"][0]["compile_seconds"] += 1.0
    forged = make_bundle(h, blobs)[:-4] + make_bundle(header, blobs)[-4:]
    cases["changed content, original checksum"] = (forged, "checksum")
    cases["changed content, checksum cut"] = (forged[:-2], "truncated")
    h = copy.deepcopy(header)
    h["blobs"][0]["digest"] = "../../etc/passwd"
    cases["path as digest"] = (make_bundle(h, blobs), "digest")
    h = copy.deepcopy(header)
    h["bundle_format"] = 99
    cases["other format"] = (make_bundle(h, blobs), "format 99")
    for label, (raw, fragment) in cases.items():
        result = read(tmp_path_factory, raw)
        assert isinstance(result, aot.CorruptArtifactError), (label, result)
        assert fragment.lower() in str(result).lower(), (label, str(result))
        assert "x.bundle" in str(result), (label, "the message names no bundle", str(result))


@pytest.mark.parametrize("name", ["evil\x00name", "\x1b[31mred", "x" * 513, ""])
def test_a_name_the_cache_refuses_leaves_the_rest_of_the_bundle_importable(
    name: str, tmp_path: Path, valid_bundle: bytes
) -> None:
    """A name breaking the name rule is not damage to the bundle: that entry is refused
    (reported, nothing of it written), the others are imported."""
    header, blobs = split_bundle(valid_bundle)
    header["manifests"][0]["name"] = name
    source = tmp_path / "src.bundle"
    source.write_bytes(make_bundle(header, blobs))
    with Cache(tmp_path / "cache") as cache:
        report = cache.import_bundle(source)
        assert [r.key for r in report.refused] == [header["manifests"][0]["key"]]
        assert len(report.imported) == len(header["manifests"]) - 1
        assert name not in {e.name for e in cache.entries()}
        report = cache.verify()
        assert report.ok, report.to_dict()  # no orphan: nothing of the refused entry was written


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "..", "a/../../b", "C:\\x", "ok.name"])
def test_import_never_writes_outside_the_cache(
    name: str, tmp_path: Path, valid_bundle: bytes, tiny: TinyArtifacts
) -> None:
    """Names that look like paths are only names: importing them writes inside the
    cache folder only, and the entries serve under those names."""
    from aot.fingerprint import Fingerprint, combined_key

    header, blobs = split_bundle(valid_bundle)
    for m in header["manifests"]:
        # Renamed as a writer would have named it: the name is part of the program
        # fingerprint (a manifest whose name contradicts it is refused as altered).
        m["name"] = m["program"]["parts"]["name"] = name
        program = Fingerprint.from_dict(m["program"])
        m["program"]["digest"] = program.digest
        m["key"] = combined_key(program, Fingerprint.from_dict(m["environment"]))
    source = tmp_path / "src.bundle"
    source.write_bytes(make_bundle(header, blobs))
    cache_dir = tmp_path / "cache"
    with Cache(cache_dir) as cache:
        before = snapshot(tmp_path)
        report = cache.import_bundle(source)
        after = snapshot(tmp_path)
        assert len(report.imported) == 2
        changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
        assert changed and all(p.startswith("cache/") or p == "cache" for p in changed), changed
        assert {e.name for e in cache.entries()} == {name}
        fn = aot.load(name, cache, strict=True)
        out = fn(np.arange(2, dtype=np.float32))
        np.testing.assert_allclose(np.asarray(out), np.arange(2) * 2.0 + 1.0)


@FEW
@given(st.data())
def test_import_of_hostile_bundles_changes_nothing_outside_the_cache(
    tmp_path_factory: Any, valid_bundle: bytes, data: st.DataObject
) -> None:
    root = tmp_path_factory.mktemp("import")
    header, blobs = split_bundle(valid_bundle)
    paths = _paths(header)
    path = data.draw(st.sampled_from(paths))
    parent = header
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = data.draw(json_values | st.sampled_from(["../../x", "/tmp/x", "\x07"]))
    source = root / "in.bundle"
    source.write_bytes(make_bundle(header, blobs))
    with Cache(root / "cache") as cache:
        before = snapshot(root)
        before_entries = cache.entries()
        result = only_aot_errors(cache.import_bundle, source)
        after = snapshot(root)
        changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
        assert all(p.startswith("cache/") for p in changed), changed
        if isinstance(result, aot.AotError):
            assert cache.entries() == before_entries, "a refused bundle left entries behind"


@FEW
@given(st.data())
def test_mutated_manifests_in_a_cache_serve_or_refuse(
    tmp_path_factory: Any, valid_manifest: dict[str, Any], tiny: TinyArtifacts, data: st.DataObject
) -> None:
    """An unsigned manifest edited in the index (fields the key does not cover): aot.load
    and a call raise only AotErrors, or serve the right result."""
    from aot.cache.index.schema import ARTIFACTS
    import sqlalchemy as sa

    mutated = copy.deepcopy(valid_manifest)
    path = data.draw(st.sampled_from([p for p in _paths(mutated) if p[0] not in ("program", "environment", "key", "blobs")]))
    parent = mutated
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = data.draw(json_values)
    root = tmp_path_factory.mktemp("served")
    with Cache(root / "cache") as cache:
        cache.put_artifact(tiny.by_size[3])
        t = ARTIFACTS
        with cache.index.engine.begin() as conn:
            conn.execute(sa.update(t).values(manifest=json.dumps(mutated)))
        fn = only_aot_errors(aot.load, TinyArtifacts.NAME, cache, strict=True)
        if isinstance(fn, aot.AotError):
            return
        out = only_aot_errors(fn, np.arange(3, dtype=np.float32))
        if not isinstance(out, aot.AotError):
            np.testing.assert_allclose(np.asarray(out), np.arange(3) * 2.0 + 1.0)
