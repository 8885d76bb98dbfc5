"""The Prometheus exporter (aot.cache.serving.metrics): what a scrape of a serving process
shows after loads, calls, misses, fallbacks and recompiles; the HTTP endpoint; the
index's totals in the text format; the Grafana dashboard's queries name exposed series."""

from __future__ import annotations

import json
import re
import socket
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import aot
from aot.cache import stats_recorder as stats_mod
from aot.cache.index.refs import RefOrigin
from aot.cache.reports.stats import read_stats
from aot.cache.serving import metrics
from aot.errors import MetricsError

DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "grafana" / "jax-aot.json"


@pytest.fixture(autouse=True)
def _no_background_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats_mod, "FLUSH_SECONDS", None)


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    """A registry of its own, so that other tests' serving does not count here."""
    reg = CollectorRegistry()
    exporter = metrics.enable_metrics(reg)
    try:
        yield reg
    finally:
        exporter.close()


def value(registry: CollectorRegistry, sample: str, name: str, release: str = "") -> float | None:
    return registry.get_sample_value(sample, {"name": name, "release": release})


def test_a_scrape_counts_loads_hits_and_latency_per_name(registry, open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    entry = cache.put(compiled.tiny)
    fn = aot.load(compiled.TINY_NAME, cache=cache)
    for _ in range(12):
        fn(*compiled.tiny_inputs)
    name = compiled.TINY_NAME
    assert value(registry, "aot_hits_total", name) == 12  # read fresh at the scrape, not at a flush
    assert value(registry, "aot_loads_total", name) == 1
    assert value(registry, "aot_load_seconds_count", name) == 1
    (row,) = cache.stats.report(name).rows
    assert value(registry, "aot_load_seconds_sum", name) == pytest.approx(row.load_seconds)
    assert value(registry, "aot_compile_saved_seconds_total", name) == pytest.approx(entry.compile_seconds)
    assert registry.get_sample_value("aot_release_info", {"name": name, "release": ""}) == 1
    for _ in range(3):
        fn(*compiled.tiny_inputs)
    assert value(registry, "aot_hits_total", name) == 15
    assert cache.stats.flush()
    assert read_stats(cache, name).rows[0].calls == 15  # the index counts the same calls, once
    assert value(registry, "aot_hits_total", name) == 15


@pytest.mark.parametrize("how", ["argument", "AOT_RELEASE"])
def test_a_process_serving_a_release_labels_its_series_with_it(  # noqa: ANN001
    registry, open_folder_cache, compiled, how: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = open_folder_cache()
    entry = cache.put(compiled.tiny)
    name = compiled.TINY_NAME
    # Declared as `aot warmup --release prod` declares it: a set of the label, the ref pointing at it.
    cache.index.declare_release("prod", [(entry.name, entry.signature, entry.env_fp, entry.key)],
                                RefOrigin("test", release="prod"))
    if how == "AOT_RELEASE":
        monkeypatch.setenv("AOT_RELEASE", "prod")
        fn = aot.load(name, cache=cache)
    else:
        fn = aot.load(name, cache=cache, release="prod")
    for _ in range(5):
        fn(*compiled.tiny_inputs)
    assert value(registry, "aot_hits_total", name, "prod") == 5
    assert value(registry, "aot_loads_total", name, "prod") == 1
    assert value(registry, "aot_load_seconds_count", name, "prod") == 1
    assert value(registry, "aot_compile_saved_seconds_total", name, "prod") == pytest.approx(entry.compile_seconds)
    assert registry.get_sample_value("aot_release_info", {"name": name, "release": "prod"}) == 1
    # Nothing of it is counted as served by refs.
    for series in ("aot_hits_total", "aot_loads_total", "aot_load_seconds_count"):
        assert value(registry, series, name) is None, series
    assert registry.get_sample_value("aot_release_info", {"name": name, "release": ""}) is None
    text = generate_latest(registry).decode()
    assert 'aot_hits_total{name="tiny",release="prod"} 5.0' in text
    assert 'aot_release_info{name="tiny",release="prod"} 1.0' in text


def test_misses_fallbacks_and_recompiles(registry, open_folder_cache, compiled, foreign) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put(compiled.mlp[1])
    strict = aot.load(compiled.MLP_NAME, cache=cache)
    with pytest.raises(aot.SignatureNotFoundError):
        strict(compiled.params, compiled.inputs[2])
    with_fallback = aot.load(compiled.MLP_NAME, cache=cache, fallback=compiled.models.mlp_forward)
    np.testing.assert_allclose(
        np.asarray(with_fallback(compiled.params, compiled.inputs[4])), compiled.expected[4], rtol=1e-5,
    )
    name = compiled.MLP_NAME
    assert value(registry, "aot_misses_total", name) == 2
    assert value(registry, "aot_fallbacks_total", name) == 1
    cache.put_artifact(foreign(compiled.tiny, jaxlib="0.0.1"))
    aot.load(compiled.TINY_NAME, cache=cache)
    assert value(registry, "aot_recompiles_total", compiled.TINY_NAME) == 1
    assert value(registry, "aot_recompile_seconds_total", compiled.TINY_NAME) > 0
    assert value(registry, "aot_loads_total", compiled.TINY_NAME) == 0  # compiled, not loaded


def test_the_endpoint_serves_the_text_format(registry, open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put(compiled.tiny)
    server = metrics.serve_metrics(0, registry=registry)
    try:
        assert metrics.serve_metrics(server.port, registry=registry) is server  # asked twice: one server
        fn = aot.load(compiled.TINY_NAME, cache=cache)
        fn(*compiled.tiny_inputs)
        with urllib.request.urlopen(server.url, timeout=10) as reply:
            text = reply.read().decode()
        assert 'aot_hits_total{name="tiny",release=""} 1.0' in text
        assert 'aot_loads_total{name="tiny",release=""} 1.0' in text
    finally:
        server.close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsError, match=f"cannot serve metrics on 127.0.0.1:{port}.*choose a free port"):
            metrics.serve_metrics(port, registry=registry)


def test_the_environment_variable_must_name_a_port() -> None:
    assert metrics.serve_metrics_from_env({}) is None
    with pytest.raises(MetricsError, match="AOT_METRICS_PORT='nine' is not a port"):
        metrics.serve_metrics_from_env({"AOT_METRICS_PORT": "nine"})


def test_without_prometheus_client_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    with pytest.raises(MetricsError, match=re.escape("pip install 'jax-aot[metrics]'")):
        aot.serve_metrics(0)


def test_the_index_totals_in_the_text_format(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put(compiled.tiny)
    fn = aot.load(compiled.TINY_NAME, cache=cache)
    for _ in range(4):
        fn(*compiled.tiny_inputs)
    assert cache.stats.flush()
    report = read_stats(cache, None)
    text = metrics.index_exposition(report)
    samples = {
        (s.name, s.labels.get("name")): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }
    assert samples[("aot_index_calls_total", "tiny")] == 4
    assert samples[("aot_index_loads_total", "tiny")] == 1
    assert samples[("aot_index_compile_saved_seconds_total", "tiny")] == pytest.approx(report.rows[0].saved_seconds)


def exposed_series(registry: CollectorRegistry) -> set[str]:
    """Every series name a scrape of ``registry`` can show (suffixes by metric type)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "info": ("_info",),
                "gauge": ("",)}
    return {family.name + suffix for family in registry.collect() for suffix in suffixes[family.type]}


def dashboard_queries() -> list[str]:
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("expr", "definition"):  # panels' queries, the name variable's
                if isinstance(node.get(key), str):
                    found.append(node[key])
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(json.loads(DASHBOARD.read_text()))
    return found


def test_every_dashboard_query_names_an_exposed_series(registry) -> None:  # noqa: ANN001
    exposed = exposed_series(registry)
    assert set(metrics.METRICS) <= exposed | {"aot_load_seconds"}
    queries = dashboard_queries()
    assert len(queries) >= 7
    named = {m for q in queries for m in re.findall(r"\baot_[a-z_]+", q)}
    assert named and named <= exposed, sorted(named - exposed)
    for series in ("aot_loads_total", "aot_hits_total", "aot_misses_total", "aot_recompiles_total",
                   "aot_fallbacks_total", "aot_load_seconds_bucket", "aot_release_info"):
        assert series in named, f"the dashboard shows no {series}"


def test_every_counter_of_a_served_name_is_exported_at_zero_before_its_first_event(  # noqa: ANN001
    registry, open_folder_cache, compiled,
) -> None:
    """rate() needs a sample before a counter's first event: a name served but never
    missed has its miss, fallback, recompile and quarantine series at 0 (issue 52)."""
    cache = open_folder_cache()
    cache.put(compiled.tiny)
    aot.load(compiled.TINY_NAME, cache=cache)
    name = compiled.TINY_NAME
    for series in ("aot_misses_total", "aot_fallbacks_total", "aot_recompiles_total", "aot_recompile_seconds_total",
                   "aot_quarantines_total", "aot_hits_total"):
        assert value(registry, series, name) == 0, series
    assert value(registry, "aot_loads_total", name) == 1
    text = generate_latest(registry).decode()
    assert 'aot_quarantines_total{name="tiny",release=""} 0.0' in text
    assert 'aot_load_seconds_bucket{le="0.001",name="tiny",release=""}' in text
