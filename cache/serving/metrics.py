"""Prometheus metrics: a serving process's, and the index's totals (``aot stats --prometheus``).

A serving process exports what its call-statistics recorder sees
(:mod:`aot.cache.stats_recorder`, through :mod:`aot.cache.serving_events`): the same
loads, calls, misses and recompiles that ``aot stats`` shows, counted once, with nothing
added to the call path (calls are read from the dispatchers' counters when Prometheus
scrapes). Started by one call or one environment variable::

    aot.serve_metrics(9464)                 # http://127.0.0.1:9464/metrics
    AOT_METRICS_PORT=9464 python serve.py   # started by `import aot` (/ready: 503 until a load)

Series (labels ``name``: the entry name; ``release``: the release label the process
serves for it, "" when it serves the name's refs):

- ``aot_loads_total``, ``aot_load_seconds`` (histogram): executables loaded from the
  cache, and how long each took (blob reads and deserialization);
- ``aot_compile_saved_seconds_total``: the stored compile time of the loaded executables;
- ``aot_hits_total``: calls served by a stored executable (``aot stats``'s CALLS);
- ``aot_misses_total``: calls whose signature had no stored executable (including
  ``aot_fallbacks_total``: those compiled by ``aot.load(..., fallback=fn)``);
- ``aot_recompiles_total``, ``aot_recompile_seconds_total``: compiles from stored
  portable HLO (another environment, a quarantined executable, a symbolic program);
- ``aot_quarantines_total``: stored executables proven corrupt and refused;
- ``aot_release_info{name, release}``: 1 for each name the process serves.

Every series of a name is exported from the moment the process serves it (0 until its
first event), so that ``rate()`` counts a first miss or quarantine; the names served
before the exporter was enabled get theirs at their first event.

The metrics go to ``prometheus_client``'s default registry, so a process that already
exposes its own metrics (``start_http_server``) exposes these on the same endpoint once
:func:`enable_metrics` is called. ``prometheus_client`` is the ``metrics`` extra.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from aot.cache.serving_events import StatsEvent, add_listener, remove_listener
from aot.cache.stats_recorder import report_calls
from aot.errors import MetricsError

if TYPE_CHECKING:
    from aot.cache.stats_report import StatsReport

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_ADDR", "ENV_ADDR", "ENV_PORT", "INDEX_METRICS", "LOAD_BUCKETS", "METRICS",
    "MetricsExporter", "MetricsServer", "enable_metrics", "index_exposition",
    "serve_metrics", "serve_metrics_from_env",
]

#: The port a serving process exposes its metrics on (``import aot`` starts the server).
ENV_PORT = "AOT_METRICS_PORT"
#: The address it listens on (default :data:`DEFAULT_ADDR`; ``0.0.0.0`` for a Prometheus
#: on another host).
ENV_ADDR = "AOT_METRICS_ADDR"
#: Loopback by default: exposing a port to the network is the operator's decision.
DEFAULT_ADDR = "127.0.0.1"

#: Load-latency buckets (seconds): a small executable loads in a millisecond, a large
#: sharded one in seconds (a blob fetched from object storage included).
LOAD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: The series a serving process exposes (names as scraped, without histogram suffixes).
METRICS = (
    "aot_loads_total", "aot_load_seconds", "aot_compile_saved_seconds_total", "aot_hits_total",
    "aot_misses_total", "aot_fallbacks_total", "aot_recompiles_total", "aot_recompile_seconds_total",
    "aot_quarantines_total", "aot_release_info",
)

EXTRA_HINT = "pip install 'jax-aot[metrics]'"
LABELS = ("name", "release")


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise MetricsError(
            f"Prometheus metrics need the prometheus_client package, which is not installed "
            f"({exc}); install it with `{EXTRA_HINT}`"
        ) from exc
    return prometheus_client


class _Hits:
    """``aot_hits_total``: read when scraped, so a call costs the dispatcher's one
    increment and nothing here (the recorder hands over the calls counted since)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}

    def add(self, name: str, release: str, count: int) -> None:
        with self._lock:
            self._counts[(name, release)] = self._counts.get((name, release), 0) + count

    def describe(self) -> list[Any]:
        return [self._family()]

    def _family(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        return CounterMetricFamily("aot_hits", "Calls served by a stored executable (aot stats CALLS).",
                                   labels=LABELS)

    def collect(self) -> Iterator[Any]:
        report_calls()  # the calls counted since the last flush reach add() now
        family = self._family()
        with self._lock:
            for (name, release), count in sorted(self._counts.items()):
                family.add_metric([name, release], count)
        yield family


class MetricsExporter:
    """The serving metrics of this process on one ``prometheus_client`` registry
    (module docstring); a listener of :mod:`aot.cache.serving_events`."""

    def __init__(self, registry: Any = None) -> None:
        client = _client()
        self.registry = registry if registry is not None else client.REGISTRY
        r = self.registry
        self.loads = client.Counter("aot_loads", "Executables loaded from the cache instead of compiled "
                                    "(JAX: a persistent-cache hit).", LABELS, registry=r)
        self.load_seconds = client.Histogram(
            "aot_load_seconds", "Time to load one executable from the cache (blob reads, deserialization).",
            LABELS, buckets=LOAD_BUCKETS, registry=r)
        self.saved = client.Counter("aot_compile_saved_seconds", "Stored compile time of the executables "
                                    "loaded instead of compiled.", LABELS, registry=r)
        self.misses = client.Counter("aot_misses", "Calls whose signature had no stored executable "
                                     "(fallbacks included).", LABELS, registry=r)
        self.fallbacks = client.Counter("aot_fallbacks", "Misses compiled by aot.load's fallback function.",
                                        LABELS, registry=r)
        self.recompiles = client.Counter("aot_recompiles", "Executables compiled from stored portable HLO.",
                                         LABELS, registry=r)
        self.recompile_seconds = client.Counter("aot_recompile_seconds", "Time spent compiling from stored "
                                                "portable HLO.", LABELS, registry=r)
        self.quarantines = client.Counter("aot_quarantines", "Stored executables proven corrupt and refused.",
                                          LABELS, registry=r)
        self.release = client.Info("aot_release", "The release label this process serves for a name "
                                   "(\"\": the name's refs).", ("name",), registry=r)
        self.hits = _Hits()
        r.register(self.hits)
        add_listener(self)

    def __call__(self, event: StatsEvent) -> None:
        labels = (event.name, event.release)
        kind = event.kind
        if kind == "calls":
            self.hits.add(event.name, event.release, event.count)
        elif kind == "load":
            self.loads.labels(*labels).inc()
            self.load_seconds.labels(*labels).observe(event.seconds)
            if event.saved_seconds is not None:
                self.saved.labels(*labels).inc(max(event.saved_seconds, 0.0))
        elif kind in ("miss", "fallback"):
            self.misses.labels(*labels).inc()
            if kind == "fallback":
                self.fallbacks.labels(*labels).inc()
        elif kind == "recompile":
            self.recompiles.labels(*labels).inc()
            self.recompile_seconds.labels(*labels).inc(event.seconds)
        elif kind == "quarantine":
            self.quarantines.labels(*labels).inc()
        elif kind == "serve":
            self.release.labels(event.name).info({"release": event.release})
            # Every series of the name from the first scrape on, at 0: rate() and
            # increase() need a sample before a counter's first event to count it.
            for metric in (self.loads, self.load_seconds, self.saved, self.misses, self.fallbacks,
                           self.recompiles, self.recompile_seconds, self.quarantines):
                metric.labels(*labels)
            self.hits.add(event.name, event.release, 0)

    def close(self) -> None:
        """Stops listening and takes the series off the registry."""
        remove_listener(self)
        with _LOCK:
            if _EXPORTERS.get(id(self.registry)) is self:
                del _EXPORTERS[id(self.registry)]
        for collector in (self.loads, self.load_seconds, self.saved, self.misses, self.fallbacks,
                          self.recompiles, self.recompile_seconds, self.quarantines, self.release, self.hits):
            try:
                self.registry.unregister(collector)
            except KeyError:
                pass


_LOCK = threading.Lock()
_EXPORTERS: dict[int, MetricsExporter] = {}


def enable_metrics(registry: Any = None) -> MetricsExporter:
    """Exports this process's serving metrics on ``registry`` (default: prometheus_client's
    own); once per registry, so calling it again returns the same exporter."""
    client = _client()
    target = registry if registry is not None else client.REGISTRY
    with _LOCK:
        exporter = _EXPORTERS.get(id(target))
        if exporter is None:
            exporter = _EXPORTERS[id(target)] = MetricsExporter(target)
        return exporter


@dataclass(frozen=True, slots=True)
class MetricsServer:
    """An HTTP endpoint serving ``/metrics`` and ``/ready`` (:func:`serve_metrics`)."""

    addr: str
    port: int
    server: Any = field(repr=False, compare=False)
    thread: Any = field(repr=False, compare=False)

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    @property
    def ready_url(self) -> str:
        """The readiness endpoint beside ``/metrics`` (:mod:`aot.cache.serving.readiness`)."""
        return self.url.removesuffix("/metrics") + "/ready"

    def close(self) -> None:
        """Stops serving (the metrics keep counting)."""
        self.server.shutdown()
        self.server.server_close()
        with _LOCK:
            for key, running in list(_SERVERS.items()):
                if running is self:
                    del _SERVERS[key]


_SERVERS: dict[tuple[str, int], MetricsServer] = {}


def serve_metrics(port: int, addr: str = DEFAULT_ADDR, *, registry: Any = None) -> MetricsServer:
    """Serves this process's metrics at ``http://ADDR:PORT/metrics``, and its readiness
    at ``/ready`` (:mod:`aot.cache.serving.readiness`), from a daemon thread
    (``port=0``: a free port, see ``.port``); the same server when asked twice
    for one address and port. Raises :class:`~aot.errors.MetricsError` without
    prometheus_client or when the port is taken."""
    client = _client()
    enable_metrics(registry)
    with _LOCK:
        running = _SERVERS.get((addr, port))
        if running is not None:
            return running
        try:
            server, thread = _start_server(client, port, addr, registry if registry is not None else client.REGISTRY)
        except OSError as exc:
            raise MetricsError(
                f"cannot serve metrics on {addr}:{port}: {exc}; choose a free port "
                f"({ENV_PORT}=PORT, or aot.serve_metrics(port=...))"
            ) from exc
        started = MetricsServer(addr, int(server.server_port), server, thread)
        _SERVERS[(addr, port)] = started
        if port == 0:
            _SERVERS[(addr, started.port)] = started
    log.info("serving Prometheus metrics at %s", started.url)
    return started


def _app(client: Any, registry: Any) -> Callable[..., Any]:
    """prometheus_client's WSGI app, with ``/ready``: 200 when this process serves
    everything it declared, else 503, with the state of each name in the body."""
    metrics_app = client.make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/ready":
            return metrics_app(environ, start_response)
        from aot.cache.serving.readiness import readiness

        state = readiness()
        body = (state.describe() + "\n").encode()
        start_response("200 OK" if state.ready else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
        return [body]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Not a line on stderr per scrape and probe (prometheus_client's server is silent too)."""


def _start_server(client: Any, port: int, addr: str, registry: Any) -> tuple[WSGIServer, threading.Thread]:
    """What ``prometheus_client.start_http_server`` starts (a threading WSGI server on a
    daemon thread), serving :func:`_app`: its own server has no room for ``/ready``."""

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET

    server = make_server(addr, port, _app(client, registry), Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="aot-metrics", daemon=True)
    thread.start()
    return server, thread


def serve_metrics_from_env(environ: Mapping[str, str] | None = None) -> MetricsServer | None:
    """:func:`serve_metrics` on ``$AOT_METRICS_PORT`` (and ``$AOT_METRICS_ADDR``); None
    when the port is not set. ``import aot`` calls it (so ``/ready`` answers 503 before
    the first load, not a refused port), and ``aot.load`` again (raising what the import
    only logged), so a serving process needs no code."""
    env = os.environ if environ is None else environ
    text = env.get(ENV_PORT, "").strip()
    if not text:
        return None
    try:
        port = int(text)
        if not 0 <= port <= 65535:
            raise ValueError(text)
    except ValueError:
        raise MetricsError(
            f"{ENV_PORT}={text!r} is not a port: expected a number from 1 to 65535 "
            f"(or unset it to serve no metrics)"
        ) from None
    return serve_metrics(port, env.get(ENV_ADDR, "").strip() or DEFAULT_ADDR)


# ---------------------------------------------------------------- the index's totals

#: ``aot stats --prometheus``: counter -> (series, help). Labels ``name``, ``env`` (the
#: environment digest's first 12 characters), ``target`` (what the environment is for:
#: ``tpu:v5e:2x2``, ``cpu x8``; "" unknown) and ``release`` (the labels whose current set
#: has the signature, comma-separated; "" none), summed over signatures.
INDEX_METRICS = {
    "calls": ("aot_index_calls", "Calls served, as recorded in the cache's index."),
    "loads": ("aot_index_loads", "Executables loaded from the cache."),
    "load_seconds": ("aot_index_load_seconds", "Time spent loading executables."),
    "saved_seconds": ("aot_index_compile_saved_seconds", "Stored compile time of the loaded executables."),
    "misses": ("aot_index_misses", "Calls whose signature had no stored executable."),
    "recompiles": ("aot_index_recompiles", "Executables compiled from stored portable HLO."),
    "recompile_seconds": ("aot_index_recompile_seconds", "Time spent compiling from portable HLO."),
}
JIT_METRICS = {
    "hits": ("aot_index_jit_hits", "Hits of JAX's persistent cache through aot.jax_cache."),
    "misses": ("aot_index_jit_misses", "Misses of JAX's persistent cache through aot.jax_cache."),
    "saved_seconds": ("aot_index_jit_compile_saved_seconds", "Compile time the jit hits saved."),
}


INDEX_LABELS = ("name", "env", "target", "release")


class _IndexTotals:
    def __init__(self, report: StatsReport, releases: Mapping[tuple[str, str, str], str]) -> None:
        self.report = report
        self.releases = releases

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        sums: dict[tuple[str, str, str, str], dict[str, float]] = {}
        for row in self.report.rows:
            labels = (row.name, row.env_fp[:12], self.report.target(row) or "",
                      self.releases.get((row.name, row.signature, row.env_fp), ""))
            totals = sums.setdefault(labels, dict.fromkeys(INDEX_METRICS, 0.0))
            for counter in INDEX_METRICS:
                totals[counter] += getattr(row, counter)
        for counter, (series, text) in INDEX_METRICS.items():
            family = CounterMetricFamily(series, text, labels=INDEX_LABELS)
            for labels, totals in sorted(sums.items()):
                family.add_metric(list(labels), totals[counter])
            yield family
        for counter, (series, text) in JIT_METRICS.items():
            family = CounterMetricFamily(series, text, labels=("name",))
            for jit in self.report.jit:
                family.add_metric([jit.name], getattr(jit, counter))
            yield family


def index_exposition(report: StatsReport, releases: Mapping[tuple[str, str, str], str] | None = None) -> str:
    """``report``'s totals in Prometheus's text exposition format (for node_exporter's
    textfile collector or a Pushgateway). ``releases``: (name, signature, env_fp) -> the
    ``release`` label (:func:`aot.cache.reports.stats.release_memberships`)."""
    client = _client()
    registry = client.CollectorRegistry(auto_describe=False)
    registry.register(_IndexTotals(report, releases or {}))
    return client.generate_latest(registry).decode()
