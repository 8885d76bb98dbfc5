"""Issue 37: on a host whose device cannot be opened (here: JAX_PLATFORMS=tpu and no
TPU, so any backend initialisation fails, as on a TPU host whose chip a server holds),
the operator's commands that need no device still work, quickly, and label ENV from
the per-host record (or 'unknown' without one); a command that needs the device says
so in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aot import env_record
from aot.environment import environment_parts
from tests.cli.helpers import REPO
from tests.cli.test_no_jax_import import WRAPPER, _env

COMMANDS = [
    ("ls",), ("show", "tiny"), ("stats",), ("verify",), ("gc", "--dry-run"), ("rm", "tiny", "--dry-run"),
    ("history", "tiny"), ("release", "ls"), ("why", "tiny", "--arg", "f32[8]", "--arg", "f32[8]"),
    ("doctor", "--no-verify"),
]


def _held_env(records: Path) -> dict[str, str]:
    return _env(records, JAX_PLATFORMS="tpu")


def _record_for(records: Path, env: dict[str, str]) -> None:
    """The record a process on this host's device wrote under ``env``'s key (the parts
    this test process computed: the warmed entries' environment)."""
    key = env_record.record_key(env)
    if key is None:
        pytest.skip("no boot id on this host: no environment record")
    path = env_record.record_path(key, records)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "parts": environment_parts()}))


def _run(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], float, set[str]]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", WRAPPER, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - start
    imported = [line for line in done.stderr.splitlines() if line.startswith("IMPORTED=")]
    return done, took, set(imported[-1].removeprefix("IMPORTED=").split(",")) if imported else set()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_commands_work_without_the_device_and_label_from_the_record(
    warmed: Path, tmp_path: Path, command: tuple[str, ...],
) -> None:
    records = tmp_path / "records"
    env = _held_env(records)
    _record_for(records, env)
    done, took, imported = _run(env, "--cache", str(warmed), *command)
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    assert "Unable to initialize" not in done.stderr
    limit = 6.0 if command[0] in ("doctor", "why", "verify") else 4.0  # these import JAX (not the device)
    assert took < limit, (command, took)
    if command[0] in ("ls", "show", "stats", "rm", "history", "release"):
        assert "jax" not in imported, (command, imported)
    if command[0] == "ls":
        assert done.stdout.count(" this ") == 5 and "unknown" not in done.stdout
    if command[0] == "show":
        assert "this one" in done.stdout
    if command[0] == "why":
        assert "tiny (" in done.stdout and ": hit, key" in done.stdout
    if command[0] == "doctor":
        assert "the TPU backend could not start" in done.stdout  # reported, not raised
        assert "environment unknown" not in done.stdout and "(recorded)" in done.stdout
    if command[0] == "verify":
        assert "problem" not in done.stdout.lower() or "0 problems" in done.stdout


@pytest.mark.parametrize("command", [("ls",), ("show", "tiny"), ("stats",), ("verify",), ("why", "tiny", "--arg",
                                     "f32[8]", "--arg", "f32[8]"), ("doctor", "--no-verify")],
                         ids=lambda c: c[0])
def test_without_a_record_the_environment_is_unknown_and_nothing_fails(
    warmed: Path, tmp_path: Path, command: tuple[str, ...],
) -> None:
    env = _held_env(tmp_path / "records")
    done, took, imported = _run(env, "--cache", str(warmed), *command)
    # why: exit 1, as for any request it cannot call a hit (it says why below)
    assert done.returncode == (1 if command[0] == "why" else 0), (command, done.stdout, done.stderr)
    assert "Unable to initialize" not in done.stderr and "Traceback" not in done.stderr
    assert took < (6.0 if command[0] in ("doctor", "why", "verify") else 4.0), (command, took)
    if command[0] == "ls":
        assert "jax" not in imported
        assert done.stdout.count("  unknown  ") == 5 and " this " not in done.stdout
        assert "5 for an unknown environment" in done.stdout
        assert "note: this host's environment is not recorded yet" in done.stderr
    if command[0] == "show":
        assert "unknown: this host's environment is not recorded yet" in done.stdout
    if command[0] == "why":
        assert "cannot be told" in done.stdout
    if command[0] == "doctor":
        assert "environment unknown" in done.stdout
    assert not (tmp_path / "records").exists() or not list((tmp_path / "records").glob("*.json"))


def test_a_compile_that_needs_the_device_says_so_in_one_line(tmp_path: Path) -> None:
    env = _held_env(tmp_path / "records")
    done, _, _ = _run(env, "--cache", str(tmp_path / "cache"), "compile", "fixtures.models:tiny",
                      "--arg", "f32[8]", "--arg", "f32[8]")
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("Error: the TPU backend could not start (")
    assert "this command needs the device" in errors[0] and "--target" in errors[0]
    assert "Traceback" not in done.stderr


def test_import_jax_own_variables_do_not_block_the_record(tmp_path: Path) -> None:
    """On a TPU host `import jax` sets TPU_LIBRARY_PATH (libtpu) and others: the record
    is still written, and found by a fresh process without them; any other change of a
    variable of the key since the start refuses it."""
    if env_record.record_key() is None:
        pytest.skip("no boot id on this host: no environment record")
    records = tmp_path / "records"
    env = {k: v for k, v in _env(records).items() if k not in ("TPU_LIBRARY_PATH", "TPU_ML_PLATFORM")}
    write = (
        "import os\n"
        "os.environ['TPU_LIBRARY_PATH'] = '/site-packages/libtpu/libtpu.so'  # as libtpu does on import\n"
        "os.environ.setdefault('TPU_ML_PLATFORM', 'JAX')\n"
        "{extra}"
        "from aot.fingerprint import environment_fingerprint; environment_fingerprint()\n"
    )
    subprocess.run([sys.executable, "-c", write.format(extra="os.environ['TPU_TOPOLOGY'] = '2x2'\n")],
                   cwd=REPO, env=env, check=True, timeout=120)
    assert not records.exists() or not list(records.glob("*.json"))  # TPU_TOPOLOGY is not jax's own
    subprocess.run([sys.executable, "-c", write.format(extra="")], cwd=REPO, env=env, check=True, timeout=120)
    assert len(list(records.glob("*.json"))) == 1
    read = "from aot.env_record import read_parts; print(read_parts() is not None)"
    done = subprocess.run([sys.executable, "-c", read], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stderr
    # A reader that imported JAX (which may set them again) finds it too.
    read_after = "import os; os.environ['TPU_LIBRARY_PATH'] = '/x/libtpu.so'\n" + read
    done = subprocess.run([sys.executable, "-c", read_after], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "True", done.stderr


def test_the_record_is_under_the_starting_variables() -> None:
    assert env_record.changed_since_start({}, {"TPU_LIBRARY_PATH": "/x.so", "TPU_ML_PLATFORM": "JAX"}) == []
    assert env_record.changed_since_start({"TPU_LIBRARY_PATH": "/a.so"}, {"TPU_LIBRARY_PATH": "/b.so"}) == [
        "TPU_LIBRARY_PATH"]
    assert env_record.changed_since_start(
        {"LIBTPU_INIT_ARGS": "--a"}, {"LIBTPU_INIT_ARGS": "--a --xla_tpu_use_enhanced_launch_barrier=true"}) == []
    assert env_record.changed_since_start({}, {"TPU_TOPOLOGY": "2x2"}) == ["TPU_TOPOLOGY"]
    assert os.environ.get("JAX_PLATFORMS") == "cpu"  # the conftest's pin: the tests above ran on CPU
