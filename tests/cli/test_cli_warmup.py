"""aot warmup: the fixtures manifest, partial failures, progress, bad manifests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli.helpers import MANIFEST, MANIFEST_LABELS, Invoke, one_line_error

REPORT_KEYS = {
    "cache", "jobs", "shard", "total", "compiled", "hit", "waited", "failed", "seconds", "ok", "results",
    "release", "carried", "refresh_release", "refreshed_exports",
}
RESULT_KEYS = {
    "name", "label", "status", "key", "signature", "seconds", "compile_seconds", "raw_size",
    "stored_size", "error", "source", "arguments", "lowered", "waited", "traceback",
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
    assert "\ncompiled  tiny (x: f32[8], y: f32[8]) " in first.stdout
    assert first.stdout.startswith(
        "compiled  mlp.forward[batch=1] (params: [{2 arrays}, {2 arrays}, {2 arrays}], x: f32[1,784]) "
    )
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
    assert (report["refresh_release"], report["refreshed_exports"]) == (None, [])  # no --refresh-exports
    assert [r["label"] for r in report["results"]] == MANIFEST_LABELS
    for r in report["results"]:
        assert set(r) == RESULT_KEYS
        assert r["status"] == "hit" and len(r["key"]) == 64 and r["error"] is None
        assert r["traceback"] is None
        assert r["lowered"] is True  # every warm-up lowers
    assert report["results"][3]["arguments"] == [{"path": "x", "aval": "f32[8]"}, {"path": "y", "aval": "f32[8]"}]
    assert report["results"][0]["source"].endswith("fixtures/warmup.toml:17")


def test_warmup_tries_every_entry_and_names_failures(invoke: Invoke, tmp_path: Path) -> None:
    manifest = write(tmp_path, """
[[function]]
name = "broken"
function = "tests.cli.models:broken"
args = ["f32[{n}]"]
vary = { n = [1, 2] }

[[function]]
name = "missing"
function = "no_such_module_anywhere:f"
args = ["f32[8]"]

