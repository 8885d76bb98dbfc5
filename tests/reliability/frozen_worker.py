"""A serving process for the frozen-dependency tests (run as a script).

  serve INDEX_URL BLOB_LOCATION
      loads ``rel.frozen`` lazily, calls f32[1] (loaded), says ``ready`` and waits for a
      line on stdin (the test freezes the index meanwhile); then calls the loaded
      program 200 times, calls f32[2] for the first time (a lazy bucket whose blobs
      are on a healthy store), says what it measured as JSON, and exits: the exit
      flush of the call statistics meets the frozen index.
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

NAME = "rel.frozen"


def scaled(x):  # noqa: ANN001, ANN201
    return x * 2.0 + 1.0


def populate(url: str, blob_location: str) -> None:
    import aot

    cache = aot.Cache(url, blob_location=blob_location)
    try:
        for n in (1, 2):
            cache.put(aot.lower(scaled, aot.spec(f"f32[{n}]"), name=NAME).compile())
    finally:
        cache.close()


def serve(url: str, blob_location: str) -> int:
    import jax.numpy as jnp
    import numpy as np

    import aot
    from aot.cache import stats_recorder as stats

    stats.FLUSH_SECONDS = 0.2  # the flusher is inside a write when the index freezes
    cache = aot.Cache(url, blob_location=blob_location)
    fn = aot.load(NAME, cache=cache, lazy=True)
    x1, x2 = jnp.arange(1, dtype=jnp.float32), jnp.arange(2, dtype=jnp.float32)
    np.testing.assert_allclose(np.asarray(fn(x1)), [1.0])
    print("ready", flush=True)
    sys.stdin.readline()
    time.sleep(0.5)  # lets the flusher start a write into the frozen index
    start = time.monotonic()
    for _ in range(200):
        out = fn(x1)
    np.testing.assert_allclose(np.asarray(out), [1.0])
    served = time.monotonic() - start
    start = time.monotonic()
    np.testing.assert_allclose(np.asarray(fn(x2)), [1.0, 3.0])
    lazy = time.monotonic() - start
    print(json.dumps({"served_200_s": served, "lazy_first_call_s": lazy}), flush=True)
    return 0


def read(index: str, blob_location: str) -> int:
    """Loads ``rel.frozen`` eagerly (its blobs on a frozen store); says the outcome as JSON."""
    import aot

    start = time.monotonic()
    try:
        cache = aot.Cache(index, blob_location=blob_location, read_only=True)
        aot.load(NAME, cache=cache)
        outcome = {"ok": True}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    outcome["seconds"] = time.monotonic() - start
    print(json.dumps(outcome), flush=True)
    return 0


def tiered(index: str, blob_location: str, local: str) -> int:
    """Opens the remote through the local tier, loads ``rel.frozen`` eagerly and calls
    both buckets; says the seconds (open + load, and the calls) as JSON."""
    import jax.numpy as jnp
    import numpy as np

    import aot

    start = time.monotonic()
    cache = aot.Cache(index, blob_location=blob_location, read_only=True, local=local)
    fn = aot.load(NAME, cache=cache)
    started = time.monotonic() - start
    np.testing.assert_allclose(np.asarray(fn(jnp.arange(1, dtype=jnp.float32))), [1.0])
    np.testing.assert_allclose(np.asarray(fn(jnp.arange(2, dtype=jnp.float32))), [1.0, 3.0])
    print(json.dumps({"start_s": started, "total_s": time.monotonic() - start}), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "populate":
        populate(*sys.argv[2:4])
        sys.exit(0)
    if sys.argv[1] == "tiered":
        sys.exit(tiered(*sys.argv[2:5]))
    if sys.argv[1] == "read":
        sys.exit(read(*sys.argv[2:4]))
    sys.exit(serve(*sys.argv[2:4]))
