"""Copies keep identity (issue 22, item 2): push, pull and bundles keep each entry's
compile time, carry refs without silently changing what the destination declared, and
copy a release by its label. Two versions of one program under one name and
signature: a small one and one with a 1 MiB constant (its blobs finish copying last)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

import aot
from aot.cache.admin.transfer import copy_entries
from aot.cache.index.refs import RefOrigin
from aot.cache.index.served import ref_map, served_key
from aot.cli.main import cli

NAME = "model.forward"
SPEC = "f32[512,512]"
_BIG = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)  # 1 MiB, incompressible
X = np.random.default_rng(1).standard_normal((512, 512)).astype(np.float32)


def small(x: Any) -> Any:
    return jnp.tanh(x) * 2.0


def large(x: Any) -> Any:
    return x * 0.5 + jnp.asarray(_BIG)


VERSIONS: dict[str, Callable[..., Any]] = {"small": small, "large": large}

SERVE = textwrap.dedent("""
    import sys
    import numpy as np
    import aot

    location, blobs, x_path, out_path = sys.argv[1:5]
    cache = aot.Cache(location, blob_location=blobs or None, read_only=True)
    fn = aot.load("model.forward", cache=cache, strict=True)
    np.save(out_path, np.asarray(fn(np.load(x_path))))
