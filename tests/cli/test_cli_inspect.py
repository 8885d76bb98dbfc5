"""aot ls, aot show, aot doctor."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import jax
import jaxlib
import pytest

import aot
from aot.cache.index.entry import SCHEMA_VERSION
from aot.cache.index.refs import RefOrigin
from tests.aot.test_targets import needs_libtpu
from tests.cli.helpers import Invoke, one_line_error, store_for_another_environment

ENTRY_KEYS = {
    "key", "name", "program_fp", "env_fp", "signature", "platform", "exe_digest", "hlo_digest",
    "raw_size", "stored_size", "compile_seconds", "created_at", "last_used_at", "hits", "state",
    "state_reason", "manifest_digest", "const_digest",
}
LS_ENTRY_KEYS = ENTRY_KEYS | {"arguments", "statics", "this_environment", "environment_differences", "superseded_by",
                                 "served", "served_by", "releases", "kind", "target", "jax", "jaxlib"}
SHOW_KEYS = {
    "entry", "manifest", "manifest_error", "this_environment", "environment_differences", "hlo",
    "arguments", "superseded_by", "statics", "served", "served_by", "releases", "target",
}


def test_ls_without_a_cache_creates_nothing(invoke: Invoke, cache_dir) -> None:
    for command in (["ls"], ["show", "tiny"], ["verify"], ["gc", "--dry-run"], ["why", "x"], ["rm", "x"]):
        line = one_line_error(invoke(*command))
        assert line == (
            f"Error: no cache at {cache_dir} (nothing was compiled into it yet: aot compile, aot "
            "warmup and aot bundle import create one); check --cache, AOT_CACHE or [tool.aot] "
            "(the location came from flag --cache)"
        ), line
    assert not cache_dir.exists()


def test_ls_empty(invoke: Invoke, cache_dir) -> None:
    aot.Cache(cache_dir).close()
    result = invoke("ls")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"no entries in the cache at {cache_dir}\n"
    assert json.loads(invoke("ls", "--json").stdout) == {
        "cache": str(cache_dir), "env": "all", "count": 0, "entries": [],
    }


def test_ls_table(invoke: Invoke, warmed) -> None:
    result = invoke("ls")  # not a terminal, no COLUMNS: signatures folded to 72 characters, as warmup does
    assert result.exit_code == 0, result.output
    header, *rows, footer = result.stdout.splitlines()
    assert header.split() == [
        "KEY", "NAME", "SIGNATURE", "ENV", "TARGET", "SIZE", "COMPILED", "LAST", "USED", "HITS", "STATE", "SERVED",
    ]
    assert [row.split()[1] for row in rows] == ["allreduce"] + ["mlp.forward"] * 3 + ["tiny"]
    # The warm-up declared each entry it compiled: each is served by its ref.
    assert all(row.split()[-2:] == ["ok", "ref"] for row in rows)
    # Each argument by name, pytrees as trees.
    assert "  x: f32[8,1024]  " in rows[0]
    assert "  params: [{2 arrays}, {2 arrays}, {2 arrays}], x: f32[1,784]   this  " in rows[1]
    assert "  x: f32[8], y: f32[8]  " in rows[4]
    assert footer.startswith("5 entries, ") and footer.endswith(" stored")


@pytest.mark.parametrize(
    "columns,mlp_signature",
    [
        (188, "params: [{2 arrays}, {2 arrays}, {2 arrays}], x: f32[8,784]"),  # TARGET (cpu x8) takes 8
        (148, "params: [6 arrays], x: f32[8,784]"),
        (108, "..., x: f32[8,784]"),
    ],
)
def test_ls_folds_signatures_to_the_terminal_width(
    invoke: Invoke, warmed, columns: int, mlp_signature: str
) -> None:
    result = invoke("ls", "mlp.*", env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    rows = result.stdout.splitlines()[1:-1]
    assert f"  {mlp_signature}  " in rows[1]
    # Inner levels fold first; the batch argument stays visible. (The signature column
    # is never narrower than 24 characters: a 100-column terminal overflows a little.)
    if columns >= 148:
        assert max(len(row) for row in rows) <= columns


def test_ls_env_column_and_filter(invoke: Invoke, warmed, cache_dir) -> None:
    key = store_for_another_environment(cache_dir, "tiny", device_count="4", xla_flags="--xla_foo")
    rows = invoke("ls", "tiny").stdout.splitlines()
    (foreign,) = [row for row in rows if row.startswith(key[:12])]
    (local,) = [row for row in rows if row.startswith("tiny") is False and key[:12] not in row and "tiny" in row]
    # The most telling part that differs, with its stored value, and how many more.
    assert "  device_count 4 +1  " in foreign
    assert "  this  " in local
    assert rows[-1].endswith("; 1 for other environments (--env this hides them)")
    only_here = invoke("ls", "tiny", "--env", "this").stdout
    assert key[:12] not in only_here and only_here.splitlines()[-1].startswith("1 entry, ")
    data = json.loads(invoke("ls", "tiny", "--json").stdout)
    by_key = {e["key"]: e for e in data["entries"]}
    assert by_key[key]["this_environment"] is False
    assert by_key[key]["environment_differences"] == [
        {"part": "device_count", "expected": "4", "actual": "8"},
        {"part": "xla_flags", "expected": "--xla_foo", "actual": ""},
    ]
    assert json.loads(invoke("ls", "--env", "this", "--json").stdout)["count"] == 5
    bad = invoke("ls", "--env", "mine")
    assert bad.exit_code == 2 and "'mine' is not one of 'this', 'all'" in bad.output


def test_ls_glob_and_json(invoke: Invoke, warmed, cache_dir) -> None:
    result = invoke("ls", "mlp.*", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["cache"] == str(cache_dir) and data["count"] == 3
    for entry in data["entries"]:
        assert set(entry) == LS_ENTRY_KEYS
        assert entry["this_environment"] is True and entry["superseded_by"] is None
        assert (entry["jax"], entry["jaxlib"]) == (jax.__version__, jaxlib.__version__)
        assert entry["arguments"][0] == {"path": "params[0]['b']", "aval": "f32[512]"}
        assert entry["arguments"][-1]["path"] == "x"
        assert entry["name"] == "mlp.forward" and entry["state"] == "ok" and entry["platform"] == "cpu"
    assert sorted(e["signature"].rsplit(", ", 1)[1] for e in data["entries"]) == [
        "f32[1,784]", "f32[32,784]", "f32[8,784]",
    ]
    assert invoke("ls", "nothing*").stdout == f"no entries matching 'nothing*' in the cache at {cache_dir}\n"


def test_show_by_name_and_key_prefix(invoke: Invoke, warmed) -> None:
    result = invoke("show", "tiny")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "tiny (x: f32[8], y: f32[8])"
    key = lines[1].split()[-1]
    text = result.stdout
    for expected in (
        "  state        ok", "  kind         aot (mesh program)", "  environment  this one",
        "arguments\n  x  f32[8]\n  y  f32[8]\n",
        "program fingerprint ", "  stablehlo ", "  in_avals ", "environment fingerprint ",
        "  jaxlib ", "  device_count      8", "cost analysis", "  flops ", "memory analysis",
        "  argument_size_in_bytes ",
    ):
        assert expected in text, expected
    by_key = invoke("show", key[:10])
    assert by_key.exit_code == 0 and by_key.stdout == result.stdout
    several = invoke("show", "mlp.forward")
    assert several.stdout.count("\nprogram fingerprint ") == 3
    assert "arguments\n  params[0]['b']  f32[512]\n  params[0]['w']  f32[784,512]\n" in several.stdout


def test_show_json(invoke: Invoke, warmed) -> None:
    data = json.loads(invoke("show", "allreduce", "--json").stdout)
    (entry,) = data["entries"]
    assert set(entry) == SHOW_KEYS
    assert entry["this_environment"] is True and entry["environment_differences"] == []
    assert entry["hlo"] is None and entry["manifest_error"] is None
    assert set(entry["entry"]) == ENTRY_KEYS
    assert entry["arguments"] == [{"path": "x", "aval": "f32[8,1024]"}]
    assert entry["superseded_by"] is None
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


def test_show_a_short_prefix_lists_the_candidates(invoke: Invoke, warmed) -> None:
    keys = {e["key"]: e["name"] for e in json.loads(invoke("ls", "--json").stdout)["entries"]}
    key = sorted(keys)[0]
    line = one_line_error(invoke("show", key[:2]))
    candidates = [k for k in sorted(keys) if k.startswith(key[:2])]
    assert line == (
        f"Error: no entry named '{key[:2]}', and '{key[:2]}' is too short for a key prefix "
        "(give at least 4 hex digits); keys starting with it: "
        + ", ".join(f"{k[:12]} ({keys[k]})" for k in candidates)
    )
    assert invoke("show", key[:4]).exit_code == 0


def test_show_a_mistyped_name_suggests_close_ones(invoke: Invoke, warmed, cache_dir) -> None:
    line = one_line_error(invoke("show", "mlp.froward"))
    assert line == (
        f"Error: no entry named 'mlp.froward' and no key starting with it in the cache at "
        f"{cache_dir} (did you mean 'mlp.forward'?); `aot ls` lists what is stored"
    )


def test_show_a_foreign_entry_names_the_differences(invoke: Invoke, warmed) -> None:
    """An entry from another environment (here: its manifest says 4 devices)."""
    key = store_for_another_environment(warmed, "tiny", device_count="4")
    data = json.loads(invoke("show", key, "--json").stdout)["entries"][0]
    assert data["this_environment"] is False
    assert data["environment_differences"] == [{"part": "device_count", "expected": "4", "actual": "8"}]
    assert "  environment  another one: device_count 4 != 8" in invoke("show", key).stdout


def _two_programs_one_signature(invoke: Invoke) -> tuple[str, str]:
    """``affine`` compiled twice for the same signature, the function changed between."""
    base = ("compile", "tests.cli.models:affine", "--name", "affine", "--arg", "f32[8]", "--kwarg", "bias=f32[8]", "--json")
    old = json.loads(invoke(*base).stdout)["key"]
    # (a static value would be another signature, not another version of this one)
    new = json.loads(invoke(*[a.replace(":affine", ":affine_v2") for a in base]).stdout)["key"]
    assert old != new
    return old, new


def test_superseded_entries_are_marked_and_gc_removes_them(invoke: Invoke, cache_dir) -> None:  # noqa: ANN001
    old, new = _two_programs_one_signature(invoke)
    rows = invoke("ls").stdout.splitlines()
    (old_row,) = [r for r in rows if r.startswith(old[:12])]
    (new_row,) = [r for r in rows if r.startswith(new[:12])]
    # The second compile declared its program: the ref names it.
    assert old_row.endswith("  superseded  -") and new_row.split()[-2:] == ["ok", "ref"]
    assert rows[-1].endswith("; 1 superseded (aot gc --superseded removes them)")
    data = {e["key"]: e for e in json.loads(invoke("ls", "--json").stdout)["entries"]}
    assert data[old]["superseded_by"] == new and data[new]["superseded_by"] is None
    assert f"  state        superseded by {new[:12]} " in invoke("show", old).stdout
    assert "  state        ok; served (its ref names it)\n" in invoke("show", new).stdout
    # Without refs (a cache written before them), the newest entry of a signature serves.
    with aot.Cache(cache_dir) as cache:
        entry = cache.lookup(new)
        assert cache.index.drop_refs([(entry.name, entry.signature, entry.env_fp)]) == 1
    (new_row,) = [r for r in invoke("ls").stdout.splitlines() if r.startswith(new[:12])]
    assert new_row.split()[-2:] == ["ok", "newest"]
    assert "  state        ok; served (no ref: the newest entry of its signature)\n" in invoke("show", new).stdout
    # A ref back to the old program: it is served, the newer one superseded by it.
    with aot.Cache(cache_dir) as cache:
        cache.set_refs([cache.lookup(old)], RefOrigin("test"))
    data = {e["key"]: e for e in json.loads(invoke("ls", "--json").stdout)["entries"]}
    assert (data[old]["served_by"], data[old]["superseded_by"]) == ("ref", None)
    assert (data[new]["served"], data[new]["superseded_by"]) == (False, old)
    assert "  state        ok; served (its ref names it)\n" in invoke("show", old).stdout
    why = invoke("why", "affine", "--arg", "f32[8]", "--kwarg", "bias=f32[8]")
    assert why.exit_code == 0, why.output
    assert why.stdout.strip().endswith(f"hit, key {old[:12]} (served: its ref names it)")
    data = json.loads(invoke("why", "affine", "--arg", "f32[8]", "--kwarg", "bias=f32[8]", "--json").stdout)
    assert (data["served_key"], data["served_by"]) == (old, "ref")
    with aot.Cache(cache_dir) as cache:
        cache.set_refs([cache.lookup(new)], RefOrigin("test"))
    # Plain gc keeps it; --superseded removes only it.
    assert invoke("gc", "--dry-run", "--json").exit_code == 0
    assert json.loads(invoke("gc", "--dry-run", "--json").stdout)["entries"] == []
    plan = json.loads(invoke("gc", "--superseded", "--json").stdout)
    assert [(v["key"], v["reason"]) for v in plan["entries"]] == [(old, f"superseded by {new[:12]}")]
    assert [e["key"] for e in json.loads(invoke("ls", "--json").stdout)["entries"]] == [new]


def test_entries_of_other_environments_do_not_supersede(invoke: Invoke, warmed) -> None:
    store_for_another_environment(warmed, "tiny", device_count="4")
    assert "superseded" not in invoke("ls", "tiny").stdout


# ---------------------------------------------------------------- doctor

DOCTOR_KEYS = {"ok", "versions", "devices", "environment", "cache", "health", "settings", "local", "aging"}
DOCTOR_CACHE_KEYS = {
    "location", "index", "blobs", "schema_version", "supported_schema_version", "entries",
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
        f"  blobs     {cache_dir}/blobs\n",
        f"  schema    v{SCHEMA_VERSION} (this jax-aot supports up to v{SCHEMA_VERSION})",
        "  entries   5 (5 usable in this environment, 0 quarantined), ",
        "  health    ok: 5 entries, 10 blobs checked",
    ):
        assert expected in text, expected
    data = json.loads(invoke("doctor", "--json").stdout)
    assert set(data) == DOCTOR_KEYS and set(data["cache"]) == DOCTOR_CACHE_KEYS
    assert data["ok"] is True and data["devices"]["count"] == 8
    assert data["cache"]["entries"] == 5 and data["cache"]["schema_version"] == SCHEMA_VERSION
    # libtpu's version from its package metadata, without opening a device (issue 52).
    try:
        libtpu = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        libtpu = "not installed"
    assert data["versions"]["libtpu"] == libtpu and f"\n  libtpu      {libtpu}\n" in text, text
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


# ---------------------------------------------------------------- shell completion


def _complete(args: list[str], incomplete: str) -> list[str]:
    from click.shell_completion import ShellComplete

    from aot.cli.main import cli

    completer = ShellComplete(cli, {}, "aot", "_AOT_COMPLETE")
    return [item.value for item in completer.get_completions(args, incomplete)]


def test_completion_of_entry_names_and_manifests(warmed, cache_dir, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    assert _complete(["--cache", str(cache_dir), "show"], "ml") == ["mlp.forward"]
    assert _complete(["rm", "--cache", str(cache_dir)], "") == ["allreduce", "mlp.forward", "tiny"]
    assert _complete(["ls", "--cache", str(tmp_path / "none")], "") == []  # never an error
    (tmp_path / "manifests" / "__pycache__").mkdir(parents=True)  # as importing a module there makes
    (tmp_path / "manifests" / "ci.toml").write_text("")
    assert _complete(["warmup"], f"{tmp_path}/manifests/") == [f"{tmp_path}/manifests/ci.toml"]
    assert _complete(["warmup"], "fixtures/") == ["fixtures/gpu_target.toml", "fixtures/tpu_target.toml", "fixtures/warmup.toml"]
    assert _complete(["verify", "--manifest"], "fix") == ["fixtures/"]


_COMPLETE_IN_PROCESS = """
import sys
from aot.cli.common import State
from aot.cli.main import cli
try:
    cli.main(prog_name="aot", obj=State())
