"""What the shell shows around a command: a reader that leaves early (`aot ls | head -3`)
ends it quietly, as git and ls do; a warm-up into a cache on a read-only mount names the
read-only file system, not the permissions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import aot
from tests.cache.conftest import with_environment
from tests.cli.helpers import Invoke, one_line_error

REPO = Path(__file__).resolve().parents[2]
ENTRIES = 120


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache of 120 entries (one program relabelled as 120 environments' entries)."""
    from aot.build import build_artifact
    from fixtures import models

    computation = aot.lower(models.tiny, *models.tiny_specs(), name="tiny")
    artifact = build_artifact(computation.compile(), computation.portable_hlo())
    folder = tmp_path_factory.mktemp("many") / "cache"
    with aot.Cache(folder) as cache:
        for i in range(ENTRIES):
            cache.put_artifact(with_environment(artifact, jaxlib=f"0.0.{i}"))
    return folder


def _aot() -> list[str]:
    return [sys.executable, "-m", "aot"]


@pytest.mark.parametrize("args", [("ls",), ("ls", "--json")])
def test_a_reader_that_leaves_early_ends_the_command_quietly(many: Path, args: tuple[str, ...]) -> None:
    """A real pipe whose reader closes after 3 lines, while the command still writes
    (its output is larger than the pipe's buffer, so the write fails every run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOT_")}
    full = subprocess.run([*_aot(), "--cache", str(many), *args], cwd=REPO, env=env,
                          capture_output=True, timeout=300)
    assert full.returncode == 0 and full.stdout.count(b"\n") >= 3
    for _ in range(4):
        with subprocess.Popen([*_aot(), "--cache", str(many), *args],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
            assert process.stdout is not None and process.stderr is not None
            for _ in range(3):
                assert process.stdout.readline()
            process.stdout.close()  # `head -3` exits
            stderr = process.stderr.read()
            code = process.wait(timeout=300)
        assert (code, stderr.decode()) == (0, "")


def test_the_shell_pipeline_is_quiet(many: Path) -> None:
    """`aot ls | head -3` as typed: 3 lines, nothing on stderr, both ends exit 0."""
    script = f"{' '.join(_aot())} --cache {many} ls | head -3; echo \"status ${{PIPESTATUS[*]}}\" >&2"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOT_")}
    for _ in range(3):
        done = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert done.stdout.count("\n") == 3
        assert done.stderr == "status 0 0\n"


def test_a_warmup_into_a_read_only_mount_names_the_file_system(
    invoke: Invoke, tmp_path: Path, many: Path,
) -> None:
    mount_point = tmp_path / "ro"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode})")
    try:
        subprocess.run(["cp", "-r", str(many), str(mount_point / "cache")], check=True)
        remount = subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], capture_output=True, text=True)
        if remount.returncode != 0:
            pytest.skip(f"cannot remount read-only: {remount.stderr.strip()}")
        error = one_line_error(invoke("warmup", str(REPO / "fixtures" / "warmup.toml"), "--jobs", "1",
                                      cache=mount_point / "cache"))
        assert "read-only file system" in error, error
        assert "fix the permissions" not in error
        # A new cache there: the same cause.
        error = one_line_error(invoke("warmup", str(REPO / "fixtures" / "warmup.toml"), "--jobs", "1",
                                      cache=mount_point / "new"))
        assert "read-only file system" in error.lower(), error
        assert "fix the permissions" not in error
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