[[function]]
name = "tiny"
function = "fixtures.models:tiny"
args = ["f32[8]", "f32[8]"]
""")
    result = invoke("warmup", manifest)
    assert result.exit_code == 1, result.output
    broken_lines = [
        "second line of the message",
        '  at tests/cli/models.py:39 in broken: raise ValueError("this model is broken\\nsecond line of the message")',
    ]
    lines = result.stdout.splitlines()
    assert lines[:7] == [
        "FAILED    broken[n=1]: ValueError: this model is broken",
        *(" " * 10 + line for line in broken_lines),
        "FAILED    broken[n=2]: ValueError: this model is broken",
        *(" " * 10 + line for line in broken_lines),
        "FAILED    missing: cannot import 'no_such_module_anywhere' for 'no_such_module_anywhere:f': "
        "no module named 'no_such_module_anywhere'; run from the folder that contains it, or install it",
    ]
    assert lines[7].startswith("compiled  tiny (x: f32[8], y: f32[8]) ")
    assert lines[8].startswith("4 entries: 1 compiled, 0 hit, 3 failed in ")
    assert len(lines) == 9
    assert f"failed: broken[n=1] ({manifest}:2): ValueError: this model is broken\n" in result.stderr
    assert "Traceback" not in result.output  # without --debug
    assert f"failed: missing ({manifest}:8): cannot import" in result.stderr
    report = json.loads(invoke("warmup", manifest, "--json").stdout)
    assert (report["compiled"], report["hit"], report["failed"], report["ok"]) == (0, 1, 3, False)


def test_warmup_debug_prints_the_traceback_of_a_failed_entry(invoke: Invoke, tmp_path: Path) -> None:
    manifest = write(tmp_path, '[[function]]\nname = "broken"\nfunction = "tests.cli.models:broken"\nargs = ["f32[8]"]\n')
    result = invoke("warmup", manifest, "--debug")
    assert result.exit_code == 1
    assert "traceback of broken:\nTraceback (most recent call last):\n" in result.stderr
    assert 'tests/cli/models.py", line 39, in broken' in result.stderr
    assert "\nValueError: this model is broken\nsecond line of the message\n" in result.stderr


def _terminal(monkeypatch: pytest.MonkeyPatch, stdout: bool, stderr: bool) -> None:
    monkeypatch.setattr("aot.cli.warmup.stdout_is_tty", lambda: stdout)
    monkeypatch.setattr("aot.cli.warmup.stderr_is_tty", lambda: stderr)


def test_warmup_progress_on_a_terminal(invoke: Invoke, monkeypatch: pytest.MonkeyPatch) -> None:
    _terminal(monkeypatch, stdout=True, stderr=True)
    monkeypatch.setattr("aot.cli.progress.Progress.TICK_SECONDS", 3600.0)  # one frame per entry here
    result = invoke("warmup", MANIFEST)
    assert result.exit_code == 0, result.output
    assert "compiled  " not in result.stdout  # no per-entry lines under a progress bar
    assert result.stdout.splitlines() == [result.stdout.splitlines()[0]]
    assert result.stdout.startswith("5 entries: 5 compiled, 0 hit, 0 failed in ")
    frames = result.stderr.split("\r")
    assert frames[1].startswith("warmup (1 job) [------------------------] 0/5")
    assert re.match(r"warmup \(1 job\) \[####--------------------\] 1/5, 0:\d\d elapsed, ETA ", frames[2]), frames[2]
    assert frames[2].rstrip().endswith("  mlp.forward[batch=1]")
    assert re.match(r"warmup \(1 job\) \[########################\] 5/5, 0:\d\d elapsed  allreduce", frames[-1])
    assert result.stderr.endswith("\n")


def test_warmup_json_with_progress_on_stderr(invoke: Invoke, warmed, monkeypatch: pytest.MonkeyPatch) -> None:
    _terminal(monkeypatch, stdout=False, stderr=True)
    result = invoke("warmup", MANIFEST, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["hit"] == 5  # stdout is only the JSON
    assert "\rwarmup (1 job) [########################] 5/5" in result.stderr


def test_warmup_json_without_a_terminal_prints_only_json(invoke: Invoke, warmed) -> None:
    result = invoke("--json", "warmup", MANIFEST)
    assert result.exit_code == 0 and result.stderr == ""
    assert json.loads(result.stdout)["total"] == 5


def test_warmup_warns_when_jobs_exceed_the_cores(invoke: Invoke, warmed, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("aot.cache.warmup.run.available_cores", lambda: 2)
    result = invoke("warmup", MANIFEST, "--jobs", "3")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == (
        "aot: WARNING: --jobs 3 exceeds the 2 cores available to this process: the compiles "
        "will compete for them (XLA's compiler already uses several threads); --jobs 2 or "
        "fewer is usually faster"
    )
    quiet = invoke("warmup", MANIFEST, "--jobs", "2")
    assert "WARNING" not in quiet.stderr


@pytest.mark.parametrize(
    "text,message",
    [
        ('[[function]]\nname = "x"\ntarget = fixtures.models:tiny\n', "{path}:3: invalid TOML: Invalid value"),
        ('\n\n[[function]]\nname = "x"\nfunction = "fixtures.models:tiny"\narg = ["f32[8]"]\n',
         "{path}:3: [[function]] #1 ('x'): unknown key(s) ['arg']"),
        ('[[function]]\nfunction = "fixtures.models:tiny"\nargs = ["f32[8]"]\n'
         '[[function]]\nname = "y"\nfunction = "tiny"\n',
         "{path}:4: [[function]] #2 ('y'): 'function' must be 'MODULE:ATTRIBUTE'"),
        ('[[function]]\nname = "y"\ntarget = "tiny"\n',
         "{path}:1: [[function]] #1 ('y'): no 'function': name the Python function to compile as "
         "function = \"MODULE:ATTRIBUTE\" (e.g. 'fixtures.models:tiny'); target = 'tiny' is not "
         "MODULE:ATTRIBUTE"),
        ('[[function]]\nname = "y"\nfunction = "m:f"\ntarget = "tpu:v9:2x2"\n',
         "{path}:1: [[function]] #1 ('y'): 'target': unknown target 'tpu:v9:2x2'; known: tpu:v4:"),
        ('[[function]]\nname = "x"\nfunction = "m:f"\nargs = ["f32[{b}]"]\n',
         "{path}:1: [[function]] #1 ('x'): placeholder(s) ['{b}'] have no values in 'vary'"),
        ('[[function]]\nname = "x"\nfunction = "m:f"\nargs = ["f32[8]"]\nvary = { b = [1, 2] }\n',
         "{path}:1: [[function]] #1 ('x'): vary key(s) ['b'] are not used"),
        ('[[function]]\nname = "x"\nfunction = "m:f"\nargs = ["f32[{b}]"]\nvary = { b = [] }\n',
         "{path}:1: [[function]] #1 ('x'): vary.b must be a non-empty list"),
        ('[[function]]\nname = "x"\nfunction = "m:f"\nargs = "f32[8]"\n',
         "{path}:1: [[function]] #1 ('x'): 'args' must be a list of spec strings"),
        ('[[function]]\nname = "x"\nfunction = "m:f"\nmesh = "data=two"\n',
         "{path}:1: [[function]] #1 ('x'): malformed mesh 'data=two'"),
        ('[[function]]\nname = "x"\nfunction = "m:f"\npmap = "i"\nkwargs = { y = "f32[8]" }\n',
         "{path}:1: [[function]] #1 ('x'): pmap entries take positional args only; remove kwargs"),
        ('[[function]]\nname = "x"\nfunction = "m:f"\ndonate = [-1]\n',
         "{path}:1: [[function]] #1 ('x'): 'donate' must be a list of argument indices"),
        ('[functions]\nname = "x"\n', "{path}: unknown top-level key(s) ['functions']"),
        ('# nothing\n', "{path}: no [[function]] tables; nothing to compile"),
        ('[fleet]\nlibtpus = "1"\n[[function]]\nname = "x"\nfunction = "m:f"\n',
         "{path}: [fleet] pins libtpus, which it cannot pin; it pins libtpu, jax, jaxlib, jax-cuda12-plugin, "
         "jax-cuda13-plugin"),
        ('[fleet]\nlibtpu = 42\n[[function]]\nname = "x"\nfunction = "m:f"\n',
         "{path}: [fleet] libtpu must be a version string"),
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


def test_manifest_x64_key(invoke: Invoke, tmp_path: Path) -> None:
    manifest = write(tmp_path, """
