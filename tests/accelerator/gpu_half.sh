#!/bin/bash
# The GPU half of tests/accelerator, as one command on the GPU machine (docs/accelerators.md,
# "GPU fleets"). Prepared on a CPU host with ../shared/tools/device-wheels.sh (the project's
# wheel and its dependencies' in .whl-device/), then, with the device tool:
#   run(command="bash tests/accelerator/gpu_half.sh", carry=[".whl-device"], timeout_s=600)
# jax and the CUDA plugin are the machine's own (0.11.2 and the CUDA 13 plugin when last lent;
# on 0.12.x the CUDA 13 plugin too: jax-cuda12-plugin ends at 0.12.0.1); jax-aot goes beside
# them, --no-deps. jaxlib and the plugin are far over what a call carries (64 MiB), so the
# release is the machine's: the preflight below says which, and stops in one line where its
# plugin is not jaxlib's release (jax-aot refuses to compile with it; nothing would be tested).
set -u
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-cache-dir \
    --target /tmp/site .whl-device/*.whl
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site
python3 -m compileall -q /tmp/site/aot >/dev/null
python3 -P - <<'PY' || exit 1
import sys
import jax, jaxlib
from aot.platforms import cuda as gpu_targets
problem = gpu_targets.problem_here()
print(f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, plugins {gpu_targets.cuda_plugins()}: "
      + ("ok" if problem is None else problem[1]))
sys.exit(problem is not None)
PY
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -P tests/accelerator/gpu_half.py --work /tmp/gpu-half --out "${OUT:-/tmp/gpu-half-out}" "$@"
