"""What a CUDA GPU says about itself through jaxlib's private side.

* ``xla_client.get_topology_for_devices(devices).target_config``: the
  ``stream_executor.GpuTargetConfigProto`` of a GPU (jaxlib 0.11 and later; absent from
  0.10's ``DeviceTopology``), which ``aot target capture`` records and a deviceless
  compile gives back to ``jax.experimental.topologies.get_topology_desc``.
* ``jax._src.lib.cuda_versions`` (the CUDA plugin's ``_versions`` module, None without
  the plugin): the CUDA runtime, cuDNN and cuBLAS versions loaded in this process.
* ``jax._src.cudnn.fused_attention_stablehlo.check_cudnn_version``: where JAX looks for
  cuDNN as it lowers cuDNN attention (:func:`cudnn_check_failed` names its failure).

Nothing here opens a device: the callers pass devices they already hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def gpu_target_config(devices: Sequence[Any]) -> str | bytes | None:
    """The GPU target config of ``devices`` as jaxlib gives it (text, or the proto's
    bytes), or None where this jaxlib does not expose it."""
    from jax._src.lib import xla_client

    topology = xla_client.get_topology_for_devices(list(devices))
    config = getattr(topology, "target_config", None)
    if callable(config):
        config = config()
    return config if isinstance(config, (str, bytes)) and config else None


def cuda_versions() -> dict[str, str]:
    """The CUDA libraries this process loads, as the CUDA plugin reports them
    (``runtime``, ``driver``, ``cudnn``, ``cublas``); a library the plugin cannot load
    (no GPU, no driver) is left out. Empty without the plugin."""
    from jax._src.lib import cuda_versions as module

    if module is None:
        return {}
    found: dict[str, str] = {}
    for name, function in (
        ("runtime", "cuda_runtime_get_version"), ("driver", "cuda_driver_get_version"),
        ("cudnn", "cudnn_get_version"), ("cublas", "cublas_get_version"),
    ):
        getter = getattr(module, function, None)
        if getter is None:
            continue
        try:
            found[name] = str(getter())
        except Exception:  # noqa: BLE001 - the plugin raises a RuntimeError where no GPU loads the library
            continue
    return found


def cudnn_check_failed(exc: BaseException) -> bool:
    """Whether ``exc`` came out of JAX's cuDNN check (``check_cudnn_version``, as cuDNN
    attention lowers): on jaxlib 0.12 with the CUDA 13 plugin and no cuDNN, the plugin's
    version call fails with a nanobind ``SystemError`` that names nothing, so the place
    it was raised is what says it."""
    trace = exc.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code.co_name == "check_cudnn_version":
            return True
        trace = trace.tb_next
    return False