except SystemExit:
    pass
print("JAX-IMPORTED" if "jax" in sys.modules else "JAX-NOT-IMPORTED")
"""


def test_completing_a_name_imports_no_jax(warmed, cache_dir, tmp_path) -> None:  # noqa: ANN001
    # The shell runs `aot` on every TAB: importing JAX there made each TAB take seconds.
    env = {
        **os.environ, "_AOT_COMPLETE": "bash_complete", "COMP_WORDS": "aot show ",
        "COMP_CWORD": "2", "AOT_CACHE": str(cache_dir),
    }
    done = subprocess.run(
        [sys.executable, "-c", _COMPLETE_IN_PROCESS], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "plain,allreduce", "plain,mlp.forward", "plain,tiny", "JAX-NOT-IMPORTED",
    ]


# ---------------------------------------------------------------- issue 43: display


def _wide(x: object, params: dict) -> object:
    return x.sum() + sum(v.sum() for v in params.values())


def test_a_wide_pytree_is_folded_in_ls_and_show_headers(invoke: Invoke, cache_dir) -> None:
    """A 41-array params dict reads `params: {41 arrays}` in piped `ls` and in `show`'s
    first line, as in `aot warmup`; --json and show's argument list keep every leaf."""
    import jax
    import jax.numpy as jnp

    params = {f"layer_{i:02d}": jax.ShapeDtypeStruct((16, 16), jnp.float32) for i in range(41)}
    with aot.Cache(cache_dir) as cache:
        cache.compile(_wide, aot.spec("f32[8,16]"), params, name="wide")
        (entry,) = cache.entries("wide")
    (row,) = invoke("ls", "wide").stdout.splitlines()[1:-1]
    assert "  x: f32[8,16], params: {41 arrays}  this  " in row
    assert len(row) < 200, row
    (data,) = json.loads(invoke("ls", "wide", "--json").stdout)["entries"]
    assert len(data["arguments"]) == 42
    shown = invoke("show", "wide").stdout.splitlines()
    assert shown[0] == "wide (x: f32[8,16], params: {41 arrays})"
    assert "  params['layer_40']  f32[16,16]" in shown
    # E: an entry's repr is a line, not its 5 KB manifest.
    text = repr(entry)
    assert text.startswith(f"IndexEntry(key={entry.key[:12]!r}, name='wide', signature='f32[8,16], f32[16,16], ")
    assert "target='cpu x" in text and len(text) < 200, text


