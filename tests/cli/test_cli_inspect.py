"""aot ls, aot show, aot doctor."""

from __future__ import annotations

import json

import aot
from aot.cache.entry import SCHEMA_VERSION
from conftest import MANIFEST_LABELS, Invoke, one_line_error

ENTRY_KEYS = {
    "key", "name", "program_fp", "env_fp", "signature", "platform", "exe_digest", "hlo_digest",
    "raw_size", "stored_size", "compile_seconds", "created_at", "last_used_at", "hits", "state",
    "state_reason",
}
SHOW_KEYS = {"entry", "manifest", "manifest_error", "this_environment", "environment_differences", "hlo"}


def test_ls_without_a_cache_creates_nothing(invoke: Invoke, cache_dir) -> None:
    for command in (["ls"], ["show", "tiny"], ["verify"], ["gc", "--dry-run"], ["why", "x"]):
        line = one_line_error(invoke(*command))
        assert line.startswith(f"Error: no cache at {cache_dir}: nothing was compiled into it yet"), line
    assert not cache_dir.exists()


def test_ls_empty(invoke: Invoke, cache_dir) -> None:
    aot.Cache(cache_dir).close()
    result = invoke("ls")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"no entries in the cache at {cache_dir}\n"
    assert json.loads(invoke("ls", "--json").stdout) == {"cache": str(cache_dir), "count": 0, "entries": []}


def test_ls_table(invoke: Invoke, warmed) -> None:
    result = invoke("ls")
    assert result.exit_code == 0, result.output
    header, *rows, footer = result.stdout.splitlines()
    assert header.split() == [
        "KEY", "NAME", "SIGNATURE", "PLATFORM", "SIZE", "COMPILED", "LAST", "USED", "HITS", "STATE",
    ]
    assert [row.split()[1] for row in rows] == ["allreduce"] + ["mlp.forward"] * 3 + ["tiny"]
    assert all(row.split()[-1] == "ok" and " cpu " in row for row in rows)
    # Long signatures keep both ends: the batch dimension stays visible.
    assert "f32[512], f32[784,512], f32 ... " in rows[1] and rows[1].count("f32[") >= 4
    assert any("f32[32,784]" in row for row in rows)
    assert footer.startswith("5 entries, ") and footer.endswith(" stored")


