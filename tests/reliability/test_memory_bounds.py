"""Memory is bounded by what is declared: zstd bombs and lying frames in a cache's blobs
and in bundles.

A lying frame header (claims 1 TiB) or a blob inflating far beyond the size its
manifest declares is corruption: a strict load raises CorruptArtifactError (never
MemoryError) saying what was wrong, ``verify`` reports and quarantines the entry, a
lenient load heals it from the portable HLO. A bundle declaring blobs no manifest
references is refused before a byte of them is inflated. Peak RSS is measured with
``resource`` in a child process: it grows by less than 2x the declared size + 64 MB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import aot
from aot.cache.admin import bundle as bundles
from aot.cache.cache import Cache

from tests.cache.storage.zstd_frames import bomb, claiming
from tests.reliability import reliability_workers as workers
from tests.reliability.helpers import TinyArtifacts, child_env
from tests.reliability.rss import run_measured
from tests.reliability.test_corruption import (
    VICTIM,
    assert_message,
    good_digests,
    heal_and_check,
    read_raw,
    victim,
    write_raw,
)
from tests.reliability.test_hostile_input import make_bundle, split_bundle, valid_bundle  # noqa: F401

MB = 1024 * 1024
GIB = 1024 * MB
TIB = 1024 * GIB


def lying_frame(cache: Cache, entry: Any) -> None:
    """The same bytes, 8 bytes of frame header changed: the frame claims 1 TiB."""
    digest = entry.exe_digest
    write_raw(cache, digest, claiming(cache.blobs.get(digest), TIB))


def zstd_bomb(cache: Cache, entry: Any) -> None:
    """32 KiB stored that inflate to 1 GiB, for an executable of a few KB."""
    write_raw(cache, entry.exe_digest, bomb(GIB))


DAMAGE: dict[str, Callable[[Cache, Any], None]] = {"lying frame": lying_frame, "zstd bomb": zstd_bomb}
WHAT = r"size differs from the declared size: the zstd frame header claims \d+ bytes, only \d+ are declared"


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_strict_load_raises_a_clear_corrupt_error(
    damage: str, make_cache: Callable[..., Cache], deserialize_spy: Any, tiny: TinyArtifacts
) -> None:
    cache = make_cache()
    entry = victim(cache)
    DAMAGE[damage](cache, entry)
    with pytest.raises(aot.CorruptArtifactError) as caught:
        aot.load(TinyArtifacts.NAME, make_cache(), strict=True)
    assert_message(caught.value, entry, WHAT)
    assert deserialize_spy.bad(good_digests(cache, tiny)) == []


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_verify_reports_and_quarantines_then_compile_heals(
    damage: str, make_cache: Callable[..., Cache]
) -> None:
    cache = make_cache()
    entry = victim(cache)
    DAMAGE[damage](cache, entry)
    report = cache.verify()
    assert [p.key for p in report.problems] == [entry.key], report.to_dict()
    assert f"executable blob {entry.exe_digest[:12]}: size differs" in report.problems[0].what
    assert report.quarantined == (entry.key,)
    heal_and_check(make_cache, entry.key)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_lenient_load_heals_from_the_portable_hlo(damage: str, make_cache: Callable[..., Cache]) -> None:
    cache = make_cache()
    entry = victim(cache)
    DAMAGE[damage](cache, entry)
    fn = aot.load(TinyArtifacts.NAME, make_cache())
    for n in (1, 2, 3):
        np.testing.assert_allclose(np.asarray(fn(np.arange(n, dtype=np.float32))), workers.expected_scaled(n))
    healed = cache.index.get(entry.key)
    assert healed.ok and cache.blobs.check(healed.exe_digest) is None
    assert len(read_raw(cache, healed.exe_digest)) < 1 * MB


# ---------------------------------------------------------------- RSS in a child

# Opens the cache, then measures how much the peak RSS grows over one strict load or
# one `verify` (JAX imported and initialised before the baseline; one operation per
# process, since a peak hides any smaller one after it).
CACHE_CHILD = """
import json, resource, sys
import jax
import numpy as np
import aot
from aot.cache.cache import Cache

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