""")


def _served_in_fresh_process(location: str, blobs: str | None, tmp_path: Path) -> np.ndarray:
    """What ``aot.load`` serves in a process that cannot import this module's programs."""
    np.save(tmp_path / "x.npy", X)
    out = tmp_path / "out.npy"
    done = subprocess.run(
        [sys.executable, "-c", SERVE, location, blobs or "", str(tmp_path / "x.npy"), str(out)],
        cwd=tmp_path, env=os.environ.copy(), capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return np.load(out)


def _expected(version: str) -> np.ndarray:
    return np.asarray(jax.jit(VERSIONS[version])(X))


def _aot(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result


def _loader_serves_refs(cache: aot.Cache, declared: str) -> bool:
    """Whether ``aot.load`` here serves the ref'd entry (the loader's selection by refs
    is another part of issue 22): the copy can only be judged by it if it does."""
    fn = aot.load(NAME, cache=cache)
    return bool(np.array_equal(np.asarray(fn(X)), _expected(declared)))


@pytest.fixture
def two_versions(tmp_path: Path) -> Callable[[str, str, str], tuple[aot.Cache, dict[str, Any]]]:
    """A folder cache holding ``first`` then ``second`` under one name and signature,
    the ref naming ``declared``; returns it and its entries by version."""
    opened: list[aot.Cache] = []

    def make(first: str, second: str, declared: str) -> tuple[aot.Cache, dict[str, Any]]:
        source = aot.Cache(tmp_path / "source")
        opened.append(source)
        entries = {}
        for version in (first, second):
            source.compile(VERSIONS[version], aot.spec(SPEC), name=NAME)
            (entries[version],) = [e for e in source.entries(NAME) if e.key not in {x.key for x in entries.values()}]
        source.set_refs([entries[declared]], RefOrigin("test"))
        assert entries["large"].stored_size > 20 * entries["small"].stored_size
        return source, entries

    yield make
    for cache in opened:
        cache.close()


@pytest.fixture(params=["folder", pytest.param("postgresql+s3", marks=pytest.mark.postgres)])
def destination(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    """An empty destination: (location, blob location or None)."""
    if request.param == "folder":
        yield str(tmp_path / "destination"), None
    else:
        yield str(request.getfixturevalue("postgres_url")), str(request.getfixturevalue("s3_url"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "first,second,declared",
    [("small", "large", "small"), ("large", "small", "small"), ("small", "large", "large")],
    ids=["rolled-back-to-small-v1", "large-v1-small-v2-declared", "large-v2-declared"],
)
def test_parallel_push_serves_what_the_source_declared_and_gc_keeps_it(
    two_versions, destination, first: str, second: str, declared: str, tmp_path: Path,  # noqa: ANN001
) -> None:
    source, entries = two_versions(first, second, declared)
    location, blobs = destination
    to_blobs = ["--to-blobs", blobs] if blobs else []
    _aot("--cache", str(source.location), "push", location, *to_blobs, "--jobs", "8")
    with_blobs = ["--blobs", blobs] if blobs else []
    gc = _aot("--cache", location, *with_blobs, "gc", "--superseded", "--yes", "--json")
    dest = aot.Cache(location, blob_location=blobs, read_only=True)
    try:
        stored = {e.key: e for e in dest.entries(NAME)}
        want = entries[declared]
        assert want.key in stored, gc.output  # gc kept what the source declared
        slot = (want.name, want.signature, want.env_fp)
        assert served_key(stored.values(), ref_map(dest.index.refs()), slot) == want.key
        # Each copy keeps its compile time: the larger one, which finished last, is not newer.
        assert stored[want.key].created_at == want.created_at
        if not _loader_serves_refs(source, declared):
            pytest.xfail("aot.load does not serve refs on this branch yet (loader selection by refs)")
    finally:
        dest.close()
    got = _served_in_fresh_process(location, blobs, tmp_path)
    np.testing.assert_array_equal(got, _expected(declared))  # bit for bit
    assert not np.array_equal(got, _expected(second if declared == first else first))


def test_an_existing_destination_ref_is_kept_unless_refs_is_given(open_cache, two_versions) -> None:  # noqa: ANN001
    source, entries = two_versions("small", "large", "large")
    dest = open_cache()
    copy_entries(source, dest)
    assert [r.key for r in dest.refs_named(NAME)] == [entries["large"].key]  # no ref there: copied
    dest.set_refs([dest.entry(entries["small"].key)], RefOrigin("the destination's own"))
    again = copy_entries(source, dest, jobs=8)
    assert [r.key for r in dest.refs_named(NAME)] == [entries["small"].key]
    assert [m.key for m in again.refs.kept] == [entries["large"].key] and again.refs.set == ()
    overwritten = copy_entries(source, dest, refs=True)
    assert [r.key for r in dest.refs_named(NAME)] == [entries["large"].key]
    assert [m.key for m in overwritten.refs.set] == [entries["large"].key] and overwritten.refs.kept == ()
    history = dest.index.ref_history(NAME)
    assert [h.source for h in history][:2] == [f"copy from {source.display_location}", "the destination's own"]


def test_release_label_is_copied_with_its_entries(open_cache, two_versions) -> None:  # noqa: ANN001
    source, entries = two_versions("small", "large", "large")
    origin = RefOrigin("test", release="prod")
    set_id = source.index.open_release("prod", origin)
    source.set_refs([entries["small"]], origin, release_id=set_id)  # prod serves small
    dest = open_cache()
    report = copy_entries(source, dest, release="prod", origin="pull from the source")
    assert report.ok and report.copied == (entries["small"].key,)  # only the release's members
    release = dest.index.release_set("prod")
    assert release is not None and release.keys() == {entries["small"].key}
    assert release.source == "pull from the source"
    assert [r.key for r in dest.refs_named(NAME)] == [entries["small"].key]
    # A label the source does not have: an error naming it and the labels there.
    with pytest.raises(aot.AotError, match=r"no release labelled 'canary'.*labels: prod"):
        copy_entries(source, dest, release="canary")


def test_a_release_whose_member_cannot_be_copied_is_not_recorded(open_folder_cache, two_versions) -> None:  # noqa: ANN001
    source, entries = two_versions("small", "large", "large")
    origin = RefOrigin("test", release="prod")
    source.set_refs([entries["small"]], origin, release_id=source.index.open_release("prod", origin))
    source.blobs.store.write(entries["small"].exe_digest, b"rot")  # damaged at the source
    dest = open_folder_cache()
    report = copy_entries(source, dest, release="prod")
    assert not report.ok and report.refs.problem is not None and "not recorded" in report.refs.problem
    assert dest.index.release_set("prod") is None and dest.refs_named(NAME) == []
    assert report.failed[0][0] == entries["small"].key


def test_created_at_survives_push_pull_and_bundles(open_cache, two_versions, tmp_path: Path) -> None:  # noqa: ANN001
    source, entries = two_versions("small", "large", "small")
    times = {e.key: e.created_at for e in entries.values()}
    middle = open_cache()
    copy_entries(source, middle, jobs=8)  # a push (this side -> middle)
    assert {e.key: e.created_at for e in middle.entries(NAME)} == times
    back = aot.Cache(tmp_path / "back")
    try:
        copy_entries(middle, back)  # a pull (middle -> back)
        assert {e.key: e.created_at for e in back.entries(NAME)} == times
        bundle = tmp_path / "copies.aotb"
        exported = middle.export_bundle(bundle)
        assert {m.key for m in exported.carried.refs} == {entries["small"].key}
        imported_into = aot.Cache(tmp_path / "imported")
        try:
            report = imported_into.import_bundle(bundle)
            assert {e.key: e.created_at for e in imported_into.entries(NAME)} == times
            assert [m.key for m in report.refs.set] == [entries["small"].key]
            assert [r.key for r in imported_into.refs_named(NAME)] == [entries["small"].key]
        finally:
            imported_into.close()
    finally:
        back.close()


def test_bundle_release_and_refs_rules_on_import(open_cache, two_versions, tmp_path: Path) -> None:  # noqa: ANN001
    source, entries = two_versions("small", "large", "large")
    origin = RefOrigin("test", release="prod")
    source.set_refs([entries["small"]], origin, release_id=source.index.open_release("prod", origin))
    bundle = tmp_path / "prod.aotb"
    runner = CliRunner()
    exported = runner.invoke(cli, ["--cache", str(source.location), "bundle", "export", str(bundle), "--release", "prod"])
    assert exported.exit_code == 0, exported.output
    assert exported.output == f"exported 1 entry to {bundle} ({exported.output.split('(')[1]}"
    dest = open_cache()
    report = dest.import_bundle(bundle)
    assert report.imported == (entries["small"].key,) and report.refs.release == "prod"
    release = dest.index.release_set("prod")
    assert release is not None and release.keys() == {entries["small"].key}
    assert release.source == f"import of bundle {bundle}"
    # Without --release, the bundle carries the current ref (large again); the importing
    # cache has its own ref (small) and keeps it unless asked.
    source.set_refs([entries["large"]], RefOrigin("test"))
    all_of_it = tmp_path / "all.aotb"
    source.export_bundle(all_of_it)
    kept = dest.import_bundle(all_of_it)
    assert [m.key for m in kept.refs.kept] == [entries["large"].key]
    assert [r.key for r in dest.refs_named(NAME)] == [entries["small"].key]
    dest.import_bundle(all_of_it, refs=True)
    assert [r.key for r in dest.refs_named(NAME)] == [entries["large"].key]


def test_an_old_bundle_without_times_imports_with_the_import_time(open_folder_cache, two_versions, tmp_path: Path) -> None:  # noqa: ANN001
    import json
    import struct

    import zstandard

    from aot.cache.admin import bundle as bundles

    source, entries = two_versions("small", "large", "small")
    path = tmp_path / "new.aotb"
    source.export_bundle(path)
    raw = path.read_bytes()
    body = zstandard.ZstdDecompressor().decompressobj().decompress(raw[len(bundles.MAGIC):])
    (n,) = struct.unpack("<Q", body[:8])
    header = json.loads(body[8:8 + n])
    for key in ("entries", "refs"):  # what a bundle of earlier versions lacks
        header.pop(key)
    old_header = json.dumps(header, sort_keys=True).encode()
    old = tmp_path / "old.aotb"
    old.write_bytes(bundles.MAGIC + zstandard.ZstdCompressor(write_checksum=True).compress(
        struct.pack("<Q", len(old_header)) + old_header + body[8 + n:]
    ))
    dest = open_folder_cache()
    before = dest.index.now()
    report = dest.import_bundle(old)
    assert len(report.imported) == 2 and report.refs.set == () and dest.refs_named(NAME) == []
    assert all(e.created_at >= before for e in dest.entries(NAME))
    assert all(e.created_at > max(x.created_at for x in entries.values()) for e in dest.entries(NAME))


def test_push_release_and_refs_from_the_command_line(two_versions, tmp_path: Path) -> None:  # noqa: ANN001
    source, entries = two_versions("small", "large", "large")
    origin = RefOrigin("test", release="prod")
    source.set_refs([entries["small"]], origin, release_id=source.index.open_release("prod", origin))
    dest = str(tmp_path / "dest")
    runner = CliRunner()
    pushed = runner.invoke(cli, ["--cache", str(source.location), "push", dest, "--release", "prod"])
    assert pushed.exit_code == 0, pushed.output
    assert pushed.output.splitlines()[1] == "refs: 1 set; release prod recorded"
    both = runner.invoke(cli, ["--cache", str(source.location), "push", dest, "model.*", "--release", "prod"])
    assert both.exit_code == 1 and "give either NAME_GLOBs (model.*) or --release prod" in both.output
    source.set_refs([entries["large"]], RefOrigin("test"))
    kept = runner.invoke(cli, ["--cache", str(source.location), "push", dest])
    assert kept.exit_code == 0 and kept.output.splitlines()[1] == (
        "refs: 0 set, 1 kept (the destination's own; --refs overwrites)"
    ), kept.output
    forced = runner.invoke(cli, ["--cache", str(source.location), "push", dest, "--refs", "--json"])
    data = json.loads(forced.stdout)
    assert [m["key"] for m in data["refs"]["set"]] == [entries["large"].key] and data["refs"]["kept"] == []
