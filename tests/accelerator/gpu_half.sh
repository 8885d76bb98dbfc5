#!/bin/bash
# The GPU half of tests/accelerator, as one command on the GPU machine (docs/accelerators.md,
# "GPU fleets"). Prepared on a CPU host with ../shared/tools/device-wheels.sh (the project's
# wheel and its dependencies' in .whl-device/), then, with the device tool:
#   run(command="bash tests/accelerator/gpu_half.sh", carry=[".whl-device"], timeout_s=600)
# jax 0.11.2 and the CUDA 13 plugin are the machine's own; jax-aot goes beside them, --no-deps.
set -u
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-cache-dir \
    --target /tmp/site .whl-device/*.whl
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site
python3 -m compileall -q /tmp/site/aot >/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -P tests/accelerator/gpu_half.py --work /tmp/gpu-half --out "${OUT:-/tmp/gpu-half-out}" "$@"
