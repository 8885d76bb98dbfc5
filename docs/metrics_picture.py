"""Makes docs/metrics-prometheus.png: Prometheus's own graph page, from a real scrape of a
serving process, screenshotted with headless Chromium.

To re-make the picture (about a minute), from the repository root, with the project's
virtual environment and Debian's packages (``apt-get install -y prometheus chromium``;
``pngquant`` is used when present and the picture is over 300 KB)::

    .venv/bin/python docs/metrics_picture.py                 # writes docs/metrics-prometheus.png
    .venv/bin/python docs/metrics_picture.py --out x.png --seconds 40

What it does:

1. starts Prometheus on loopback (a throw-away TSDB), scraping every second;
2. starts a serving process (this file with ``--serve``) with ``AOT_METRICS_PORT``: it
   builds a small cache (``tiny`` and ``mlp.forward`` from fixtures/models.py), loads
   both with ``aot.load`` (the exporter is started by the variable, no code), then calls
   them for ``--seconds`` at rates that change every few seconds, and calls
   ``mlp.forward`` once with a batch size that was never compiled (one miss);
3. checks through Prometheus's query API that it scraped what was called (both names,
   the one miss), then screenshots the classic graph page (Debian's Prometheus 2.42
   serves the classic UI at ``/classic/graph``) with two graphs:
   ``sum by (name) (rate(aot_hits_total[5s]))`` and ``aot_misses_total``.

Every wait is bounded; both processes are killed in ``finally``. Not a project
dependency and not a test (tests/cache/serving/test_prometheus_scrape.py is the test).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "metrics-prometheus.png"
MAX_BYTES = 300_000
#: (seconds from the start of the loop, calls/s of tiny, calls/s of mlp.forward)
PHASES = ((0, 40, 10), (8, 120, 10), (16, 80, 40), (24, 160, 25), (32, 30, 60))
MISS_AT = 20.0
QUERIES = ("sum by (name) (rate(aot_hits_total[5s]))", "aot_misses_total")


def serve(cache_dir: str, seconds: float) -> None:
    """The serving process: build, load, say READY, call at the PHASES' rates, say DONE,
    stay up (and scraped) until stdin closes."""
    import numpy as np

    import aot
    from fixtures import models

    builder = aot.Cache(cache_dir)
    builder.compile(models.tiny, *models.tiny_specs(), name="tiny")
    builder.compile(models.mlp_forward, models.mlp_param_specs(), models.mlp_input_spec(8), name="mlp.forward")
    builder.close()
    cache = aot.Cache(cache_dir)
    tiny, mlp = aot.load("tiny", cache=cache), aot.load("mlp.forward", cache=cache)
    tiny_args, params, batch = models.tiny_inputs(), models.mlp_init(), models.mlp_input(8)
    print("READY", flush=True)
    start = time.monotonic()
    due = {"tiny": start, "mlp": start}
    missed = False
    while (now := time.monotonic()) - start < seconds:
        elapsed = now - start
        _, tiny_rate, mlp_rate = [p for p in PHASES if p[0] <= elapsed][-1]
        if now >= due["tiny"]:
            np.asarray(tiny(*tiny_args))
            due["tiny"] = max(due["tiny"] + 1 / tiny_rate, now - 1)
        if now >= due["mlp"]:
            np.asarray(mlp(params, batch))
            due["mlp"] = max(due["mlp"] + 1 / mlp_rate, now - 1)
        if not missed and elapsed >= MISS_AT:
            missed = True
            try:
                mlp(params, models.mlp_input(3))  # batch 3 was never compiled: a miss
            except aot.SignatureNotFoundError:
                pass
        time.sleep(max(0.0, min(due.values()) - time.monotonic()))
    print("DONE", flush=True)
    sys.stdin.read()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return bytes(reply.read())


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    body = json.loads(_get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})))
    if body.get("status") != "success":
        raise RuntimeError(f"query {promql!r} failed: {body}")
    return list(body["data"]["result"])


def _wait_line(proc: subprocess.Popen[str], expected: str, timeout: float) -> None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().strip() if ready else ""
    if line != expected:
        err = proc.stderr.read() if proc.stderr is not None and proc.poll() is not None else ""
        raise RuntimeError(f"the serving process did not say {expected} within {timeout:.0f} s "
                           f"(said {line!r}) {err}")


def _stop(proc: subprocess.Popen[Any] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def graph_url(base: str, range_input: str = "1m") -> str:
    params: dict[str, str] = {}
    for i, expr in enumerate(QUERIES):
        params |= {f"g{i}.expr": expr, f"g{i}.tab": "0", f"g{i}.stacked": "0", f"g{i}.range_input": range_input}
    return f"{base}/classic/graph?" + urllib.parse.urlencode(params)


def make_picture(out: Path, seconds: float) -> None:
    prometheus_bin, chromium_bin = shutil.which("prometheus"), shutil.which("chromium")
    if prometheus_bin is None or chromium_bin is None:
        raise SystemExit("needs Debian's prometheus and chromium: apt-get install -y prometheus chromium")
    metrics_port, prometheus_port = _free_port(), _free_port()
    base = f"http://127.0.0.1:{prometheus_port}"
    serving = prometheus = None
    with tempfile.TemporaryDirectory(prefix="aot-metrics-picture-") as tmp_name:
        tmp = Path(tmp_name)
        config = tmp / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: aot\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
        )
        try:
            prometheus = subprocess.Popen(
                [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prometheus_port}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            env = {**os.environ, "AOT_METRICS_PORT": str(metrics_port), "PYTHONPATH": str(REPO),
                   "JAX_PLATFORMS": "cpu"}
            serving = subprocess.Popen(
                [sys.executable, __file__, "--serve", str(tmp / "cache"), "--seconds", str(seconds)],
                cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True,
            )
            _wait_line(serving, "READY", 300)  # compiles two programs first
            _wait_line(serving, "DONE", seconds + 120)
            time.sleep(3)  # the last scrapes
            hits = {r["metric"].get("name"): float(r["value"][1]) for r in _query(base, "aot_hits_total")}
            misses = _query(base, "aot_misses_total")
            if set(hits) != {"tiny", "mlp.forward"} or [float(m["value"][1]) for m in misses] != [1.0]:
                raise RuntimeError(f"Prometheus did not scrape what was called: hits {hits}, misses {misses}")
            print(f"scraped: hits {hits}, misses 1", file=sys.stderr)
            shot = tmp / "shot.png"
            subprocess.run(
                [chromium_bin, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 f"--user-data-dir={tmp / 'chromium'}", f"--screenshot={shot}", "--window-size=1200,1560",
                 "--virtual-time-budget=15000", graph_url(base)],
                check=True, timeout=120, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            if shot.stat().st_size > MAX_BYTES and shutil.which("pngquant"):
                subprocess.run(["pngquant", "--force", "--output", str(shot), "--", str(shot)], check=True,
                               timeout=60)
            shutil.copyfile(shot, out)
            print(f"wrote {out} ({out.stat().st_size} bytes)", file=sys.stderr)
        finally:
            if serving is not None and serving.stdin is not None:
                serving.stdin.close()
            _stop(prometheus)
            _stop(serving)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--serve", metavar="CACHE_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.seconds)
    else:
        make_picture(args.out, args.seconds)


if __name__ == "__main__":
    main()