def test_target_names_from_environment_parts() -> None:
    from aot.targets import environment_name, target_name
    from tests.aot.test_targets import CHIP_PARTS

    assert target_name(CHIP_PARTS) == "tpu:v5e:1x1"  # what a v5e chip itself computes
    grid = ",".join(f"{i}@({x}, {y}, 0)/0" for i, (x, y) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]))
    assert target_name({**CHIP_PARTS, "device_count": "4", "topology": grid}) == "tpu:v5e:2x2"
    # A topology too long to store is a digest: the device count picks the grid.
    assert target_name({**CHIP_PARTS, "device_count": "256", "topology": "sha256:00"}) == "tpu:v5e:16x16"
    assert target_name({**CHIP_PARTS, "device_kind": "TPU v9"}) is None
    assert environment_name({"platform": "cpu", "device_kind": "cpu", "device_count": "8"}) == "cpu x8"
    assert environment_name({"platform": "gpu", "device_kind": "NVIDIA H100", "device_count": "8"}) == "gpu NVIDIA H100 x8"
    assert environment_name({**CHIP_PARTS, "device_kind": "TPU v9"}) == "tpu TPU v9 x1"


@needs_libtpu
def test_ls_and_show_name_each_entry_target(invoke: Invoke, cache_dir) -> None:
    """Deviceless 1x1 and 2x2 entries and a host entry of one function: TARGET in ls,
    `target` in --json and in show, so 1x1 and 2x2 no longer look the same."""
    import jax

    base = ("compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--name", "tiny")
    keys = {}
    for target in ("tpu:v5e:1x1", "tpu:v5e:2x2", None):
        result = invoke(*base, *(("--target", target) if target else ()), "--json")
        assert result.exit_code == 0, result.output
        keys[target] = json.loads(result.stdout)["key"]
    host = f"cpu x{jax.device_count()}"
    header, *rows, _ = invoke("ls", "tiny").stdout.splitlines()
    assert header.split()[3:5] == ["ENV", "TARGET"]
    by_key = {row[:12]: row for row in rows}
    for target in ("tpu:v5e:1x1", "tpu:v5e:2x2"):  # ENV says what differs, TARGET what it is for
        assert f"  {target}  " in by_key[keys[target][:12]]
    assert by_key[keys[None][:12]].split()[6:9] == ["this", *host.split()]
    targets = {e["key"]: e["target"] for e in json.loads(invoke("ls", "tiny", "--json").stdout)["entries"]}
    assert targets == {keys["tpu:v5e:1x1"]: "tpu:v5e:1x1", keys["tpu:v5e:2x2"]: "tpu:v5e:2x2", keys[None]: host}
    shown = invoke("show", keys["tpu:v5e:2x2"][:12]).stdout.splitlines()
    assert "  target       tpu:v5e:2x2" in shown
    (data,) = json.loads(invoke("show", keys["tpu:v5e:1x1"][:12], "--json").stdout)["entries"]
    assert data["target"] == "tpu:v5e:1x1"


