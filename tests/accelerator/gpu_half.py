"""The GPU half of tests/accelerator: one command on the GPU machine (docs/accelerators.md,
"GPU fleets"; tests/accelerator/gpu_half.sh installs the project and runs it).

    python3 -P tests/accelerator/gpu_half.py --work /tmp/gpu-half --out "$OUT"

Phases, each a process of its own (the GPU is opened by the GPU phases only; XLA's
autotune results are process-wide and written as a process compiles):

  gpu-compile   on the GPU, XLA_FLAGS=--xla_gpu_dump_autotune_results_to=W/autotune.textproto:
                jax.jit of every program (optimized HLO and outputs saved), the per-call
                time of the transformer step, jax-aot's keys and environment on the GPU
  gpu-capture   on the GPU: aot target capture h200gpu --autotune W/autotune.textproto,
                into W/gpu-cache; then the same config with no results into W/defaults-cache
  cpu-compile   JAX_PLATFORMS=cpu (a CPU-only compile on the GPU machine): Cache.compile
                of every program for cuda:h200gpu in both caches (tuned, defaults); keys,
                autotune states and optimized HLO saved; cuDNN attention compiled or refused
  gpu-serve     on the GPU: aot.load(strict=True) of every entry of both caches, bit-identical
                to the jax.jit outputs? the same key as on the GPU? the tuned optimized HLO
                equal to the on-GPU compile's? per-call time (a) jit (b) defaults (c) tuned

Then the start-up and per-call figures: ``python3 -m benchmarks --platform cuda --runs 2``.
Everything printed goes to OUT/gpu-half.txt too; the facts to OUT/gpu-half.json. Exit 1
when a check fails (every phase still runs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
NAME = "h200gpu"
TARGET = f"cuda:{NAME}"
SEED = 0
CALLS = 200  # at most, and at most PER_CALL_SECONDS of them
PER_CALL_SECONDS = 5.0


def programs() -> dict[str, tuple[Any, tuple[Any, ...]]]:
    """name -> (function, arg specs): a GEMM + tanh, a bf16 matmul, the fixtures'
    transformer train step, cuDNN attention."""
    import jax
    import jax.numpy as jnp

    from fixtures import models

    def affine(x, w):  # noqa: ANN001, ANN202
        return jnp.tanh(x @ w) * 2.0 + 1.0

    def attention(q, k, v):  # noqa: ANN001, ANN202
        return jax.nn.dot_product_attention(q, k, v, implementation="cudnn")

    qkv = jax.ShapeDtypeStruct((2, 128, 4, 64), jnp.bfloat16)
    return {
        "affine": (affine, (jax.ShapeDtypeStruct((256, 512), jnp.float32), jax.ShapeDtypeStruct((512, 256), jnp.float32))),
        "matmul": (models.matmul, (jax.ShapeDtypeStruct((256, 512), jnp.bfloat16), jax.ShapeDtypeStruct((512, 256), jnp.bfloat16))),
        "train_step": (models.transformer_train_step, (models.transformer_param_specs(), models.transformer_batch_spec())),
        "attention_cudnn": (attention, (qkv, qkv, qkv)),
    }


def inputs(specs: Any) -> Any:
    import jax
    import numpy as np

    rng = np.random.default_rng(SEED)

    def make(spec: Any) -> Any:
        if np.issubdtype(spec.dtype, np.integer):
            return jax.device_put(rng.integers(0, 16, spec.shape).astype(spec.dtype))
        return jax.device_put(np.asarray(rng.standard_normal(spec.shape), np.float32).astype(spec.dtype))

    return jax.tree_util.tree_map(make, specs)


def leaves_bits(tree: Any) -> list[bytes]:
    import jax
    import numpy as np

    return [np.asarray(leaf).tobytes() for leaf in jax.tree_util.tree_leaves(tree)]


def per_call(fn: Any, args: Any) -> float:
    import jax

    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    calls = 0
    while calls < CALLS and time.perf_counter() - start < PER_CALL_SECONDS:
        jax.block_until_ready(fn(*args))
        calls += 1
    return (time.perf_counter() - start) / calls


def normalized_hlo(text: str) -> str:
    """Optimized HLO without what names the process (metadata, the module's name and ids)."""
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    text = re.sub(r"^HloModule \S+", "HloModule m", text, flags=re.MULTILINE)
    return "\n".join(line.rstrip() for line in text.splitlines() if line.strip())


def save(work: Path, name: str, data: Any) -> None:
    (work / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True, default=str))


def load(work: Path, name: str) -> Any:
    path = work / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


# ---------------------------------------------------------------- phases


