#!/usr/bin/env bash
# The suite that says whether jax-aot works on a JAX release, run on the GPU machine, whose
# JAX (0.11.2 with the CUDA 13 plugin, Python 3.12) is its own: nothing there reaches a
# registry, and jaxlib is far over what a call carries. docs/jax-releases.md, "JAX 0.11",
# says what it checks and why.
#
# Here (the CPU machine), once:   bash ../shared/tools/device-wheels.sh
#   (builds .whl-device/: the project's wheel and the wheels of the dependencies the
#   GPU machine lacks; git-ignored).
# Then one device call, from the repository root:
#   run(command="bash tests/accelerator/run_on_jax011.sh", carry=[".whl-device"], timeout_s=480)
#
# On the device it installs the project with --no-deps beside the machine's own jax under
# /tmp/site, then runs, each phase under its own time limit:
#   cpu  the canary, the core round trip, serving, the jit backend, the CLI flow and the
#        conformance programs, on JAX 0.11's CPU backend (8 virtual devices, as CI);
#   gpu  tests/accelerator on the H200 (JAX_PLATFORMS=cuda), less the TPU-only tests.
# Logs, JUnit XML and a summary go to $OUT (they come back). Exit status: 0 when every
# phase passed. AOT_PHASES="cpu" (or "gpu") runs one phase, AOT_CPU_TESTS replaces the cpu
# phase's test paths (a rerun of what failed); AOT_SITE, PYTHON and AOT_WHEELS replace
# /tmp/site, python3 and .whl-device (a dry run on the CPU machine).
set -uo pipefail

OUT=${OUT:-/tmp/aot-jax011-out}
SITE=${AOT_SITE:-/tmp/site}
PYTHON=${PYTHON:-python3}
WHEELS=${AOT_WHEELS:-.whl-device}
PHASES=${AOT_PHASES:-cpu gpu}
CPU_LIMIT_S=${AOT_CPU_LIMIT_S:-300}
GPU_LIMIT_S=${AOT_GPU_LIMIT_S:-120}
# The canary, the core round trip, serving, the jit backend, the CLI flow, the conformance
# programs served without their code (wt50's test_versions.py pins the range this run widens).
read -r -a CPU_TESTS <<<"${AOT_CPU_TESTS:-tests/aot/jaxcompat --ignore=tests/aot/jaxcompat/test_versions.py \
    tests/aot/test_rehydrate.py tests/aot/test_executable.py tests/cache/serving/test_loader.py \
    tests/jax_cache tests/cli/test_cli_end_to_end.py tests/conformance}"
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

# --- install: the project's wheel and the carried dependencies, never a jax of ours
if ! ls "$WHEELS"/jax_aot-*.whl >/dev/null 2>&1; then
    say "no $WHEELS/jax_aot-*.whl: run ../shared/tools/device-wheels.sh here and carry .whl-device"
    exit 2
fi
if ls "$WHEELS" | grep -Eq '^(jax|jaxlib)-'; then
    say "refusing: $WHEELS holds a jax or jaxlib wheel; this run is of the machine's own JAX"
    exit 2
fi
rm -rf "$SITE"
PIP_CONFIG_FILE=/dev/null "$PYTHON" -m pip install --isolated -q --no-index --no-deps \
    --no-cache-dir --target "$SITE" "$WHEELS"/*.whl || { say "pip install into $SITE failed"; exit 2; }
# Neither this process nor the tests' subprocesses (cwd = the checkout) may import the
# checkout's aot/ folder, which lacks aot.cache: the installed package is the one tested.
# So no process puts its working folder first on sys.path (PYTHONSAFEPATH), and the
# checkout comes after the installed package (its fixtures/ and tests/ are imported).
export PYTHONSAFEPATH=1
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$SITE:$PWD"
export PATH="$SITE/bin:$PATH"
"$PYTHON" -m compileall -q "$SITE/aot" >/dev/null

# --- the supported range: widened in the installed copy only, for this run
# pyproject.toml and aot/jaxcompat/versions.py keep 0.11 out until a run like this one
# passed (issue 50); `import aot` would refuse the machine's JAX before any test ran.
"$PYTHON" - "$SITE" <<'PY' | tee -a "$summary"
import pathlib, re, sys
import jax, jaxlib
path = pathlib.Path(sys.argv[1]) / "aot" / "jaxcompat" / "versions.py"
print(f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, python {sys.version.split()[0]}")
if path.exists():
    text = path.read_text()
    major_minor = tuple(int(p) for p in jax.__version__.split(".")[:2])
    ceiling = f"{major_minor[0]}.{major_minor[1]}.99"
    pattern = r'(SUPPORTED_JAX\b[^=\n]*=\s*\(\s*"[^"]+"\s*,\s*)"[^"]+"'
    widened, count = re.subn(pattern, rf'\g<1>"{ceiling}"', text, count=1)
    if count:
        path.write_text(widened)
        print(f"installed copy only: SUPPORTED_JAX's ceiling set to {ceiling} for this run")
PY
"$PYTHON" -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|jax-cuda[0-9]*-(plugin|pjrt)|numpy|flax|equinox|optax|diffrax) ' \
    | tr -s ' ' | paste -sd ',' | sed 's/^/installed: /' >>"$summary"
if ! "$PYTHON" -c 'import aot, aot.cache, jax; print("aot from", aot.__file__); print("devices", jax.devices())' \
        >>"$summary" 2>&1; then
    say "import aot failed:"; tail -5 "$summary"; exit 2
fi

PYTEST=("$PYTHON" -P -m pytest -q -p no:cacheprovider --import-mode=append -o addopts=-ra)
status=0

# --- cpu: what CI's version suite covers, on this release's CPU backend
if [[ " $PHASES " == *" cpu "* ]]; then
    start=$SECONDS
    JAX_PLATFORMS=cpu timeout "$CPU_LIMIT_S" "${PYTEST[@]}" --junitxml="$OUT/cpu.xml" \
        "${CPU_TESTS[@]}" >"$OUT/cpu.log" 2>&1
    rc=$?
    say "cpu phase: exit $rc in $((SECONDS - start)) s (124: over ${CPU_LIMIT_S} s); $(tail -n 1 "$OUT/cpu.log")"
    [[ $rc -eq 0 ]] || status=1
fi

# --- gpu: compile with aot.Cache and serve with aot.load on the H200, in one process
if [[ " $PHASES " == *" gpu "* ]]; then
    start=$SECONDS
    JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$GPU_LIMIT_S" "${PYTEST[@]}" \
        --junitxml="$OUT/gpu.xml" tests/accelerator \
        -k "not deviceless and not declared_on_a_cpu_runner" >"$OUT/gpu.log" 2>&1
    rc=$?
    say "gpu phase: exit $rc in $((SECONDS - start)) s (124: over ${GPU_LIMIT_S} s); $(tail -n 1 "$OUT/gpu.log")"
    [[ $rc -eq 0 ]] || status=1
fi

exit $status
