"""aot warmup: the fixtures manifest, partial failures, progress, bad manifests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import MANIFEST, MANIFEST_LABELS, Invoke, one_line_error

REPORT_KEYS = {"cache", "jobs", "total", "compiled", "hit", "failed", "seconds", "ok", "results"}
RESULT_KEYS = {
    "name", "label", "status", "key", "signature", "seconds", "compile_seconds", "raw_size",
    "stored_size", "error", "source",
}


def write(tmp_path: Path, text: str, name: str = "manifest.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_warmup_compiles_then_hits(invoke: Invoke) -> None:
    first = invoke("warmup", MANIFEST)
    assert first.exit_code == 0, first.output
    lines = first.stdout.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == ["compiled"] * 5
    assert [line.split()[1] for line in lines[:-1]] == MANIFEST_LABELS
    assert "tiny (f32[8], f32[8])" in first.stdout
    assert lines[-1].startswith("5 entries: 5 compiled, 0 hit, 0 failed in ")
    second = invoke("warmup", str(MANIFEST))
    assert second.exit_code == 0, second.output
    assert second.stdout.splitlines()[-1].startswith("5 entries: 0 compiled, 5 hit, 0 failed in ")
    listed = json.loads(invoke("ls", "--json").stdout)
    assert sorted(e["name"] for e in listed["entries"]) == ["allreduce"] + ["mlp.forward"] * 3 + ["tiny"]


def test_warmup_json_report(invoke: Invoke, warmed, cache_dir) -> None:
    result = invoke("warmup", MANIFEST, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report) == REPORT_KEYS
    assert (report["total"], report["compiled"], report["hit"], report["failed"]) == (5, 0, 5, 0)
    assert report["ok"] is True and report["jobs"] == 1 and report["cache"] == str(cache_dir)
    assert [r["label"] for r in report["results"]] == MANIFEST_LABELS
    for r in report["results"]:
        assert set(r) == RESULT_KEYS
        assert r["status"] == "hit" and len(r["key"]) == 64 and r["error"] is None
    assert report["results"][0]["source"].endswith("fixtures/warmup.toml:17")


def test_warmup_tries_every_entry_and_names_failures(invoke: Invoke, tmp_path: Path) -> None:
    manifest = write(tmp_path, """
[[function]]
name = "broken"
target = "cli_models:broken"
args = ["f32[{n}]"]
vary = { n = [1, 2] }

[[function]]
name = "missing"
target = "no_such_module_anywhere:f"
args = ["f32[8]"]

