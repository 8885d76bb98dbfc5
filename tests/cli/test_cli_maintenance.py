"""aot verify, aot gc, aot bundle, and errors about the cache itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import aot
from tests.cli.helpers import MANIFEST, Invoke, one_line_error, store_for_another_environment

VERIFY_KEYS = {"ok", "integrity", "coverage", "dangling", "aging"}  # aging: portable HLO near its end (issue 45)
INTEGRITY_KEYS = {
    "ok", "checked_entries", "checked_blobs", "problems", "quarantined", "removed", "orphan_blobs", "cache_problems",
    "notes",
}
GC_KEYS = {"dry_run", "executed", "entries", "blobs", "bytes_freed", "size_before", "size_after", "warnings", "pinned", "dropped_refs",
           "jax_release", "retired_environments"}
BUNDLE_KEYS = {"path", "entries", "imported", "skipped", "repaired", "refused", "bytes", "refs", "carried"}


def _corrupt_executable_of(cache_dir: Path, name: str) -> str:
    cache = aot.Cache(cache_dir)
    entry = cache.entries(name)[0]
    path = cache.blobs.store.path_for(entry.exe_digest)
    path.write_bytes(b"not what was stored")
    return entry.key


# ---------------------------------------------------------------- verify


def test_verify_ok(invoke: Invoke, warmed, cache_dir) -> None:
    result = invoke("verify")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"verified 5 entries and 10 blobs in {cache_dir}: ok\n"
    data = json.loads(invoke("verify", "--json").stdout)
    assert set(data) == VERIFY_KEYS and set(data["integrity"]) == INTEGRITY_KEYS
    assert data["ok"] is True and data["coverage"] is None


def test_verify_finds_and_quarantines_a_corrupt_blob(invoke: Invoke, warmed) -> None:
    key = _corrupt_executable_of(warmed, "tiny")
    result = invoke("verify")
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[0].endswith(": PROBLEMS")
    assert lines[1].startswith(f"problem: tiny (x: f32[8], y: f32[8]) {key[:12]}: executable blob ")
    assert "quarantined 1 entry (`aot gc` removes them)" in lines
    assert "quarantined" in invoke("ls", "tiny").stdout
    data = json.loads(invoke("verify", "--json").stdout)
    assert data["ok"] is False and data["integrity"]["problems"][0]["key"] == key
    # gc removes the quarantined entry; verify is clean again.
    plan = json.loads(invoke("gc", "--json").stdout)
    assert [v["key"] for v in plan["entries"]] == [key]
    assert plan["entries"][0]["reason"].startswith("quarantined: ")
    assert invoke("verify").exit_code == 0


def test_verify_read_only_does_not_quarantine(invoke: Invoke, warmed) -> None:
    _corrupt_executable_of(warmed, "tiny")
    result = invoke("--read-only", "verify")
    assert result.exit_code == 1
    assert "quarantined" not in result.stdout
    assert invoke("ls", "tiny").stdout.splitlines()[1].split()[-2:] == ["ok", "ref"]


def test_verify_manifest_coverage(invoke: Invoke, warmed) -> None:
    result = invoke("verify", "--manifest", MANIFEST, "--strict")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == f"{MANIFEST}: all 5 entries are stored for this environment"
    cache = aot.Cache(warmed)
    (entry,) = [e for e in cache.entries("mlp.forward") if e.signature.endswith("f32[8,784]")]
    cache.index.delete([entry.key])
    strict = invoke("verify", "--manifest", MANIFEST, "--strict")
    assert strict.exit_code == 1, strict.output
    assert strict.stdout.splitlines()[-2:] == [
        f"{MANIFEST}: 1 of 5 entries missing for this environment:",
        f"  mlp.forward[batch=8] ({MANIFEST}:17): @fixtures.models:mlp_param_specs, f32[8,784]: "
        "not stored (2 other signatures of 'mlp.forward' are)",
    ]
    lenient = invoke("verify", "--manifest", MANIFEST)
    assert lenient.exit_code == 0, lenient.output
    assert lenient.stdout.splitlines()[:2] == [
        f"verified 4 entries and 8 blobs in {warmed}: ok",
        "3 blobs no entry references (`aot gc` removes them once they are old enough)",  # and its manifest
    ]
    assert "missing for this environment (not a failure without --strict):" in lenient.stdout
    data = json.loads(invoke("verify", "--manifest", MANIFEST, "--strict", "--json").stdout)
    assert data["ok"] is False and data["integrity"]["problems"] == []
    assert len(data["integrity"]["orphan_blobs"]) == 3  # the deleted entry's blobs (and manifest): not a failure
    coverage = data["coverage"]
    assert set(coverage) == {"manifest", "strict", "items", "missing", "stale", "lower_seconds", "targets", "host"}
    assert coverage["targets"] == [] and coverage["host"] is True  # no device target: this host
    assert coverage["items"] == 5 and coverage["strict"] is True
    assert coverage["stale"] == [] and coverage["lower_seconds"] > 0  # the entries were lowered
    assert [m["label"] for m in coverage["missing"]] == ["mlp.forward[batch=8]"]
    assert set(coverage["missing"][0]) == {
        "name", "label", "function", "target", "args", "args_from", "kwargs", "static", "bucket", "pmap",
        "mesh", "in_shardings", "out_shardings", "donate", "x64", "source", "environment", "reason",
    }
    assert coverage["missing"][0]["target"] is None
    assert coverage["missing"][0]["reason"] == "not stored (2 other signatures of 'mlp.forward' are)"


def test_verify_says_an_entry_is_stored_for_another_environment(invoke: Invoke, warmed) -> None:
    """The cache was warmed where XLA_FLAGS gave 8 devices; this shell has fewer."""
    store_for_another_environment(warmed, "tiny", device_count="1")
    cache = aot.Cache(warmed)
    (local,) = [e for e in cache.entries("tiny") if e.env_fp == cache.environment.digest]
    cache.index.delete([local.key])
    cache.close()
    result = invoke("verify", "--manifest", MANIFEST, "--strict")
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[-1] == (
        f"  tiny ({MANIFEST}:23): f32[8], f32[8]: stored for another environment (device_count 1 != 8)"
    )
    data = json.loads(invoke("verify", "--manifest", MANIFEST, "--json").stdout)
    (missing,) = data["coverage"]["missing"]
    assert missing["reason"] == "stored for another environment (device_count 1 != 8)"


def test_verify_says_an_entry_is_quarantined(invoke: Invoke, warmed) -> None:
    _corrupt_executable_of(warmed, "allreduce")
    result = invoke("verify", "--manifest", MANIFEST, "--strict")
    assert result.exit_code == 1
    last = result.stdout.splitlines()[-1]
    assert last.startswith(f"  allreduce ({MANIFEST}:28): f32[8,1024]: quarantined (executable blob ")
    assert last.endswith("; `aot gc` removes it and `aot warmup` compiles it again")


def test_verify_strict_without_a_manifest_checks_refs_and_releases(invoke: Invoke, warmed) -> None:
    result = invoke("verify", "--strict")
    assert result.exit_code == 0, result.output
    assert "dangling" not in result.stdout


def test_verify_bad_manifest_fails_before_checking(invoke: Invoke, warmed, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[function]]\nname = 'x'\nfunction = 'm:f'\nargs = ['f32[{b}]']\n")
    line = one_line_error(invoke("verify", "--manifest", bad, "--strict"))
    assert line.startswith(f"Error: {bad}:1: [[function]] #1 ('x'): placeholder(s)")


# ---------------------------------------------------------------- gc


def test_gc_nothing_to_do(invoke: Invoke, warmed) -> None:
    result = invoke("gc")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("nothing to collect (cache ")


def _unpin(cache_dir: str) -> None:
    with aot.Cache(cache_dir) as cache:
        cache.index.drop_refs([r.slot for r in cache.index.refs()])


def test_gc_keeps_what_refs_pin(invoke: Invoke, warmed) -> None:
    dry = invoke("gc", "--max-size", "1", "--dry-run")
    assert dry.exit_code == 0, dry.output
    lines = dry.stdout.splitlines()
    assert lines[0].startswith("nothing to collect")
    assert lines[1] == "kept 5 pinned entries:"
    assert all("pinned: served ref of " in line for line in lines[2:7])
    assert lines[7].startswith("  to unpin: a newer `aot warmup` moves a ref")


def test_gc_dry_run_then_execute(invoke: Invoke, warmed, cache_dir) -> None:
    _unpin(cache_dir)
    dry = invoke("gc", "--max-size", "1", "--dry-run")
    assert dry.exit_code == 0, dry.output
    lines = dry.stdout.splitlines()
    assert lines[0].startswith("would remove 5 entries and 15 blobs, freeing ")  # 3 each: the manifest too
    assert lines[0].endswith("[dry run]")
    assert len(lines) == 6 and all("least recently used; cache over 1 B" in line for line in lines[1:])
    assert json.loads(invoke("ls", "--json").stdout)["count"] == 5  # nothing removed
    data = json.loads(invoke("gc", "--max-size", "1", "--dry-run", "--json").stdout)
    assert set(data) == GC_KEYS
    assert data["dry_run"] is True and data["executed"] is False and len(data["entries"]) == 5
    assert data["size_after"] == data["size_before"] - data["bytes_freed"] == 0
    done = invoke("gc", "--max-size", "1")
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("removed 5 entries and 15 blobs, freeing ")
    assert json.loads(invoke("ls", "--json").stdout)["count"] == 0


def test_gc_after_evicting_the_last_entry_beside_a_young_orphan(invoke: Invoke, warmed, cache_dir) -> None:
    _unpin(cache_dir)
    with aot.Cache(cache_dir) as cache:
        orphan = cache.blobs.put(b"a young blob nothing references yet")
    done = invoke("gc", "--max-size", "1", "--yes")
    assert done.exit_code == 0 and done.stdout.startswith("removed 5 entries and 15 blobs"), done.output
    again = invoke("gc")
    assert again.exit_code == 0, again.output
    assert "lost, truncated or replaced" not in again.output
    verified = invoke("verify")
    assert verified.exit_code == 0 and "is empty" not in verified.output, verified.output
    with aot.Cache(cache_dir) as cache:
        assert cache.blobs.has(orphan)  # young: gc leaves it


def test_gc_older_than_keeps_recent_entries(invoke: Invoke, warmed) -> None:
    assert invoke("gc", "--older-than", "30d").stdout.startswith("nothing to collect")


@pytest.mark.parametrize(
    "option,value,message",
    [
        ("--max-size", "10Q", "cannot read size '10Q'; expected e.g. 500M, 10G or a byte count"),
        ("--older-than", "yesterday", "cannot read age 'yesterday'; expected e.g. 45s, 15min, 12h, 30d, 2w or 1mo (30 days)"),
        ("--older-than", "1m", "age '1m' is ambiguous: 'm' could mean minutes or months; write 1min for 1 minute(s) or 1mo for 1 x 30 days"),
        ("--older-than", "3y", "cannot read age '3y': unknown unit 'y'; expected e.g. 45s, 15min"),
        ("--older-than", "99999999999d", "age '99999999999d' is too large: the largest accepted age is 36500d"),
    ],
)
def test_gc_bad_values_are_usage_errors(invoke: Invoke, option: str, value: str, message: str) -> None:
    line = one_line_error(invoke("gc", option, value), code=2)
    assert message in line


def test_gc_on_a_read_only_cache(invoke: Invoke, warmed, cache_dir) -> None:
    assert invoke("--read-only", "gc", "--max-size", "1", "--dry-run").exit_code == 0
    line = one_line_error(invoke("--read-only", "gc", "--max-size", "1"))
    assert line.startswith(f"Error: cannot collect garbage: the cache at {cache_dir} is read-only")


# ---------------------------------------------------------------- bundles


def test_bundle_export_and_import(invoke: Invoke, warmed, tmp_path: Path) -> None:
    bundle = tmp_path / "mlp.aotb"
    result = invoke("bundle", "export", bundle, "mlp.*", "tiny")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"exported 4 entries to {bundle} (")
    other = tmp_path / "other"
    imported = invoke("bundle", "import", bundle, cache=other)
    assert imported.exit_code == 0, imported.output
    assert imported.stdout == f"imported 4 entries from {bundle} (0 already present)\nrefs: 4 set\n"
    again = json.loads(invoke("bundle", "import", bundle, "--json", cache=other).stdout)
    assert set(again) == BUNDLE_KEYS
    assert len(again["entries"]) == 4 and again["imported"] == [] and len(again["skipped"]) == 4
    names = [e["name"] for e in json.loads(invoke("ls", "--json", cache=other).stdout)["entries"]]
    assert names == ["mlp.forward"] * 3 + ["tiny"]
    exported = json.loads(invoke("bundle", "export", tmp_path / "all.aotb", "--json").stdout)
    assert set(exported) == BUNDLE_KEYS and len(exported["entries"]) == 5 and exported["bytes"] > 0


def test_bundle_errors(invoke: Invoke, warmed, tmp_path: Path, cache_dir) -> None:
    line = one_line_error(invoke("bundle", "export", tmp_path / "x.aotb", "nothing*"))
    assert line.startswith("Error: nothing to export: no intact entry matches ['nothing*']")
    not_a_bundle = tmp_path / "not.aotb"
    not_a_bundle.write_bytes(b"hello")
    line = one_line_error(invoke("bundle", "import", not_a_bundle))
    assert line == f"Error: {not_a_bundle} is not a jax-aot bundle (bad magic)"
    invoke("bundle", "export", tmp_path / "ok.aotb")
    line = one_line_error(invoke("--read-only", "bundle", "import", tmp_path / "ok.aotb"))
    assert line.startswith(f"Error: cannot import a bundle: the cache at {cache_dir} is read-only")


# ---------------------------------------------------------------- the cache location


def test_unreachable_database_is_one_line(invoke: Invoke) -> None:
    url = "postgresql+psycopg://someone:secret@127.0.0.1:1/aot"
    line = one_line_error(invoke("ls", cache=url))
    assert line.startswith("Error: cannot open the cache index at postgresql+psycopg://someone:***@127.0.0.1:1/aot")
    assert "secret" not in line


def test_unsupported_url_is_one_line(invoke: Invoke) -> None:
    line = one_line_error(invoke("ls", cache="mysql://localhost/aot"))
    assert line.startswith("Error: ")


def test_cache_path_that_is_a_file(invoke: Invoke, tmp_path: Path) -> None:
    path = tmp_path / "a-file"
    path.write_text("x")
    line = one_line_error(invoke("ls", cache=path))
    assert line.startswith("Error: ")
