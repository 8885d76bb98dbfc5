"""Two ``aot warmup`` runners of one manifest, without ``--shard``, at ``--jobs 2`` (and
``--isolate``), started so that they overlap, compile each entry once in total
(compile claims: aot.cache.warmup.claims, held by each runner's parent process).

The overlap is made, not hoped for: runner A pauses at its first compile (its claims
taken, ``AOT_TEST_PAUSE`` point ``warmup.compiling``) until runner B has started one
of its own. Without claims both compile what A paused on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import aot
from tests.cli.helpers import REPO

SIZES = (2, 3, 5, 7, 11, 13)
MODES = {"jobs1": (), "jobs2": ("--jobs", "2"), "isolate": ("--jobs", "2", "--isolate")}
_START_SECONDS = 300.0  # a runner's JAX imports on a loaded CI machine


def _manifest(tmp_path: Path) -> Path:
    path = tmp_path / "claims.toml"
    path.write_text(
        '[[function]]\nname = "tiny"\nfunction = "fixtures.models:tiny"\n'
        f'args = ["f32[{{n}}]", "f32[{{n}}]"]\nvary = {{ n = {list(SIZES)} }}\n',
        encoding="utf-8",
    )
    return path


def _aot(location: str, blobs: str | None, *args: str) -> list[str]:
    return [sys.executable, "-m", "aot", "--cache", location, *(("--blobs", blobs) if blobs else ()), *args]


def _runner(command: list[str], pause: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOT_")}
    env["AOT_TEST_PAUSE"] = pause
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for(flag: Path, runner: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + _START_SECONDS
    while not flag.exists():
        if runner.poll() is not None:
            pytest.fail(f"{what}: it exited first ({runner.returncode}): {runner.stderr.read() if runner.stderr else ''}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {_START_SECONDS:.0f} s")
        time.sleep(0.05)


def _overlapping_runners(location: str, blobs: str | None, manifest: Path, flags: tuple[str, ...], tmp_path: Path) -> list[dict]:
    """Runs A and B; A holds its first compile (and the claims it took) until B compiles."""
    a_compiles, b_compiles, go = tmp_path / "a-compiles", tmp_path / "b-compiles", tmp_path / "go"
    command = _aot(location, blobs, "--json", "warmup", str(manifest), *flags)
    runners = [_runner(command, f"warmup.compiling=touch:{a_compiles}+wait:{go}")]
    try:
        _wait_for(a_compiles, runners[0], "runner A's first compile")
        runners.append(_runner(command, f"warmup.compiling=touch:{b_compiles}"))
        try:
            _wait_for(b_compiles, runners[1], "runner B's first compile while A holds its own")
        finally:
            go.touch()
        reports = []
        for runner in runners:
            out, err = runner.communicate(timeout=600)
            assert runner.returncode == 0, err
            reports.append(json.loads(out))
        return reports
    finally:
        go.touch()
        for runner in runners:
            if runner.poll() is None:
                runner.kill()
                runner.communicate()


def _check_compiled_once(location: str, blobs: str | None, manifest: Path, flags: tuple[str, ...], tmp_path: Path) -> None:
    a, b = _overlapping_runners(location, blobs, manifest, flags, tmp_path)
    total = len(SIZES)
    assert [a["total"], b["total"]] == [total, total]
    assert a["failed"] == b["failed"] == 0
    assert a["compiled"] + b["compiled"] == total, (a["compiled"], b["compiled"])  # once in total
    assert a["compiled"] + a["hit"] == total and b["compiled"] + b["hit"] == total
    compiled = [{x["key"] for x in r["results"] if x["status"] == "compiled"} for r in (a, b)]
    assert not compiled[0] & compiled[1]
    assert a["compiled"] >= 1 and b["compiled"] >= 1
    assert b["waited"] >= 1  # B passed over what A held, and came back for it
    verify = subprocess.run(
        _aot(location, blobs, "verify", "--manifest", str(manifest), "--strict"),
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    with aot.Cache(location, blob_location=blobs) as cache:  # every claim released at the end
        assert [cache.index.jit_claim_holder(k) for k in compiled[0] | compiled[1]] == [None] * total


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("mode", MODES)
def test_overlapping_runners_compile_each_entry_once_in_total(
    postgres_url: str, s3_url: str, tmp_path: Path, mode: str,
) -> None:
    _check_compiled_once(postgres_url, s3_url, _manifest(tmp_path), MODES[mode], tmp_path)


@pytest.mark.slow
def test_overlapping_runners_of_a_folder_cache_with_claims_compile_each_entry_once(tmp_path: Path) -> None:
    location = str(tmp_path / "cache")
    _check_compiled_once(location, None, _manifest(tmp_path), (*MODES["jobs2"], "--claims"), tmp_path)
