"""What checking every manifest field costs: at load time and in ``aot verify``.

    python benchmarks/bench_checks.py [--runs 7]

For programs from a tiny jit to a 2,000-op unrolled chain, stored in a temporary
folder cache, prints the median of ``--runs`` measurements of:

* ``deserialize``: XLA turning the executable bytes into a loaded executable (what a
  load costs anyway);
* ``pure``: :func:`aot.artifact.manifest_problems` (the manifest against its
  fingerprints);
* ``executable``: :func:`aot.executable_checks.executable_problems` (per-device parameter and
  result shapes from the HLO module's header, shardings, output memory kinds);
* ``load``: the whole :meth:`Cache.load` (digest, checks, deserialize, rehydrate);
* ``verify``: the consistency part of ``aot verify`` for the entry (reads the
  portable HLO and the executable, deserializes, all checks).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))


def programs() -> dict[str, Callable[[Any], Any]]:
    import jax
    import jax.numpy as jnp

    import aot
    from fixtures import models

    def chain(x: Any) -> Any:
        for i in range(2000):
            x = jnp.sin(x) * (i + 1.0) + jnp.cos(x[::-1])
        return x

    return {
        "tiny f32[8]": lambda cache: cache.compile(lambda x: x * 2.0 + 1.0, aot.spec("f32[8]"), name="b.tiny"),
        "mlp batch 8": lambda cache: cache.compile(
            models.mlp_forward, models.mlp_param_specs(), models.mlp_input_spec(8), name="b.mlp"),
        "mlp 4x2 mesh": lambda cache: cache.compile(
            models.sharded_mlp, *models.sharded_mlp_specs(), name="b.sharded",
            in_shardings=models.sharded_mlp_shardings()),
        "transformer step": lambda cache: cache.compile(
            models.transformer_train_step, models.transformer_param_specs(),
            models.transformer_batch_spec(), name="b.transformer"),
        "2000-op chain": lambda cache: cache.compile(
            chain, jax.ShapeDtypeStruct((128,), jnp.float32), name="b.chain"),
    }


def median_ms(fn: Callable[[], Any], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs

    from aot.artifact import EXECUTABLE, manifest_problems
    from aot.cache.cache import Cache
    from aot.cache.admin.maintenance import consistency_problems
    from aot.executable_checks import executable_problems
    from aot.rehydrate import executable_info
    from aot.shardings import device_list, live_devices

    rows = []
    with tempfile.TemporaryDirectory(prefix="aot-bench-checks-") as tmp:
        with Cache(Path(tmp) / "cache") as cache:
            for label, build in programs().items():
                executable = build(cache)
                entry = cache.index.get(executable.key)
                artifact = cache.artifact(entry)
                manifest = artifact.manifest
                data = artifact.blob(EXECUTABLE)
                devices = live_devices()
                dlist = device_list(manifest.device_ids, devices)
                client = devices[manifest.device_ids[0]].client
                loaded = client.deserialize_executable(data, dlist)
                info = executable_info(manifest)
                assert manifest_problems(manifest) == [] and executable_problems(manifest, info, loaded) == []
                rows.append((
                    label,
                    len(loaded.hlo_modules()[0].to_string()) // 1024,
                    median_ms(lambda: client.deserialize_executable(data, dlist), runs),
                    median_ms(lambda: manifest_problems(manifest), runs),
                    median_ms(lambda: executable_problems(manifest, info, loaded), runs),
                    median_ms(lambda: cache.load(entry), runs),
                    median_ms(lambda: consistency_problems(cache, entry), runs),
                ))
    print(f"median of {runs} runs, ms; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| program | HLO text KiB | deserialize | pure checks | executable checks | whole load | verify consistency |")
    print("|---|---|---|---|---|---|---|")
    for label, kib, *times in rows:
        print(f"| {label} | {kib} | " + " | ".join(f"{t:.2f}" for t in times) + " |")


if __name__ == "__main__":
    main()