location, name, operation = sys.argv[1], sys.argv[2], sys.argv[3]
cache = Cache(location)
np.asarray(jax.jit(lambda x: x + 1)(np.ones(2, np.float32)))
out = {}
before = peak()
if operation == "load":
    try:
        aot.load(name, cache, strict=True)
        out["outcome"] = "loaded"
    except aot.AotError as exc:
        out["outcome"] = type(exc).__name__ + ": " + str(exc)
else:
    report = cache.verify()
    out["outcome"] = [p.what for p in report.problems]
    out["quarantined"] = list(report.quarantined)
out["grew"] = peak() - before
print(json.dumps(out))
"""


def run_child(script: str, *args: str) -> dict[str, Any]:
    return run_measured(script, *args, env=child_env())


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_rss_of_strict_load_and_verify_is_bounded_by_the_declared_size(
    damage: str, tmp_path: Path, tiny: TinyArtifacts
) -> None:
    location = tmp_path / "cache"
    with Cache(location) as cache:
        for n in (1, 2, 3):
            cache.put_artifact(tiny.by_size[n])
        entry = victim(cache)
        declared = sum(ref.size for ref in tiny.by_size[VICTIM].manifest.blobs.values())
        DAMAGE[damage](cache, entry)
    bound = 2 * declared + 64 * MB
    load = run_child(CACHE_CHILD, str(location), TinyArtifacts.NAME, "load")
    assert load["outcome"].startswith("CorruptArtifactError") and "size differs" in load["outcome"], load
    assert load["grew"] < bound, load
    verify = run_child(CACHE_CHILD, str(location), TinyArtifacts.NAME, "verify")
    assert verify["grew"] < bound, verify
    assert verify["quarantined"] == [entry.key], verify
    assert any("size differs" in p for p in verify["outcome"]), verify


# ---------------------------------------------------------------- bundles

BUNDLE_CHILD = """
import json, resource, sys
from aot.cache.admin import bundle
from aot.errors import AotError

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

before = peak()
try:
    bundle.read_bundle(sys.argv[1])
    outcome = "read"
except AotError as exc:
    outcome = type(exc).__name__ + ": " + str(exc)
print(json.dumps({"grew": peak() - before, "outcome": outcome}))
"""


def declared_size(header: dict[str, Any]) -> int:
    return sum(int(b["size"]) for b in header["blobs"])


def test_a_bundle_declaring_two_extra_gibibyte_blobs_is_refused_before_inflating_them(
    valid_bundle: bytes, tmp_path: Path  # noqa: F811 - the fixture
) -> None:
    header, blobs = split_bundle(valid_bundle)
    declared = declared_size(header)
    header["blobs"] += [{"digest": c * 64, "size": GIB} for c in "ab"]
    text = json.dumps(header).encode()
    prefix = len(text).to_bytes(8, "little") + text + b"".join(blobs)
    path = tmp_path / "bomb.bundle"
    path.write_bytes(bundles.MAGIC + bomb(2 * GIB, prefix=prefix, content_size=False, checksum=True))
    assert path.stat().st_size < 200 * 1024
    out = run_child(BUNDLE_CHILD, str(path))
    assert out["outcome"].startswith("CorruptArtifactError"), out
    assert "no manifest references" in out["outcome"] and "refused before reading it" in out["outcome"], out
    assert out["grew"] < 2 * declared + 64 * MB, out


def test_a_bundle_whose_frame_claims_a_tebibyte_is_corrupt(
    valid_bundle: bytes, tmp_path: Path  # noqa: F811 - the fixture
) -> None:
    header, blobs = split_bundle(valid_bundle)
    text = json.dumps(header).encode()
    payload = len(text).to_bytes(8, "little") + text + b"".join(blobs)
    path = tmp_path / "lying.bundle"
    path.write_bytes(bundles.MAGIC + claiming(payload, TIB, checksum=True))
    out = run_child(BUNDLE_CHILD, str(path))
    assert out["outcome"].startswith("CorruptArtifactError"), out
    assert "lying.bundle" in out["outcome"], out
    assert out["grew"] < 2 * declared_size(header) + 64 * MB, out
