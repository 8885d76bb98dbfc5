"""The environment's parts: what decides whether an executable can run here (jax and
jaxlib versions, platform, devices and their topology, x64, the XLA flags and, on TPU,
the ``LIBTPU_INIT_ARGS`` compiler flags that can change an executable, the CPU's
instruction set), asked of JAX and the host.

:func:`aot.fingerprint.environment_fingerprint` makes them a :class:`Fingerprint`;
:func:`environment_digest` is its digest without the value objects, for ``aot.load``'s
read-ahead, which runs before they are imported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from aot import platforms
from aot.digests import parts_digest, sha256_hex, sorted_parts

ENVIRONMENT_KIND = "environment"

# XLA flags that cannot change the compiled executable, decided flag by flag from
# JAX's own list (jax/_src/cache_key.py, xla_flags_to_exclude_from_cache_key). They are
# left out of the environment fingerprint (setting XLA_FLAGS=--xla_dump_to=... to debug
# must not make every stored entry miss) and shown by `aot why` / `aot doctor`.
_FLAGS_OUTSIDE_KEY = frozenset({
    # Dumping writes files next to the compilation; the executable is the same.
    "--xla_dump_to",
    "--xla_dump_hlo_as_text",
    "--xla_dump_hlo_as_long_text",
    "--xla_dump_hlo_as_proto",
    "--xla_dump_hlo_as_dot",
    "--xla_dump_hlo_as_html",
    "--xla_dump_hlo_as_url",
    "--xla_dump_hlo_module_re",
    "--xla_dump_hlo_pass_re",
    "--xla_dump_hlo_pipeline_re",
    "--xla_dump_hlo_snapshots",
    "--xla_dump_fusion_visualization",
    "--xla_dump_max_hlo_modules",
    "--xla_dump_module_metadata",
    "--xla_dump_compress_protos",
    "--xla_dump_include_timestamp",
    "--xla_dump_disable_metadata",
    # Where a GPU writes the autotune results it measured (aot target capture --autotune
    # reads them); loading results (--xla_gpu_load_autotune_results_from) stays in the key.
    "--xla_gpu_dump_autotune_results_to",
    # Covered by the `device_count` and `topology` parts.
    "--xla_force_host_platform_device_count",
    # Reporting of TPU silent-data-corruption checks (metrics, callbacks, logging);
    # whether the checker runs is a different flag, which stays in the key.
    "--xla_tpu_sdc_checker_streamz_metric",
    "--xla_tpu_sdc_checker_enable_sdc_event_callbacks",
    "--xla_tpu_sdc_checker_enable_coresweep_ng_callbacks",
    "--xla_tpu_sdc_checker_no_logging_if_callbacks_are_present",
})
# JAX also leaves out these two; they stay in our key because they can change the
# code: --xla_gpu_cuda_data_dir picks the CUDA toolkit (ptxas, libdevice) that builds
# the kernels, and --xla_gpu_experimental_autotune_cache_mode decides whether stored
# autotuning results choose them.
_FLAGS_KEPT_DESPITE_JAX = ("--xla_gpu_cuda_data_dir", "--xla_gpu_experimental_autotune_cache_mode")


def _flag_name(flag: str) -> str:
    return flag.partition("=")[0]


def relevant_xla_flags(flags: str | None = None) -> str:
    """The XLA flags that can change the executable (the ``xla_flags`` part), sorted."""
    flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    kept = [f for f in flags.split() if _flag_name(f) not in _FLAGS_OUTSIDE_KEY]
    return " ".join(sorted(kept))


# Appended to LIBTPU_INIT_ARGS by `import jax` on every Cloud TPU VM
# (jax/_src/cloud_tpu_init.py): a runtime launch option, not a compiler one. A deviceless
# compile on a CPU host never gets it, and the chip served those executables bit for bit
# (docs/accelerators.md), so keeping it would make every TPU host miss every target entry.
_LIBTPU_ARGS_OUTSIDE_KEY = frozenset({"--xla_tpu_use_enhanced_launch_barrier"})


def relevant_libtpu_init_args(args: str | None = None) -> str:
    """The TPU compiler flags of ``LIBTPU_INIT_ARGS`` that can change the executable
    (the ``libtpu_init_args`` part), sorted as JAX's persistent-cache key sorts them
    (jax/_src/cache_key.py, _hash_xla_flags), with the same flags left out as from
    ``XLA_FLAGS`` and JAX's own launch-barrier flag; empty when none is set."""
    args = os.environ.get("LIBTPU_INIT_ARGS", "") if args is None else args
    kept = [
        f for f in args.split()
        if _flag_name(f) not in _FLAGS_OUTSIDE_KEY and _flag_name(f) not in _LIBTPU_ARGS_OUTSIDE_KEY
    ]
    return " ".join(sorted(kept))


