"""Warm-ups for a device target on CPU workers: worker processes (``jobs``) and an
existing distributed engine (a dask ``LocalCluster``), each loading libtpu itself."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import aot
from aot.cache.warmup.manifest import expand, parse_manifest
from aot.cache.warmup.run import run_warmup
from tests.aot.test_targets import CHIP_PARTS, needs_libtpu

REPO = Path(__file__).resolve().parents[3]
MANIFEST = """
target = "tpu:v5e:1x1"

[[function]]
name     = "mlp.forward"
function = "fixtures.models:mlp_forward"
args     = ["@fixtures.models:mlp_param_specs", "f32[{batch},784]"]
vary     = { batch = [1, 8, 32] }

[[function]]
name     = "tiny"
function = "fixtures.models:tiny"
args     = ["f32[8]", "f32[8]"]
"""


def _items() -> list:
    return expand(parse_manifest(MANIFEST, str(REPO / "targets.toml")))


def _check_stored(location: Path) -> None:
    cache = aot.Cache(location)
    try:
        entries = cache.entries()
        assert len(entries) == 4
        for entry in entries:
            parts = cache.artifact(entry).manifest.environment.as_dict()
            assert {k: parts[k] for k in CHIP_PARTS} == CHIP_PARTS
        assert cache.verify().ok
    finally:
        cache.close()


@needs_libtpu
@pytest.mark.slow
def test_worker_processes_compile_a_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    report = run_warmup(str(tmp_path / "c"), _items(), jobs=2, isolate=True)
    assert report.ok, report.to_dict()
    assert {r.status for r in report.results} == {"compiled"}
    _check_stored(tmp_path / "c")


@needs_libtpu
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="dask.distributed not installed (test extras)")
def test_a_dask_local_cluster_compiles_a_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from distributed import Client, LocalCluster

    monkeypatch.chdir(REPO)  # the workers start here, where fixtures.models imports
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            report = run_warmup(str(tmp_path / "c"), _items(), executor=client.get_executor())
            ran_on = client.run(lambda: __import__("os").getpid())
    assert report.ok, report.to_dict()
    assert {r.status for r in report.results} == {"compiled"}
    assert len(ran_on) == 2
    _check_stored(tmp_path / "c")