[[function]]
name = "tiny"
target = "fixtures.models:tiny"
args = ["f32[8]", "f32[8]"]
""")
    result = invoke("warmup", manifest)
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines() == [
        "FAILED    broken[n=1]: ValueError: this model is broken",
        "FAILED    broken[n=2]: ValueError: this model is broken",
        "FAILED    missing: cannot import 'no_such_module_anywhere' for 'no_such_module_anywhere:f': "
        "no module named 'no_such_module_anywhere'; run from the folder that contains it, or install it",
        result.stdout.splitlines()[3],
        result.stdout.splitlines()[4],
    ]
    assert result.stdout.splitlines()[3].startswith("compiled  tiny (f32[8], f32[8]) ")
    assert result.stdout.splitlines()[4].startswith("4 entries: 1 compiled, 0 hit, 3 failed in ")
    assert f"failed: broken[n=1] ({manifest}:2): ValueError: this model is broken" in result.stderr
    assert f"failed: missing ({manifest}:8): cannot import" in result.stderr
    report = json.loads(invoke("warmup", manifest, "--json").stdout)
    assert (report["compiled"], report["hit"], report["failed"], report["ok"]) == (0, 1, 3, False)


def test_warmup_progress_bar_on_a_terminal(invoke: Invoke, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("aot.cli.warmup._stdout_is_tty", lambda: True)
    result = invoke("warmup", MANIFEST)
    assert result.exit_code == 0, result.output
    assert "warmup (1 job)" in result.stdout
    assert "compiled  " not in result.stdout  # no per-entry lines under a progress bar
    assert result.stdout.splitlines()[-1].startswith("5 entries: 5 compiled, 0 hit, 0 failed in ")


@pytest.mark.parametrize(
    "text,message",
    [
        ('[[function]]\nname = "x"\ntarget = fixtures.models:tiny\n', "{path}:3: invalid TOML: Invalid value"),
        ('\n\n[[function]]\nname = "x"\ntarget = "fixtures.models:tiny"\narg = ["f32[8]"]\n',
         "{path}:3: [[function]] #1 ('x'): unknown key(s) ['arg']"),
        ('[[function]]\ntarget = "fixtures.models:tiny"\nargs = ["f32[8]"]\n'
         '[[function]]\nname = "y"\ntarget = "tiny"\n',
         "{path}:4: [[function]] #2 ('y'): 'target' must be 'MODULE:ATTRIBUTE'"),
        ('[[function]]\nname = "x"\ntarget = "m:f"\nargs = ["f32[{b}]"]\n',
         "{path}:1: [[function]] #1 ('x'): placeholder(s) ['{b}'] have no values in 'vary'"),
        ('[[function]]\nname = "x"\ntarget = "m:f"\nargs = ["f32[8]"]\nvary = { b = [1, 2] }\n',
         "{path}:1: [[function]] #1 ('x'): vary key(s) ['b'] are not used"),
        ('[[function]]\nname = "x"\ntarget = "m:f"\nargs = ["f32[{b}]"]\nvary = { b = [] }\n',
         "{path}:1: [[function]] #1 ('x'): vary.b must be a non-empty list"),
        ('[[function]]\nname = "x"\ntarget = "m:f"\nargs = "f32[8]"\n',
         "{path}:1: [[function]] #1 ('x'): 'args' must be a list of spec strings"),
        ('[[function]]\nname = "x"\ntarget = "m:f"\nmesh = "data=two"\n',
         "{path}:1: [[function]] #1 ('x'): malformed mesh 'data=two'"),
        ('[[function]]\nname = "x"\ntarget = "m:f"\npmap = "i"\nkwargs = { y = "f32[8]" }\n',
         "{path}:1: [[function]] #1 ('x'): pmap entries take positional args only; remove kwargs"),
        ('[[function]]\nname = "x"\ntarget = "m:f"\ndonate = [-1]\n',
         "{path}:1: [[function]] #1 ('x'): 'donate' must be a list of argument indices"),
        ('[functions]\nname = "x"\n', "{path}: unknown top-level key(s) ['functions']"),
        ('# nothing\n', "{path}: no [[function]] tables; nothing to compile"),
    ],
)
def test_bad_manifest_is_one_line(invoke: Invoke, tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    line = one_line_error(invoke("warmup", path))
    assert line.startswith("Error: " + message.replace("{path}", str(path))), line


def test_missing_manifest_file(invoke: Invoke, tmp_path: Path) -> None:
    line = one_line_error(invoke("warmup", tmp_path / "nope.toml"))
    assert line == f"Error: {tmp_path / 'nope.toml'}: no such manifest file"


def test_warmup_into_a_read_only_cache(invoke: Invoke, warmed, cache_dir) -> None:
    line = one_line_error(invoke("--read-only", "warmup", MANIFEST))
    assert line.startswith(f"Error: cannot warm up the cache at {cache_dir}: it is opened read-only")


def test_warmup_read_only_cache_that_does_not_exist(invoke: Invoke, cache_dir) -> None:
    line = one_line_error(invoke("--read-only", "warmup", MANIFEST))
    assert line.startswith(f"Error: no cache at {cache_dir} (opened read-only")


def test_warmup_jobs_must_be_positive(invoke: Invoke) -> None:
    result = invoke("warmup", MANIFEST, "--jobs", "0")
    assert result.exit_code == 2
    assert "Invalid value for '-j' / '--jobs'" in result.output
