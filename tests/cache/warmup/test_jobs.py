"""``--jobs auto`` (aot.cache.warmup.jobs): min(cores // 3, available memory // 2 GiB,
entries), >= 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aot.cache.warmup import jobs as warmup_jobs
from aot.cache.warmup.jobs import CORES_PER_JOB, JOB_MEMORY, auto_jobs, cgroup_room, resolve_jobs

GiB = 2**30


@pytest.mark.parametrize(
    "cores,memory,jobs",
    [
        (2, 64 * GiB, 1),  # 2 // 3 cores: never below one
        (13, 64 * GiB, 4),  # the 13-core TPU host: --jobs 4 was the fastest measured
        (8, 64 * GiB, 2),
        (32, 64 * GiB, 10),
        (32, 9 * GiB, 4),  # memory bound: 9 GiB // 2 GiB
        (12, 1 * GiB, 1),  # never below one
        (1, 0, 1),
    ],
)
def test_auto_is_a_job_per_three_cores_within_memory(cores: int, memory: int, jobs: int) -> None:
    assert JOB_MEMORY == 2 * GiB and CORES_PER_JOB == 3
    assert auto_jobs(cores=cores, memory=memory) == jobs


def test_auto_is_capped_by_the_entries() -> None:
    assert auto_jobs(cores=30, memory=None, entries=3) == 3
    assert auto_jobs(cores=30, memory=None, entries=100) == 10
    assert auto_jobs(cores=30, memory=None, entries=0) == 1


def test_unknown_memory_does_not_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warmup_jobs, "available_memory", lambda: None)
    monkeypatch.setattr(warmup_jobs, "available_cores", lambda: 9)
    assert auto_jobs() == 3 and resolve_jobs("auto") == 3 and resolve_jobs(" AUTO ") == 3
    assert resolve_jobs("auto", entries=2) == 2
    assert resolve_jobs(5, entries=2) == 5  # an explicit count is taken as it is


def test_resolve_jobs_refuses_what_is_not_a_count() -> None:
    assert resolve_jobs(4) == resolve_jobs("4") == 4
    for bad in (0, -1, "0", "many", "", True, 2.5):
        with pytest.raises(ValueError, match="jobs must be"):
            resolve_jobs(bad)  # type: ignore[arg-type]


def test_cgroup_room_reads_v2_and_v1_limits(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    (v2 / "ci" / "job").mkdir(parents=True)
    (v2 / "ci" / "job" / "memory.max").write_text(f"{6 * GiB}\n")
    (v2 / "ci" / "job" / "memory.current").write_text(f"{GiB}\n")
    member = tmp_path / "cgroup"
    member.write_text("0::/ci/job\n")
    assert cgroup_room(v2, member) == 5 * GiB
    (v2 / "ci" / "job" / "memory.max").write_text("max\n")
    assert cgroup_room(v2, member) is None

    v1 = tmp_path / "v1"
    (v1 / "memory" / "docker" / "abc").mkdir(parents=True)
    (v1 / "memory" / "docker" / "abc" / "memory.limit_in_bytes").write_text(f"{3 * GiB}\n")
    (v1 / "memory" / "docker" / "abc" / "memory.usage_in_bytes").write_text(f"{2 * GiB}\n")
    member.write_text("12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n")
    assert cgroup_room(v1, member) == GiB
    (v1 / "memory" / "docker" / "abc" / "memory.limit_in_bytes").write_text(f"{2**63 - 4096}\n")
    assert cgroup_room(v1, member) is None  # v1's "unlimited"


def test_cli_jobs_auto_uses_the_documented_count(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from aot.cli.main import cli

    repo = Path(__file__).resolve().parents[3]
    monkeypatch.chdir(repo)
    monkeypatch.setattr(warmup_jobs, "available_cores", lambda: 30)
    monkeypatch.setattr(warmup_jobs, "available_memory", lambda: 64 * GiB)
    manifest = tmp_path / "warmup.toml"
    manifest.write_text('[[function]]\nname = "tiny"\nfunction = "fixtures.models:tiny"\n'
                        'args = ["f32[{n}]", "f32[{n}]"]\nvary = { n = [3, 5] }\n')
    runner = CliRunner()
    result = runner.invoke(cli, ["--cache", str(tmp_path / "c"), "warmup", str(manifest), "--jobs", "auto", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # min(30 cores // 3, 64 GiB // 2 GiB, 2 entries)
    assert report["jobs"] == 2 and report["compiled"] == 2
    bad = runner.invoke(cli, ["--cache", str(tmp_path / "c"), "warmup", str(manifest), "--jobs", "many"])
    assert bad.exit_code == 2
    assert "Invalid value for '-j' / '--jobs': 'many' is not a number >= 1 or 'auto'" in bad.output
