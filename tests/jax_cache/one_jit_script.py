"""One ``jax.jit`` compile, for the compile-claim tests (``python -m aot.cache.jax_cache
one_jit_script.py OUT SCALE``): writes OUT (JSON) with JAX's compilation-cache events
(``jax.monitoring``), the result and the backend's counts. SCALE makes the program
one no other test compiled."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np

events: dict[str, int] = {}


def _count(event: str, **_: object) -> None:
    if event.startswith("/jax/compilation_cache/"):
        events[event] = events.get(event, 0) + 1


jax.monitoring.register_event_listener(_count)


def main(out: str, scale: float) -> None:
    @jax.jit
    def scaled(x: jax.Array) -> jax.Array:
        return x * scale + 1

    result = np.asarray(scaled(np.arange(4, dtype=np.float32)))
    import aot

    backend = aot.jax_cache.installed()
    with open(out, "w") as f:
        json.dump({
            "events": events, "result": result.tolist(),
            "backend": backend.counts.to_dict() if backend is not None else None,
        }, f)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