[[function]]
name = "tiny64"
function = "fixtures.models:tiny"
args = ["f64[8]", "f64[8]"]
x64 = true
""")
    result = invoke("warmup", manifest, "--json")
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.stdout)["results"]
    assert entry["signature"] == "f64[8], f64[8]" and entry["status"] == "compiled"
    again = json.loads(invoke("warmup", manifest, "--json").stdout)["results"][0]
    assert again["status"] == "hit" and again["key"] == entry["key"]
    # Coverage is checked under x64 too.
    verified = invoke("verify", "--manifest", manifest, "--strict")
    assert verified.exit_code == 0, verified.output
    assert verified.stdout.splitlines()[-1] == f"{manifest}: the 1 entry is stored for this environment"
    bad = write(tmp_path, '[[function]]\nname = "x"\nfunction = "m:f"\nx64 = "yes"\n', "bad.toml")
    line = one_line_error(invoke("warmup", bad))
    assert line == f"Error: {bad}:1: [[function]] #1 ('x'): 'x64' must be true or false, got 'yes'"


def test_warmup_jobs_must_be_positive(invoke: Invoke) -> None:
    result = invoke("warmup", MANIFEST, "--jobs", "0")
    assert result.exit_code == 2
    assert "Invalid value for '-j' / '--jobs'" in result.output


def test_the_eta_comes_from_the_finished_entries() -> None:
    from aot.cli.progress import Progress, eta_seconds

    assert eta_seconds(12.0, 0, 5) is None  # nothing finished: no guess
    assert eta_seconds(12.0, 3, 5) == 8.0
    assert eta_seconds(12.0, 5, 5) == 0.0
    now = [100.0]
    progress = Progress(4, "warmup (1 job)", clock=lambda: now[0])
    assert progress.line() == "warmup (1 job) [------------------------] 0/4, 0:00 elapsed"
    now[0] = 103.0
    progress.done = progress.compiled = 1  # one entry took 3 s: 9 s for the other three
    assert progress.line("tiny") == "warmup (1 job) [######------------------] 1/4, 0:03 elapsed, ETA 0:09  tiny"
    now[0] = 160.0
    progress.done, progress.failed = 2, 1
    assert progress.line() == "warmup (1 job) [############------------] 2/4, 1 failed, 1:00 elapsed, ETA 1:00"


def test_no_eta_until_an_entry_was_compiled() -> None:
    """Hits finish in milliseconds: their mean alone promised `ETA 0:01` before a
    compile of seconds, and the bar sat on it."""
    from aot.cli.progress import Progress

    now = [100.0]
    progress = Progress(5, "warmup (1 job)", clock=lambda: now[0])
    now[0] = 100.1
    progress.update("tiny", compiled=False)  # a hit
    progress.update("allreduce", failed=True)
    assert progress.line() == "warmup (1 job) [#########---------------] 2/5, 1 failed, 0:00 elapsed"
    now[0] = 110.1  # then a compile of 10 s: the ETA comes from the run's measured time
    progress.update("mlp.forward", compiled=True)
    assert progress.line() == "warmup (1 job) [##############----------] 3/5, 1 failed, 0:10 elapsed, ETA 0:07"


def test_the_line_moves_during_a_long_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between finished entries the line is redrawn with the time elapsed: a 10 s
    compile shows 0:10 going by, not a frozen frame (and no ETA before a compile)."""
    import threading

    from aot.cli.progress import Progress

    now = [100.0]
    frames: list[str] = []
    ten_seconds = threading.Event()

    def draw(self: Progress, text: str) -> None:
        frames.append(text)
        if "0:10 elapsed" in text:
            ten_seconds.set()

    monkeypatch.setattr(Progress, "_draw", draw)
    monkeypatch.setattr(Progress, "TICK_SECONDS", 0.01)
    progress = Progress(3, "warmup (1 job)", clock=lambda: now[0])
    progress.start()
    progress.update("tiny")  # a hit
    now[0] = 110.0  # a compile is running: nothing finishes for 10 s
    try:
        assert ten_seconds.wait(timeout=30), frames
    finally:
        progress.finish()
    assert frames[0] == "warmup (1 job) [------------------------] 0/3, 0:00 elapsed"
    assert "warmup (1 job) [########----------------] 1/3, 0:10 elapsed  tiny" in frames
    assert not any("ETA" in f for f in frames)
    assert not any(t.name == "aot-progress" for t in threading.enumerate())  # stopped by finish