_COVERED_BY_PARTS = frozenset({"--xla_force_host_platform_device_count"})


def xla_flags_outside_key(flags: str | None = None) -> str:
    """The XLA flags set here that are in no part of the key (they cannot change the
    executable); the device count is not one of them: its own part covers it."""
    flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    return " ".join(sorted(
        f for f in flags.split()
        if _flag_name(f) in _FLAGS_OUTSIDE_KEY and _flag_name(f) not in _COVERED_BY_PARTS
    ))


def _topology(devices: Sequence[Any]) -> str:
    # By device id: the same text in every process of a slice, whatever order its runtime
    # lists the devices in (libtpu's topology of a multi-host target lists them host by
    # host: 0,1,4,5,2,3,... for tpu:v5e:4x4). Single-host lists are already by id.
    parts = []
    for d in sorted(devices, key=lambda d: d.id):
        coords = getattr(d, "coords", None)
        core = getattr(d, "core_on_chip", None)
        extra = f"@{tuple(coords)}" if coords is not None else ""
        extra += f"/{core}" if core is not None else ""
        parts.append(f"{d.id}{extra}")
    text = ",".join(parts)
    return text if len(text) <= 200 else "sha256:" + sha256_hex(text)


def environment_parts(backend: str | None = None, devices: Sequence[Any] | None = None) -> dict[str, str]:
    """The parts of the environment that decide whether an executable can run here, or,
    given a device target's compile-only ``devices`` (:mod:`aot.targets`), on that
    accelerator: the same parts, read from those devices as a process there reads
    them from ``jax.devices()``."""
    import jax  # here, not at module level: listing commands use this module without JAX
    import jaxlib

    if devices is None:
        from aot.device import default_devices

        devices = default_devices(backend)  # a held or missing device: one-line DeviceBusyError
        process_count = jax.process_count()
    else:  # a target's hosts: one process each, as jax.distributed runs them
        process_count = len({d.process_index for d in devices})
    first = devices[0]
    client = first.client
    parts = {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "platform": first.platform,
        "platform_version": str(client.platform_version),
        "device_kind": first.device_kind,
        "device_count": str(len(devices)),
        "process_count": str(process_count),
        "topology": _topology(devices),
        "x64": str(bool(getattr(jax.config, "jax_enable_x64"))).lower(),
        "xla_flags": relevant_xla_flags(),
    }
    room = platforms.of(first.platform)
    if room is not None:
        # What an executable of the platform depends on besides these (a CPU's ISA, a
        # GPU's config, CUDA's libraries and the plugin), read alike from a target's
        # devices and the platform's own.
        parts.update(room.environment_parts(devices))
        if room.COMPILER_ARGS is not None:
            # The compiler's own flags (libtpu's) are the compiling process's: this host's
            # for a device target too. Only when set, so that entries stored before this
            # part existed keep their keys; only for the platform whose compiler reads them.
            part, variable = room.COMPILER_ARGS
            args = relevant_libtpu_init_args(os.environ.get(variable, ""))
            if args:
                parts[part] = args
    return parts


def environment_digest(parts: Mapping[str, str]) -> str:
    """The digest of the environment fingerprint of ``parts``: that of
    ``Fingerprint.of("environment", parts)``."""
    return parts_digest(ENVIRONMENT_KIND, sorted_parts(parts))