@needs_libtpu
def test_show_of_a_tpu_entry_keeps_each_part_on_one_line(invoke: Invoke, cache_dir) -> None:  # noqa: ANN001
    """libtpu's platform version has several lines: shown as one (joined with '; '),
    and no cpu_isa difference for an entry of another platform."""
    compiled = invoke("compile", "fixtures.models:tiny", "--name", "tiny", "--arg", "f32[8]", "--arg", "f32[8]",
                      "--target", "tpu:v5e:1x1")
    assert compiled.exit_code == 0, compiled.output
    with aot.Cache(cache_dir) as cache:
        (entry,) = cache.entries("tiny")
        parts = cache.artifact(entry).manifest.environment.as_dict()
        here = cache.environment.as_dict()
    version = parts["platform_version"]
    assert "\n" in version  # what this test is about
    one_line = "; ".join(version.splitlines())
    shown = invoke("show", "tiny")
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert f"  platform_version  {one_line}" in lines
    (environment,) = [line for line in lines if line.startswith("  environment  ")]
    assert environment == (
        f"  environment  another one: device_count 1 != 8; device_kind TPU v5 lite != cpu; platform tpu != cpu; "
        f"platform_version {one_line[:77]}... != {here['platform_version']}; topology 0@(0, 0, 0)/0 != "
        f"{here['topology']}"
    )
    assert "cpu_isa" not in shown.stdout
    # --json keeps the value as it is.
    data = json.loads(invoke("show", "tiny", "--json").stdout)["entries"][0]
    assert data["manifest"]["environment"]["parts"]["platform_version"] == version
    assert "cpu_isa" not in {d["part"] for d in data["environment_differences"]}
