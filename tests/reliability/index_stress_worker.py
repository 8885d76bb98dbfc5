"""Child processes of tests/reliability/test_index_stress.py (``python THIS COMMAND ...``).

Commands:
  serve FOLDER SECONDS END
      serves ``rel.tiny`` f32[1..3] from the folder cache as a replica does
      (``aot.load(..., strict=True)``, read-ahead on: the default) for SECONDS, its
      statistics flushed every 0.2 s by the library's flusher; prints the calls it
      made per size; then ends with ``Cache.close()`` (END=close) or at interpreter
      exit (END=exit). END=kill: no periodic flush, and the one flush at the end is
      killed inside its transaction (the parent sets ``AOT_TEST_PAUSE=stats.flushing=kill``).
  write FOLDER ROUND
      the writers between servers: a warm-up (``Cache.compile`` of f32[10+ROUND]),
      ``aot rm`` of the previous round's entry, ``aot gc``.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

SIZES = (1, 2, 3)
NAME = "rel.tiny"


def serve(folder: str, seconds: float, end: str) -> None:
    import numpy as np

    import aot
    from aot.cache import stats_recorder

    # Many flushes, each a connection opened and closed: the race of issue 49.
    stats_recorder.FLUSH_SECONDS = None if end == "kill" else 0.2
    cache = aot.Cache(folder)
    fn = aot.load(NAME, cache=cache, strict=True)
    inputs = {n: np.arange(n, dtype=np.float32) for n in SIZES}
    calls = dict.fromkeys(SIZES, 0)
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        n = SIZES[i % len(SIZES)]
        fn(inputs[n])
        calls[n] += 1
        i += 1
        if i % 500 == 0:
            time.sleep(0.002)
    print(json.dumps({str(n): c for n, c in calls.items()}), flush=True)
    if end == "close":
        cache.close()
    elif end == "kill":
        cache.stats.flush()  # killed at stats.flushing, its transaction open
        raise SystemExit("the flush was not killed: is AOT_TEST_PAUSE set?")


def write(folder: str, round_: int) -> None:
    from click.testing import CliRunner

    import aot
    from aot.cli.main import cli

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from tests.reliability.reliability_workers import scaled

    with aot.Cache(folder) as cache:
        cache.compile(scaled, aot.spec(f"f32[{10 + round_}]"), name=NAME)
        previous = [e.key for e in cache.entries(NAME) if f"[{10 + round_ - 1}]" in e.signature]
    for args in ([["rm", key, "--yes"] for key in previous] + [["gc"]]):
        result = CliRunner().invoke(cli, ["--cache", folder, *args])
        assert result.exit_code == 0, (args, result.output)


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "serve":
        serve(rest[0], float(rest[1]), rest[2])
    elif command == "write":
        write(rest[0], int(rest[1]))
    else:
        raise SystemExit(f"unknown command {command!r}")