def gpu_compile(work: Path) -> None:
    import jax
    import numpy as np

    import aot
    from aot.jaxcompat.gpu import cuda_versions, gpu_target_config

    devices = jax.devices()
    config = gpu_target_config(devices[:1])
    facts: dict[str, Any] = {
        "jax": jax.__version__, "device_kind": devices[0].device_kind, "devices": len(devices),
        "compute_capability": getattr(devices[0], "compute_capability", None),
        "platform_version": devices[0].client.platform_version, "cuda_versions": cuda_versions(),
        "target_config": None if config is None else (config if isinstance(config, str) else f"<{len(config)} bytes>"),
        "programs": {},
    }
    for name, (fn, specs) in programs().items():
        row: dict[str, Any] = {}
        try:
            args = inputs(specs)
            compiled = jax.jit(fn).lower(*specs).compile()
            (work / f"hlo-gpu-{name}.txt").write_text(compiled.as_text())
            out = compiled(*args)
            np.savez(work / f"out-gpu-{name}.npz", *[np.asarray(x) for x in jax.tree_util.tree_leaves(out)])
            if name == "train_step":
                row["per_call_jit_s"] = per_call(compiled, args)
            computation = aot.lower(fn, *specs, name=name)
            row["key"] = computation.key
            row["environment"] = computation.environment_fingerprint.as_dict()
        except Exception as exc:  # noqa: BLE001 - every program is reported
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        facts["programs"][name] = row
    save(work, "gpu-compile", facts)


def gpu_capture(work: Path) -> None:
    import aot

    results = work / "autotune.textproto"
    cache = aot.Cache(work / "gpu-cache")
    record = cache.capture_target(NAME, autotune_file=results if results.exists() else None)
    config = work / "captured.txtpb"
    config.write_text(record.config)
    versions = work / "versions.json"
    versions.write_text(record.versions)
    aot.Cache(work / "defaults-cache").capture_target(NAME, config_file=config, versions_file=versions)
    save(work, "gpu-capture", {**record.to_dict(), "autotune_bytes": len(record.autotune or "")})