def test_ls_glob_and_json(invoke: Invoke, warmed, cache_dir) -> None:
    result = invoke("ls", "mlp.*", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["cache"] == str(cache_dir) and data["count"] == 3
    for entry in data["entries"]:
        assert set(entry) == ENTRY_KEYS
        assert entry["name"] == "mlp.forward" and entry["state"] == "ok" and entry["platform"] == "cpu"
    assert sorted(e["signature"].rsplit(", ", 1)[1] for e in data["entries"]) == [
        "f32[1,784]", "f32[32,784]", "f32[8,784]",
    ]
    assert invoke("ls", "nothing*").stdout == f"no entries matching 'nothing*' in the cache at {cache_dir}\n"


def test_show_by_name_and_key_prefix(invoke: Invoke, warmed) -> None:
    result = invoke("show", "tiny")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "tiny (f32[8], f32[8])"
    key = lines[1].split()[-1]
    text = result.stdout
    for expected in (
        "  state        ok", "  kind         jit", "  environment  this one",
        "program fingerprint ", "  stablehlo ", "  in_avals ", "environment fingerprint ",
        "  jaxlib ", "  device_count      8", "cost analysis", "  flops ", "memory analysis",
        "  argument_size_in_bytes ",
    ):
        assert expected in text, expected
    by_key = invoke("show", key[:10])
    assert by_key.exit_code == 0 and by_key.stdout == result.stdout
    several = invoke("show", "mlp.forward")
    assert several.stdout.count("\nprogram fingerprint ") == 3


def test_show_json(invoke: Invoke, warmed) -> None:
    data = json.loads(invoke("show", "allreduce", "--json").stdout)
    (entry,) = data["entries"]
    assert set(entry) == SHOW_KEYS
    assert entry["this_environment"] is True and entry["environment_differences"] == []
    assert entry["hlo"] is None and entry["manifest_error"] is None
    assert set(entry["entry"]) == ENTRY_KEYS
    manifest = entry["manifest"]
    assert manifest["name"] == "allreduce" and manifest["kind"] == "pmap"
    assert manifest["program"]["parts"]["in_avals"] == "f32[8,1024]"
    assert manifest["environment"]["parts"]["device_count"] == "8"
    assert manifest["memory_analysis"]["argument_size_in_bytes"] > 0


def test_show_hlo(invoke: Invoke, warmed) -> None:
    result = invoke("show", "tiny", "--hlo")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("module @")
    assert "func.func public @main(" in result.stdout and "stablehlo.multiply" in result.stdout
    assert "loc(" not in result.stdout
    with_locations = invoke("show", "tiny", "--hlo", "--debug-info")
    assert "loc(" in with_locations.stdout
    data = json.loads(invoke("show", "tiny", "--hlo", "--json").stdout)
    assert "stablehlo.multiply" in data["entries"][0]["hlo"]


def test_show_unknown(invoke: Invoke, warmed, cache_dir) -> None:
    line = one_line_error(invoke("show", "nothing.here"))
    assert line == (
        f"Error: no entry named 'nothing.here' and no key starting with it in the cache at "
        f"{cache_dir}; `aot ls` lists what is stored"
    )


def test_show_a_foreign_entry_names_the_differences(invoke: Invoke, warmed) -> None:
    """An entry from another environment (here: its manifest says 4 devices)."""
    from aot.artifact import Artifact
    from aot.fingerprint import Fingerprint, combined_key

    cache = aot.Cache(warmed)
    artifact = cache.artifact(cache.entries("tiny")[0])
    manifest = artifact.manifest
    parts = manifest.environment.as_dict() | {"device_count": "4"}
    environment = Fingerprint.of("environment", parts)
    from dataclasses import replace

    foreign = replace(manifest, environment=environment, key=combined_key(manifest.program, environment))
    cache.put_artifact(Artifact(foreign, artifact.blobs))
    data = json.loads(invoke("show", foreign.key, "--json").stdout)["entries"][0]
    assert data["this_environment"] is False
    assert data["environment_differences"] == [{"part": "device_count", "expected": "4", "actual": "8"}]
    assert "  environment  another one: device_count 4 != 8" in invoke("show", foreign.key).stdout


# ---------------------------------------------------------------- doctor

DOCTOR_KEYS = {"ok", "versions", "devices", "environment", "cache", "health"}
DOCTOR_CACHE_KEYS = {
    "location", "index", "schema_version", "supported_schema_version", "entries",
    "entries_this_environment", "quarantined", "stored_bytes", "error", "problems",
}


def test_doctor(invoke: Invoke, warmed, cache_dir) -> None:
    result = invoke("doctor")
    assert result.exit_code == 0, result.output
    text = result.stdout
    for expected in (
        "versions\n", "  jax ", "  jaxlib ", "  jax-aot ", "  python ", "devices\n",
        "  platform  cpu (cpu)", "  devices   8 (8 local)", "environment ", "  cpu_isa ",
        f"  location  {cache_dir}", f"  index     sqlite:///{cache_dir}/index.sqlite",
        f"  schema    v{SCHEMA_VERSION} (this jax-aot supports up to v{SCHEMA_VERSION})",
        "  entries   5 (5 usable in this environment, 0 quarantined), ",
        "  health    ok: 5 entries, 10 blobs checked",
    ):
        assert expected in text, expected
    data = json.loads(invoke("doctor", "--json").stdout)
    assert set(data) == DOCTOR_KEYS and set(data["cache"]) == DOCTOR_CACHE_KEYS
    assert data["ok"] is True and data["devices"]["count"] == 8
    assert data["cache"]["entries"] == 5 and data["cache"]["schema_version"] == SCHEMA_VERSION
    assert data["health"]["ok"] is True
    assert len(data["environment"]["digest"]) == 64


def test_doctor_reports_a_cache_it_cannot_open(invoke: Invoke, cache_dir) -> None:
    result = invoke("doctor")
    assert result.exit_code == 1
    assert "  platform  cpu (cpu)" in result.stdout  # still shows the host
    assert f"  error     no cache at {cache_dir}" in result.stdout
    assert not cache_dir.exists()  # doctor never creates a cache
    data = json.loads(invoke("doctor", "--json", "--no-verify").stdout)
    assert data["ok"] is False and data["cache"]["error"].startswith("no cache at ")


def test_doctor_masks_a_database_password(invoke: Invoke) -> None:
    url = "postgresql+psycopg://someone:secret@127.0.0.1:1/aot"
    result = invoke("doctor", "--json", cache=url)
    assert result.exit_code == 1
    assert "secret" not in result.output
    data = json.loads(result.stdout)
    assert data["cache"]["location"] == "postgresql+psycopg://someone:***@127.0.0.1:1/aot"
    assert data["cache"]["error"].startswith("cannot open the cache index at ")
