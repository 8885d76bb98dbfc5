"""Child process of test_manifest_fields.py (run as a script: an abort in XLA fails one
test, not the whole run).

    python manifest_field_worker.py CACHE KEY SIGNING_KEY|- CASES.json

For each case of CASES.json (``[[label, manifest_dict], ...]``) the row of KEY is reset
to the original, its manifest replaced by the case's (as an attacker with write access
to the index would), and then:

  direct   ``Cache.get(KEY)`` and one call: refused (the error type), or the output;
  verify   whether ``Cache.verify(quarantine=False)`` reports the entry;
  served   ``aot.load(name)`` (strict=False, heals from the portable HLO) and one call;
  row      the row's state afterwards, and whether its manifest is consistent.

Each case prints ``START label`` first and one JSON line when done, flushed, so that
the parent names the case that killed the process.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()


def _inputs(manifest: dict) -> list:
    import numpy as np

    out = []
    for i, arg in enumerate(manifest["args"]):
        size = int(np.prod(arg["shape"], dtype=np.int64))
        out.append((np.arange(size, dtype=np.float32) + i).reshape(arg["shape"]).astype(arg["dtype"]))
    return out


def _describe(out: object) -> dict:
    """Values and every label of each output array (what a caller would see)."""
    import hashlib

    import jax
    import numpy as np

    leaves = []
    for leaf in jax.tree_util.tree_leaves(out):
        leaf.block_until_ready()
        value = np.asarray(leaf)
        sharding = leaf.sharding
        leaves.append({
            "dtype": str(leaf.dtype),
            "shape": list(leaf.shape),
            "weak_type": bool(getattr(leaf, "weak_type", False)),
            "devices": sorted(d.id for d in sharding.device_set),
            "memory_kind": sharding.memory_kind,
            "hlo_sharding": str(sharding._to_xla_hlo_sharding(leaf.ndim)),
            "committed": bool(leaf.committed),
            "bytes": hashlib.sha256(value.tobytes()).hexdigest(),
            "numpy_dtype": str(value.dtype),
        })
    return {"structure": str(jax.tree_util.tree_structure(out)), "leaves": leaves}


def main(location: str, key: str, signing_key: str, cases_file: str) -> None:
    import sqlalchemy as sa

    import aot
    from aot.artifact import Manifest, manifest_problems
    from aot.cache.cache import Cache
    from aot.cache.index.schema import ARTIFACTS

    signing = None if signing_key == "-" else signing_key
    cases = json.loads(open(cases_file).read())
    t = ARTIFACTS
    with Cache(location, signing_key=signing) as cache:
        original = cache.index.get(key)
        manifest = json.loads(original.manifest)
        args = _inputs(manifest)
        expected = _describe(cache.get(key)(*args))
    print(json.dumps({"expected": expected}), flush=True)

    for label, changed in cases:
        print(f"START {label}", flush=True)
        result: dict = {"case": label}
        with Cache(location, signing_key=signing) as cache:
            with cache.index.engine.begin() as conn:
                conn.execute(sa.update(t).where(t.c.key == key).values(
                    manifest=json.dumps(changed), exe_digest=original.exe_digest,
                    hlo_digest=original.hlo_digest, state="ok", state_reason=None,
                ))
            try:
                result["direct"] = _describe(cache.get(key)(*args))
            except aot.AotError as exc:
                result["direct"] = f"refused: {type(exc).__name__}: {exc}"
            except Exception as exc:  # noqa: BLE001 - reported: the parent fails the case
                result["direct"] = f"ERROR {type(exc).__name__}: {exc}"
            try:
                report = cache.verify(quarantine=False)
                result["verify"] = [p.what for p in report.problems if p.key == key]
            except Exception as exc:  # noqa: BLE001
                result["verify"] = [f"ERROR {type(exc).__name__}: {exc}"]
        with Cache(location, signing_key=signing) as cache:
            try:
                fn = aot.load(original.name, cache=cache)
                result["served"] = _describe(fn(*args))
            except aot.AotError as exc:
                result["served"] = f"refused: {type(exc).__name__}: {exc}"
            except Exception as exc:  # noqa: BLE001
                result["served"] = f"ERROR {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            row = cache.index.get(key)
            result["row_state"] = row.state if row is not None else None
            try:
                result["row_problems"] = manifest_problems(Manifest.from_json(row.manifest)) if row else []
            except aot.AotError as exc:
                result["row_problems"] = [str(exc)]
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