def test_a_manifest_in_the_old_spelling_warms_up_and_says_once_what_to_write(invoke: Invoke, tmp_path: Path) -> None:
    """``target = "module:attr"`` in [[function]] (before ``function`` existed) still
    compiles; stderr says once which lines to change, and --json stays clean."""
    old = write(tmp_path, (
        '[[function]]\nname = "tiny"\ntarget = "fixtures.models:tiny"\nargs = ["f32[8]", "f32[8]"]\n\n'
        '[[function]]\nname = "tiny"\ntarget = "fixtures.models:tiny"\nargs = ["f32[4]", "f32[4]"]\n'
    ), "old.toml")
    result = invoke("warmup", old, "--json")
    assert result.exit_code == 0, result.output
    assert [r["status"] for r in json.loads(result.stdout)["results"]] == ["compiled", "compiled"]
    warnings = [line for line in result.stderr.splitlines() if "old spelling" in line]
    assert warnings == [
        f'aot: WARNING: {old}: 2 [[function]] tables name the Python function with target = '
        f'"MODULE:ATTRIBUTE", the old spelling: {old}:1 (fixtures.models:tiny), {old}:6 '
        '(fixtures.models:tiny); write function = "fixtures.models:tiny" instead (target now '
        'names a device target such as "tpu:v5e:2x2"); the old spelling is still read'
    ]


FLEET_TOML = """
[fleet]
libtpu = "{libtpu}"
jax = "{jax}"

[[function]]
name = "tiny"
function = "fixtures.models:tiny"
args = ["f32[16]", "f32[16]"]
"""


def test_a_runner_with_another_libtpu_than_the_fleet_fails_warmup_and_gate(  # noqa: ANN001
    invoke: Invoke, tmp_path: Path, warmed,
) -> None:
    """[fleet] pins the fleet's compiler: a CI runner with another libtpu fails its
    warm-up and its gate, in one line naming both versions, before compiling anything
    (issue 52); the pinned versions pass."""
    import importlib.metadata

    from aot.cache.warmup.manifest import installed_version

    jax = importlib.metadata.version("jax")
    here = installed_version("libtpu") or "not installed"
    path = write(tmp_path, FLEET_TOML.format(libtpu="0.0.1", jax=jax))
    expected = (
        f"Error: {path}: [fleet] pins libtpu 0.0.1, jax {jax}, and this process has another: "
        f"libtpu 0.0.1 != {here} (pinned != installed); entries compiled here would not be the fleet's. "
        f"Install the pinned versions (pip install 'libtpu==0.0.1' 'jax=={jax}') or change the pins"
    )
    for command in (("warmup", path), ("verify", "--manifest", path, "--strict")):
        result = invoke(*command)
        assert result.exit_code == 1 and one_line_error(result) == expected, command
    assert json.loads(invoke("ls", "--json").stdout)["count"] == 5  # nothing compiled
    if here != "not installed":
        path.write_text(FLEET_TOML.format(libtpu=here, jax=jax))
        warmed = invoke("warmup", path)
        assert warmed.exit_code == 0 and warmed.stdout.splitlines()[-1].startswith("1 entry: 1 compiled"), warmed.output
        assert invoke("verify", "--manifest", path, "--strict").exit_code == 0