def cpu_compile(work: Path) -> None:
    import aot

    facts: dict[str, Any] = {}
    for cache_name in ("gpu-cache", "defaults-cache"):
        cache = aot.Cache(work / cache_name)
        cache.use_targets()
        rows: dict[str, Any] = {}
        for name, (fn, specs) in programs().items():
            try:
                start = time.perf_counter()
                computation = aot.lower(fn, *specs, name=name, target=TARGET)
                executable = computation.compile()
                cache.put(executable)
                (work / f"hlo-{cache_name}-{name}.txt").write_text(executable.compiled.as_text())
                rows[name] = {"key": computation.key, "autotune": executable.info.autotune,
                              "seconds": time.perf_counter() - start,
                              "environment": computation.environment_fingerprint.as_dict()}
            except Exception as exc:  # noqa: BLE001 - cuDNN attention may be refused: said
                rows[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        facts[cache_name] = rows
    save(work, "cpu-compile", facts)


def gpu_serve(work: Path) -> None:
    import jax
    import numpy as np

    import aot

    on_gpu = load(work, "gpu-compile").get("programs", {})
    facts: dict[str, Any] = {}
    for cache_name in ("gpu-cache", "defaults-cache"):
        rows: dict[str, Any] = {}
        for name, (fn, specs) in programs().items():
            row: dict[str, Any] = {}
            try:
                loaded = aot.load(name, cache=str(work / cache_name), strict=True)
                args = inputs(specs)
                out = loaded(*args)
                stored = np.load(work / f"out-gpu-{name}.npz")
                expected = [stored[f"arr_{i}"].tobytes() for i in range(len(stored.files))]
                row["bit_identical"] = leaves_bits(out) == expected
                if name == "train_step":
                    row["per_call_s"] = per_call(loaded, args)
            except Exception as exc:  # noqa: BLE001 - reported per program
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            hlo = work / f"hlo-{cache_name}-{name}.txt"
            gpu_hlo = work / f"hlo-gpu-{name}.txt"
            if hlo.exists() and gpu_hlo.exists():
                row["optimized_hlo_equal"] = normalized_hlo(hlo.read_text()) == normalized_hlo(gpu_hlo.read_text())
            deviceless_key = load(work, "cpu-compile").get(cache_name, {}).get(name, {}).get("key")
            row["key_equal_to_gpu_compile"] = (
                deviceless_key == on_gpu.get(name, {}).get("key") if deviceless_key is not None else None
            )
            rows[name] = row
        facts[cache_name] = rows
    facts["devices"] = [d.device_kind for d in jax.devices()]
    save(work, "gpu-serve", facts)


PHASES = {"gpu-compile": gpu_compile, "gpu-capture": gpu_capture, "cpu-compile": cpu_compile, "gpu-serve": gpu_serve}


def _environment_diff(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return [f"{k}: {a.get(k)!r} != {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def drive(work: Path, out: Path, benchmarks: bool) -> int:
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    report = out / "gpu-half.txt"
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)
        report.write_text("\n".join(lines) + "\n")

    base = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "AOT_ENV_RECORD": "off",
            "XDG_CACHE_HOME": str(work / "xdg"), "PYTHONPATH": os.environ.get("PYTHONPATH", "") + f":{REPO}"}
    phases = [
        ("gpu-compile", {"XLA_FLAGS": f"--xla_gpu_dump_autotune_results_to={work / 'autotune.textproto'}"}),
        ("gpu-capture", {}),
        ("cpu-compile", {"JAX_PLATFORMS": "cpu"}),
        ("gpu-serve", {}),
    ]
    for phase, extra in phases:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-P", __file__, "--phase", phase, "--work", str(work)],
                              env={**base, **extra}, cwd=REPO, capture_output=True, text=True, timeout=900)
        say(f"== {phase}: exit {done.returncode} in {time.perf_counter() - start:.1f}s")
        if done.returncode:
            say(done.stderr[-3000:])
    gpu, cpu, served = load(work, "gpu-compile"), load(work, "cpu-compile"), load(work, "gpu-serve")
    captured = load(work, "gpu-capture")
    say(json.dumps({k: gpu.get(k) for k in ("jax", "device_kind", "devices", "compute_capability", "cuda_versions",
                                          "platform_version")}, default=str))
    say(f"target config from the GPU: {'yes' if gpu.get('target_config') else 'NO'}; captured: "
        f"{ {k: captured.get(k) for k in ('target', 'device_kind', 'config_digest', 'autotune', 'autotune_bytes')} }")
    failed = False
    for name in programs_names():
        row_gpu = gpu.get("programs", {}).get(name, {})
        for cache_name in ("gpu-cache", "defaults-cache"):
            row_cpu = cpu.get(cache_name, {}).get(name, {})
            row = served.get(cache_name, {}).get(name, {})
            say(f"{name} [{cache_name}]: compiled {row_cpu.get('autotune') or row_cpu.get('error')}; "
                f"served bit-identical {row.get('bit_identical')} {row.get('error', '')}; same key as on the GPU "
                f"{row.get('key_equal_to_gpu_compile')}; optimized HLO equal {row.get('optimized_hlo_equal')}")
            if row_cpu.get("environment") and row_gpu.get("environment") and not row.get("key_equal_to_gpu_compile"):
                say("  environment differs: " + "; ".join(_environment_diff(row_cpu["environment"], row_gpu["environment"])))
            if name != "attention_cudnn" and (row.get("bit_identical") is not True):
                failed = True
        if name == "train_step":
            say(f"  per call: (a) jit on the GPU {row_gpu.get('per_call_jit_s')}, (b) deviceless defaults "
                f"{served.get('defaults-cache', {}).get(name, {}).get('per_call_s')}, (c) deviceless tuned "
                f"{served.get('gpu-cache', {}).get(name, {}).get('per_call_s')} s")
    for name in ("gpu-compile", "gpu-capture", "cpu-compile", "gpu-serve"):
        path = work / f"{name}.json"
        if path.exists():
            (out / f"{name}.json").write_text(path.read_text())
    if benchmarks:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "benchmarks", "--platform", "cuda", "--runs", "2"],
                              env={**base, "OUT": str(out)}, cwd=REPO, capture_output=True, text=True, timeout=420)
        say(f"== benchmarks --platform cuda: exit {done.returncode} in {time.perf_counter() - start:.1f}s")
        say(done.stdout[-6000:] + done.stderr[-2000:])
    say("FAILED" if failed else "ok")
    return 1 if failed else 0


def programs_names() -> list[str]:
    return ["affine", "matmul", "train_step", "attention_cudnn"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu-half"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu-half-out")))
    parser.add_argument("--phase", choices=sorted(PHASES), default=None)
    parser.add_argument("--no-benchmarks", action="store_true")
    options = parser.parse_args()
    if options.phase is not None:
        sys.path.append(str(REPO))  # fixtures.models; the installed aot wins (-P)
        PHASES[options.phase](options.work)
        return 0
    return drive(options.work, options.out, not options.no_benchmarks)


if __name__ == "__main__":
    sys.exit(main())
