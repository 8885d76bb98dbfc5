"""Against the real thing: Debian's Prometheus server scrapes a serving process (metrics
started by ``AOT_METRICS_PORT``, no code) and the series are read back through
Prometheus's HTTP query API. Skips with a reason where no ``prometheus`` binary is
installed (``.ci/run`` installs Debian's package). Every wait is bounded; both
processes are killed in ``finally``."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).with_name("metrics_serving_script.py")
CALLS = 17


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as reply:
        body = json.loads(reply.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _docs_query(comment: str) -> str:
    """The PromQL of docs/metrics.md's line ending in ``comment``: the test runs what the
    docs tell a reader to run."""
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        if line.rstrip().endswith(comment):
            return line[: line.index(comment)].strip()
    raise AssertionError(f"docs/metrics.md has no query marked {comment!r}")


def _stop(proc: subprocess.Popen[Any] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_prometheus_scrapes_a_serving_process(tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary (apt-get install prometheus; .ci/run installs it)")
    metrics_port, prometheus_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: aot\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
    )
    env = {**os.environ, "AOT_METRICS_PORT": str(metrics_port), "PYTHONPATH": str(REPO)}
    env.pop("AOT_TEST_PAUSE", None)
    serving = prometheus = None
    try:
        serving = subprocess.Popen(
            [sys.executable, str(SCRIPT), str(tmp_path / "cache"), str(CALLS)], cwd=REPO, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert serving.stdout is not None
        ready, _, _ = select.select([serving.stdout], [], [], 180)  # compiles, then READY
        assert ready, "the serving process did not start within 180 s"
        line = serving.stdout.readline()
        assert line.strip() == "READY", serving.stderr.read() if serving.stderr else ""
        prometheus = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        base = f"http://127.0.0.1:{prometheus_port}"
        hits: list[dict[str, Any]] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if prometheus.poll() is not None:
                pytest.fail(f"prometheus exited: {prometheus.stderr.read() if prometheus.stderr else ''}")
            try:
                hits = _query(base, 'aot_hits_total{name="tiny"}')
            except OSError:
                hits = []  # not listening yet
            if hits:
                break
            time.sleep(0.5)
        assert hits, "Prometheus did not scrape the serving process within 90 s"
        assert float(hits[0]["value"][1]) == CALLS
        # Served by its refs: release="" which Prometheus stores as no label.
        assert hits[0]["metric"]["job"] == "aot" and "release" not in hits[0]["metric"]
        (loads,) = _query(base, 'aot_loads_total{name="tiny"}')
        assert float(loads["value"][1]) == 1
        (count,) = _query(base, 'aot_load_seconds_count{name="tiny"}')
        assert float(count["value"][1]) == 1
        (info,) = _query(base, 'aot_release_info{name="tiny"}')
        assert float(info["value"][1]) == 1
        # No miss yet, and a sample at 0 already: the first miss counts in rate() (issue 52).
        (misses,) = _query(base, 'aot_misses_total{name="tiny"}')
        assert float(misses["value"][1]) == 0
        # The docs' p99 load latency: the load came before the first scrape, so a rate()
        # over it sees no increase (NaN, as docs/metrics.md says); the docs' query does not.
        assert float(_query(base, _docs_query("# p99 load latency since start-up"))[0]["value"][1]) > 0
        rated: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while not rated and time.monotonic() < deadline:  # rate() needs two scrapes
            rated = _query(base, _docs_query("# p99 of the loads in the last 5 minutes"))
            time.sleep(0.5)
        assert [r["value"][1] for r in rated] == ["NaN"]
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/ready", timeout=5) as reply:
            assert (reply.status, reply.read()) == (200, b"ready: tiny loaded\n")
        assert serving.stdin is not None
        serving.stdin.write("miss\n")
        serving.stdin.flush()
        ready, _, _ = select.select([serving.stdout], [], [], 30)
        assert ready and serving.stdout.readline().strip() == "MISSED"
        increase: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            increase = _query(base, 'increase(aot_misses_total{name="tiny"}[1m])')
            if increase and float(increase[0]["value"][1]) > 0:
                break
            time.sleep(0.5)
        assert increase and float(increase[0]["value"][1]) > 0, increase
    finally:
        if serving is not None and serving.stdin is not None:
            serving.stdin.close()
        _stop(prometheus)
        _stop(serving)
