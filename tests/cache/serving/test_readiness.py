"""/ready beside /metrics (aot.cache.serving.readiness): 503 until every name the
process loads or declared is loaded, 200 then. The loads are held at the pause point
``serve.loading`` (aot.cache.pauses), so the probe lands while they are under way."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

import aot
from aot.cache import pauses
from aot.cache.serving import metrics, readiness


@pytest.fixture
def server() -> Iterator[metrics.MetricsServer]:
    readiness.reset()  # other tests' loads are not this process's start-up
    registry = CollectorRegistry()
    exporter = metrics.enable_metrics(registry)
    started = metrics.serve_metrics(0, registry=registry)
    try:
        yield started
    finally:
        started.close()
        exporter.close()
        readiness.reset()


def probe(server: metrics.MetricsServer) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(server.ready_url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class Held:
    """Holds every load at ``serve.loading`` until :meth:`release`."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.go = threading.Event()

    def __call__(self, point: str) -> None:
        if point == "serve.loading":
            self.arrived.set()
            assert self.go.wait(30), "the test never released the load"

    def release(self) -> None:
        self.go.set()


@pytest.fixture
def held() -> Iterator[Held]:
    hold = Held()
    previous = pauses.set_hook(hold)
    try:
        yield hold
    finally:
        hold.release()
        pauses.set_hook(previous)


def test_a_background_load_is_not_ready_until_it_has_loaded(server, held, open_folder_cache, compiled) -> None:  # noqa: ANN001
    assert probe(server) == (503, "not ready: nothing loaded yet\n")
    cache = open_folder_cache()
    cache.put(compiled.tiny)
    fn = aot.load(compiled.TINY_NAME, cache=cache, background=True)
    assert held.arrived.wait(30)
    assert probe(server) == (503, "not ready: tiny loading in background\n")
    held.release()
    assert fn.wait(30)
    assert probe(server) == (200, "ready: tiny loaded\n")
    assert b"aot_loads_total" in urllib.request.urlopen(server.url, timeout=10).read()  # /metrics still there


def test_an_eager_load_and_a_declared_name_hold_readiness_back(  # noqa: ANN001
    server, held, open_folder_cache, compiled, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(readiness.ENV_NAMES, f"{compiled.MLP_NAME}, {compiled.TINY_NAME}")
    cache = open_folder_cache()
    cache.put(compiled.tiny)
    cache.put(compiled.mlp[1])
    served = []  # the process keeps what it serves (a dropped dispatcher holds nothing back)
    loading = threading.Thread(target=lambda: served.append(aot.load(compiled.TINY_NAME, cache=cache, background=False)))
    loading.start()
    assert held.arrived.wait(30)
    assert probe(server) == (503, "not ready: mlp.forward not loaded yet, tiny loading\n")
    held.release()
    loading.join(30)
    assert probe(server) == (503, "not ready: mlp.forward not loaded yet, tiny loaded\n")
    kept = aot.load(compiled.MLP_NAME, cache=cache, lazy=True)
    assert probe(server) == (200, "ready: mlp.forward lazy, tiny loaded\n")
    with pytest.raises(aot.SignatureNotFoundError):
        aot.load("nope", cache=cache)
    assert probe(server) == (503, "not ready: mlp.forward lazy, nope failed, tiny loaded\n")
    assert kept is not None and len(served) == 1


#: A serving process: `import aot` (AOT_METRICS_PORT set), then waits for a line on its
#: stdin before loading `tiny` from the cache its argument names.
_SERVING = """
import sys
import aot
print("IMPORTED", flush=True)
sys.stdin.readline()
fn = aot.load("tiny", cache=sys.argv[1])
print("LOADED", flush=True)
sys.stdin.readline()
"""


def test_ready_answers_503_from_import_until_the_first_load(tmp_path, compiled) -> None:  # noqa: ANN001
    """With AOT_METRICS_PORT set, a readiness probe gets 503 from `import aot` on, not a
    refused port before the first aot.load, then 200 once it loaded."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import free_port

    with aot.Cache(tmp_path / "c") as cache:
        cache.put(compiled.tiny)
    port = free_port()
    url = f"http://127.0.0.1:{port}/ready"
    env = {**os.environ, "AOT_METRICS_PORT": str(port)}
    env.pop(readiness.ENV_NAMES, None)
    root = Path(__file__).resolve().parents[3]
    with subprocess.Popen([sys.executable, "-c", _SERVING, str(tmp_path / "c")], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, env=env, cwd=root) as process:
        try:
            assert process.stdout is not None and process.stdin is not None
            assert process.stdout.readline() == "IMPORTED\n"
            assert _get(url) == (503, "not ready: nothing loaded yet\n")
            process.stdin.write("load\n")
            process.stdin.flush()
            assert process.stdout.readline() == "LOADED\n"
            assert _get(url) == (200, "ready: tiny loaded\n")
        finally:
            process.kill()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
