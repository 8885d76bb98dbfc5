"""Serve every entry of a manifest from a cache compiled elsewhere, next to jax.jit.

    python3 -P tests/accelerator/serve_cpu_compiled.py --cache PATH --manifest fixtures/tpu_target.toml

For a cache compiled on another machine (e.g. on a CPU host with
``aot warmup --target tpu:v5e:1x1 MANIFEST``): for every entry the manifest expands
to, this imports the entry's function and arg specs with the warm-up's own parser
(aot.cache.warmup.manifest / targets), makes random inputs with a fixed seed, runs
``aot.load(name, cache=PATH, strict=True)`` and ``jax.jit(fn)`` (``jax.pmap`` for a
``pmap`` entry) on this host's devices, and prints one line per entry: name,
signature, and whether the outputs are bit-identical. Exit status 1 on any mismatch
or failure. Any platform: on a CPU host it checks a cache compiled on a CPU.

Not a pytest module (no ``test_`` prefix): it holds the device for its whole run, so
run it alone. Run it from the repository root (the manifest's targets import from
there); ``-P`` keeps the checkout's ``aot/`` folder (which lacks ``aot.cache``) from
shadowing the installed package.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def random_inputs(specs: Any, seed: int) -> Any:
    """Arrays shaped like ``specs`` (a pytree of ShapeDtypeStruct), put where their
    sharding says; integers small (token ids, indices), floats standard normal."""
    import jax
    import numpy as np

    rng = np.random.default_rng(seed)

    def make(spec: Any) -> Any:
        dtype = spec.dtype
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            count = int(np.prod(spec.shape)) if spec.shape else 1
            keys = jax.random.split(jax.random.key(int(rng.integers(1 << 30))), count)
            value = keys.reshape(spec.shape)
        elif np.issubdtype(dtype, np.bool_):
            value = rng.random(spec.shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            value = rng.integers(0, 16, spec.shape).astype(dtype)
        elif np.issubdtype(dtype, np.complexfloating):
            value = (rng.standard_normal(spec.shape) + 1j * rng.standard_normal(spec.shape)).astype(dtype)
        else:
            value = np.asarray(rng.standard_normal(spec.shape), dtype=np.float32).astype(dtype)
        sharding = getattr(spec, "sharding", None)
        return jax.device_put(value, sharding) if sharding is not None else jax.device_put(value)

    return jax.tree_util.tree_map(make, specs)


def bits(tree: Any) -> list[tuple[str, tuple[int, ...], bytes]]:
    import jax
    import numpy as np

    out = []
    for leaf in jax.tree_util.tree_leaves(tree):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        array = np.asarray(leaf)
        out.append((str(array.dtype), array.shape, array.tobytes()))
    return out


def check(item: Any, cache: str, loaded: dict[str, Any], seed: int) -> tuple[str, bool, str]:
    """(signature, identical, note) for one manifest entry."""
    import jax

    import aot
    from aot.cache.warmup.functions import item_signature, prepare, x64_mode

    with x64_mode(item):
        signature = item_signature(item)
        if item.static:
            return signature, True, "skipped: entries with statics are not compared"
        prepared = prepare(item)
        options = dict(prepared.options)
        kwarg_names = [name for name, _ in item.kwargs]
        kwargs_specs = {name: options.pop(name) for name in kwarg_names}
        if item.name not in loaded:
            loaded[item.name] = aot.load(item.name, cache=cache, strict=True)
        served = loaded[item.name]

        def inputs() -> tuple[tuple[Any, ...], dict[str, Any]]:  # fresh ones: donation
            return random_inputs((prepared.args, kwargs_specs), seed)

        if item.pmap is not None:
            reference = jax.pmap(prepared.fn, axis_name=item.pmap,
                                 donate_argnums=tuple(item.donate))
        else:
            jit_options = {k: options[k] for k in ("in_shardings", "out_shardings", "donate_argnums")
                           if k in options}
            reference = jax.jit(prepared.fn, **jit_options)
        args, kwargs = inputs()
        want = bits(jax.block_until_ready(reference(*args, **kwargs)))
        args, kwargs = inputs()
        got = bits(jax.block_until_ready(served(*args, **kwargs)))
    if [(d, s) for d, s, _ in got] != [(d, s) for d, s, _ in want]:
        return signature, False, "outputs differ in dtype or shape"
    same = got == want
    return signature, same, "" if same else "outputs differ"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", required=True, help="the cache folder (or location) to serve")
    parser.add_argument("--manifest", required=True, type=Path, help="the manifest it was warmed from")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    import jax

    from aot.cache.warmup.manifest import expand, load_manifest
    from aot.cache.warmup.functions import item_signature

    devices = jax.devices()
    print(f"devices: {len(devices)} x {devices[0].device_kind} ({devices[0].platform}); "
          f"jax {jax.__version__}; cache {args.cache}", flush=True)
    items = expand(load_manifest(args.manifest))
    loaded: dict[str, Any] = {}
    failures = 0
    for index, item in enumerate(items):
        try:
            signature, same, note = check(item, args.cache, loaded, args.seed + index)
        except Exception as exc:  # noqa: BLE001 - reported per entry, then the exit status
            try:
                signature = item_signature(item)
            except Exception:  # noqa: BLE001
                signature = item.describe_args()
            same, note = False, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        failures += not same
        print(f"{item.name}  {signature}  bit-identical: {'yes' if same else 'NO'}"
              + (f"  ({note})" if note else ""), flush=True)
    print(f"{len(items) - failures}/{len(items)} entries bit-identical to jax "
          f"({time.perf_counter() - start:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
