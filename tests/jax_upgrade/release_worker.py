"""A process of one JAX release, run by tests/jax_upgrade under this release's Python or
another's (``AOT_TEST_OTHER_JAX_PYTHON``): ``python release_worker.py COMMAND LOCATION
[OPTIONS]``, from the repository root; prints one JSON line.

- ``serve LOCATION [--release L] [--strict]``: ``aot.load`` of every name of the
  manifest (tiny, mlp.forward) and a call of each, compared bit for bit with this
  release's own ``jax.jit``; the entries before and after (a strict load stores none).
- ``jit LOCATION``: JAX's persistent cache through ``aot.jax_cache``: ``jax.jit`` of the
  same functions, with this process's hits, misses and puts.
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import numpy as np

from fixtures import models


def _inputs() -> dict[str, tuple[object, ...]]:
    # From numpy, not jax.random: the same values under every release.
    rng = np.random.default_rng(0)
    params = [
        {"b": (0.1 * rng.standard_normal(n_out)).astype(np.float32),
         "w": (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)}
        for n_in, n_out in zip(models.MLP_SIZES[:-1], models.MLP_SIZES[1:])
    ]
    x = rng.standard_normal((8, models.MLP_SIZES[0])).astype(np.float32)
    return {
        "tiny": (np.arange(8, dtype=np.float32), np.full((8,), 2.0, np.float32)),
        "mlp.forward": (params, x),
    }


FUNCTIONS = {"tiny": models.tiny, "mlp.forward": models.mlp_forward}


def serve(location: str, release: str | None, strict: bool) -> dict[str, object]:
    import aot

    with aot.Cache(location) as cache:
        before = sorted(e.key for e in cache.entries())
        results = {}
        for name, args in _inputs().items():
            out = np.asarray(aot.load(name, cache=cache, release=release, strict=strict)(*args))
            expected = np.asarray(jax.jit(FUNCTIONS[name])(*args))
            results[name] = {"identical": out.tobytes() == expected.tobytes(), "dtype": str(out.dtype)}
        after = sorted(e.key for e in cache.entries())
    return {"jax": jax.__version__, "results": results, "entries_before": before, "entries_after": after}


def jit(location: str) -> dict[str, object]:
    import aot

    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    backend = aot.jax_cache.install(location)
    results = {}
    for name, args in _inputs().items():
        out = np.asarray(jax.jit(FUNCTIONS[name])(*args))
        results[name] = out.tobytes().hex()
    counts = backend.counts.to_dict()
    aot.jax_cache.uninstall()
    return {"jax": jax.__version__, "counts": counts, "results": results}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve", "jit"])
    parser.add_argument("location")
    parser.add_argument("--release")
    parser.add_argument("--strict", action="store_true")
    ns = parser.parse_args(argv)
    out = serve(ns.location, ns.release, ns.strict) if ns.command == "serve" else jit(ns.location)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
