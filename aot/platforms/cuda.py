"""CUDA targets: compiling for NVIDIA GPUs on a host without one.

A GPU target is ``cuda:GPU`` (one GPU), ``cuda:GPU:N`` (one host of N GPUs) or
``cuda:GPU:HxN`` (H hosts of N GPUs each): ``cuda:h200``, ``cuda:h200:8``,
``cuda:h200:2x8``. JAX compiles for it through its topology API with the CUDA plugin
(``jax-aot[cuda12]``: ``jax-cuda12-plugin``, ``jax-cuda12-pjrt`` and ptxas from
``nvidia-cuda-nvcc-cu12``), given the GPU's *target config*: a
``stream_executor.GpuTargetConfigProto`` in text format (compute capability, SMs,
clock, memory, L2, shared memory, limits, cuDNN version, device name).

Where the config of ``GPU`` comes from, first found:

1. a config captured from the fleet's own GPU (``aot target capture GPU`` on a GPU
   host; :meth:`aot.Cache.use_targets` writes a cache's captured configs to a folder and
   hands it here as :class:`CapturedConfigs` (:func:`use_captured`), and the warm-up
   hands the same object to its workers with each task);
2. the config jax-aot ships for ``h100`` and ``h200`` (``aot/gpu_configs``), written from
   NVIDIA's published figures (docs/accelerators.md names the source of each).

The key (:func:`gpu_parts`) holds what a GPU executable depends on besides the TPU-like
parts: the compute capability, the target config's digest, the CUDA runtime, cuDNN,
cuBLAS and NCCL versions and the CUDA plugin's version. A captured config carries the
versions the GPU host had; a shipped one says ``unknown`` for those a datasheet cannot
know. A process on the GPU computes the same parts from its own devices, so an entry
compiled deviceless for a captured GPU is that GPU's own (docs/accelerators.md, "One
program, one key").

The autotune results captured on the GPU travel with the config
(:attr:`GpuConfig.autotune`): a deviceless compile loads them and requires them to be
complete (:func:`autotune_options`); :mod:`aot.computation` falls back to XLA's defaults
when a program's fusions are missing from them, and the entry records which it got.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from aot.errors import DeviceTargetError, GpuCompilerMissingError
from aot.platforms.tuning import DEFAULTS, MEASURED, TUNED, Tuning

log = logging.getLogger(__name__)

__all__ = [
    "CAPTURED_CONFIGS", "COMPILER_ARGS", "CapturedConfigs", "DEVICELESS", "NAME", "PLATFORM", "SHIPPED", "chip_count",
    "compile_step", "config_name", "environment_parts", "hint", "known_targets", "lowering_error", "parse", "target_name", "target_text", "GpuConfig", "autotune_options", "config_digest", "config_for",
    "captured_in_use", "gpu_name", "gpu_parts", "plugin_versions", "topology_devices", "use_captured",
]

#: The platform of a GPU target's name, and of JAX's topology call ("gpu" is refused there).
PLATFORM = NAME = "cuda"
#: A GPU target is named by a config (captured from the fleet, or shipped): ``cuda:NAME``.
CAPTURED_CONFIGS = True
DEVICELESS = True
COMPILER_ARGS: tuple[str, str] | None = None
#: The GPUs jax-aot ships a target config for (aot/gpu_configs/NAME.txtpb).
SHIPPED = ("h100", "h200")
#: A GPU's name in a target: lower-case letters, digits, '-' and '_' (``h200``, ``fleet-a``).
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
# A '#' outside double quotes, and the rest of its line: a text-format comment.
_COMMENT = re.compile(r'#(?=(?:[^"]*"[^"]*")*[^"]*$).*$')
_SHAPE = re.compile(r"^(?:(\d+)x)?(\d+)$")
#: The oldest jaxlib whose CUDA plugin parses the shipped target configs (0.9.2's
#: GpuTargetConfigProto has no ``thread_dim_limit_x``) and compiles them deviceless: the
#: release the GPU path is tested on. GPU targets are refused below it, in one line.
GPU_FLOOR = "0.10.2"
#: The last release of jax-cuda12-plugin on the registry; later ones are CUDA 13's only.
_LAST_CUDA12 = (0, 12, 0, 1)
#: ptxas of each CUDA major, from NVIDIA's wheels (XLA calls it to compile PTX).
_PTXAS = {"12": "nvidia-cuda-nvcc-cu12", "13": "'nvidia-cuda-nvcc>=13,<14'"}
#: Versions a datasheet cannot know: what a shipped config's key says for them.
UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """A GPU's target config and what was recorded with it."""

    name: str
    text: str  # a GpuTargetConfigProto in text format
    source: str  # "shipped" or "captured"
    versions: tuple[tuple[str, str], ...] = ()  # runtime, driver, cudnn, cublas, nccl, plugin... (a capture)
    autotune: str | None = None  # XLA's autotune results (text) captured on the GPU

    @property
    def digest(self) -> str:
        return config_digest(self.text)

    @property
    def autotune_digest(self) -> str | None:
        return "sha256:" + hashlib.sha256(self.autotune.encode()).hexdigest() if self.autotune else None

    def device_kind(self) -> str | None:
        """The device name the config gives (what JAX reports as ``device_kind``)."""
        found = re.search(r'device_description_str:\s*"([^"]*)"', self.text)
        return found.group(1) if found else None


def config_digest(text: str) -> str:
    """The digest of a target config's text: comments and layout left out, so that the
    same config written by hand or printed by XLA has one digest."""
    lines = [_COMMENT.sub("", line).strip() for line in text.splitlines()]
    canonical = " ".join(" ".join(line.split()) for line in lines if line)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def parse_shape(target: str, shape: str) -> tuple[int, int]:
    """``""`` -> (1, 1); ``"8"`` -> (1, 8); ``"2x8"`` -> (2, 8): (hosts, GPUs per host)."""
    if not shape:
        return 1, 1
    found = _SHAPE.match(shape)
    if found is None or int(found.group(2)) < 1 or (found.group(1) is not None and int(found.group(1)) < 1):
        raise DeviceTargetError(
            f"target {target!r}: after the GPU comes its GPUs per host (cuda:h200:8) or hosts x GPUs "
            f"per host (cuda:h200:2x8), got {shape!r}"
        )
    return int(found.group(1) or 1), int(found.group(2))


def shape_text(hosts: int, per_host: int) -> str:
    """The inverse of :func:`parse_shape`, as a target name writes it."""
    if hosts == 1 and per_host == 1:
        return ""
    return f"{per_host}" if hosts == 1 else f"{hosts}x{per_host}"


def parse(text: str, fields: list[str], hosts: str) -> tuple[str, str, tuple[int, int, int]] | None:
    """``cuda:GPU[:N|:HxN]`` -> (GPU, "HxN", (hosts, GPUs per host, 1)); None for another
    shape (the caller's error names the spelling). JAX's own name of the platform
    (``gpu:``) is refused with the target spelled right."""
    if fields[0].strip().lower() != NAME:
        fixed = ":".join([NAME, *fields[1:]])
        raise DeviceTargetError(
            f"target {text!r}: a GPU target's platform is 'cuda', not {fields[0].strip().lower()!r} (as JAX's topology "
            f"call names it): {fixed}"
        )
    if len(fields) not in (2, 3) or not all(fields) or hosts:
        return None
    chip = fields[1].strip().lower()
    count, per_host = parse_shape(text, fields[2].strip().lower() if len(fields) == 3 else "")
    if not NAME_PATTERN.match(chip):
        raise DeviceTargetError(f"target {text!r}: a GPU's name is lower-case letters, digits, '-' and '_' (cuda:h200)")
    check_known_gpu(text, chip)
    return chip, f"{count}x{per_host}", (count, per_host, 1)


def target_text(chip: str, topology: str, host_bounds: tuple[int, int, int]) -> str:
    shape = shape_text(host_bounds[0], host_bounds[1])
    return f"{NAME}:{chip}" + (f":{shape}" if shape else "")


def chip_count(topology: str, host_bounds: tuple[int, int, int]) -> int:
    return host_bounds[0] * host_bounds[1]


def config_name(target: str) -> str:
    """The GPU's name in a target name or a GPU's name: ``cuda:h200`` -> ``h200``."""
    return target.removeprefix(f"{NAME}:")


def known_targets() -> str:
    return ", ".join(f"cuda:{name}[:N|:HxN]" for name in known())


def hint(text: str) -> str | None:
    return None


def target_name(parts: Mapping[str, str]) -> str | None:
    """The GPU target of an environment's parts: named by its target config's digest
    (:func:`gpu_name`: ``cuda:h200:8``)."""
    name = gpu_name(dict(parts))
    count, processes = parts.get("device_count", ""), parts.get("process_count", "1")
    if name is None or not count.isdigit() or not processes.isdigit() or int(count) % int(processes):
        return None
    shape = shape_text(int(processes), int(count) // int(processes))
    return f"cuda:{name}" + (f":{shape}" if shape else "")


@dataclass(frozen=True, slots=True)
class CapturedConfigs:
    """A cache's captured GPUs, written as files to ``folder`` (one ``NAME.json`` each:
    :func:`captured_file`): what ``cuda:NAME`` compiles for where they are in use."""

    folder: Path


#: The captured GPUs this process compiles for (:func:`use_captured`); None: the shipped ones only.
_in_use: list[CapturedConfigs | None] = [None]


def use_captured(configs: CapturedConfigs | None) -> None:
    """Makes ``configs`` what ``cuda:NAME`` compiles for in this process (None: only the
    shipped configs): :meth:`aot.Cache.use_targets`, and a warm-up worker given them."""
    _in_use[0] = configs


def captured_in_use() -> CapturedConfigs | None:
    return _in_use[0]


def _captured_folder() -> Path | None:
    configs = _in_use[0]
    return configs.folder if configs is not None else None


def captured_file(folder: Path, name: str) -> Path:
    return folder / f"{name}.json"


def config_for(name: str) -> GpuConfig | None:
    """The target config of the GPU ``name``: captured (:func:`use_captured`) before
    shipped; None when neither knows it."""
    folder = _captured_folder()
    if folder is not None:
        path = captured_file(folder, name)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            data = None
        except (OSError, ValueError) as exc:
            raise DeviceTargetError(f"the captured target config {path} is unreadable ({exc}); run the command again") from None
        if data is not None:
            return GpuConfig(
                name, str(data["config"]), "captured", tuple((str(k), str(v)) for k, v in data.get("versions", {}).items()),
                data.get("autotune"),
            )
    if name in SHIPPED:
        text = (resources.files("aot") / "gpu_configs" / f"{name}.txtpb").read_text(encoding="utf-8")
        return GpuConfig(name, text, "shipped")
    return None


def known() -> list[str]:
    """The GPU names this process can compile for: shipped and captured."""
    names = set(SHIPPED)
    folder = _captured_folder()
    if folder is not None and folder.is_dir():
        names |= {p.stem for p in folder.glob("*.json")}
    return sorted(names)


def check_known_gpu(target: str, name: str) -> None:
    """Refuses a GPU this process has no config for, naming the ones it has."""
    if config_for(name) is None:
        captured = "" if _captured_folder() else " (no captured GPU in use: a cache's captured ones are named by aot target ls)"
        raise DeviceTargetError(
            f"unknown GPU target {target!r}; known: " + ", ".join(f"cuda:{n}" for n in known())
            + f"{captured}; record a fleet's own GPU with aot target capture NAME on a GPU host"
        )


def plugin_installed() -> bool:
    """Whether JAX's CUDA plugin is installed (its ``jax_plugins`` module), without importing it."""
    import importlib.util

    if importlib.util.find_spec("jax_plugins") is None:
        return False
    return any(importlib.util.find_spec(f"jax_plugins.xla_cuda{v}") is not None for v in ("12", "13"))


def plugin_versions() -> str:
    """The installed CUDA plugin distributions of JAX and their versions
    (``jax-cuda12-pjrt=0.10.2 jax-cuda12-plugin=0.10.2``): what compiles a GPU entry."""
    from importlib import metadata

    found = sorted(
        f"{d.metadata['Name'].lower()}={d.version}" for d in metadata.distributions()
        if (d.metadata["Name"] or "").lower().startswith(("jax-cuda", "jax_cuda"))
    )
    return " ".join(dict.fromkeys(found)) or UNKNOWN


def nccl_version() -> str:
    """NCCL's version, from the ``nvidia-nccl-cu*`` distribution JAX's plugin loads it
    from; ``unknown`` without one."""
    from importlib import metadata

    for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return UNKNOWN


# The target config of each compile-only device (the device itself is the key, held, so
# no other object can take its place): their environment parts read the config's digest
# and versions (the devices do not carry them). Every device is mapped, so any subset of a
# topology's devices (a mesh over some of them) finds its config.
_CONFIG_OF_DEVICES: dict[Any, GpuConfig] = {}


def topology_devices(chip: str, topology: str, host_bounds: tuple[int, int, int], name: str) -> tuple[Any, ...]:
    """The compile-only devices of ``hosts`` x ``per_host`` GPUs ``chip`` (``host_bounds``
    are (hosts, GPUs per host, 1); JAX's topology API through the CUDA plugin, cached by
    config: a new capture of a name is new devices); :class:`aot.GpuCompilerMissingError`
    in one line without the plugin."""
    hosts, per_host = host_bounds[0], host_bounds[1]
    config = config_for(chip)
    if config is None:
        check_known_gpu(name, chip)
    assert config is not None
    check_compiler(name)
    return _devices(config, hosts, per_host, name)


def cuda_plugins() -> dict[str, str]:
    """The installed distributions of JAX's CUDA plugin and their versions
    (``{"jax-cuda12-plugin": "0.10.2", "jax-cuda12-pjrt": "0.10.2"}``), read from their
    metadata: nothing is imported. Read once per ``sys.path`` (every GPU compile asks)."""
    import sys

    return dict(_cuda_plugins(tuple(sys.path)))


#: The CUDA majors JAX publishes a plugin for (jax-cudaN-plugin, jax-cudaN-pjrt).
_CUDA_MAJORS = ("12", "13")


@lru_cache(maxsize=4)
def _cuda_plugins(path: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    from importlib import metadata

    found: list[tuple[str, str]] = []
    for major in _CUDA_MAJORS:  # by name, the first on the path: as pip and JAX see them
        for kind in ("plugin", "pjrt"):
            name = f"jax-cuda{major}-{kind}"
            try:
                found.append((name, metadata.version(name)))
            except metadata.PackageNotFoundError:
                continue
    return tuple(found)


def jaxlib_version() -> str:
    from aot.jaxcompat.versions import installed_version

    return installed_version("jaxlib") or "unknown"


def _cuda_major(jaxlib: str, plugins: dict[str, str]) -> str:
    """The CUDA major whose plugin to install for ``jaxlib``: the one installed, where
    JAX publishes it for that release; else 12 up to its last release, 13 after."""
    from aot.jaxcompat.versions import release_tuple

    last12 = release_tuple(jaxlib) <= _LAST_CUDA12
    for name in sorted(plugins):
        major = name.split("-")[1].removeprefix("cuda")
        if major != "12" or last12:
            return major
    return "12" if last12 else "13"


def install_command(jaxlib: str | None = None, plugins: dict[str, str] | None = None) -> str:
    """The pip command that installs the CUDA plugin of ``jaxlib``'s release (JAX's own
    extra, without the CUDA runtime a compile does not need) and ptxas."""
    jaxlib = jaxlib or jaxlib_version()
    major = _cuda_major(jaxlib, cuda_plugins() if plugins is None else plugins)
    return (f"pip install 'jax[cuda{major}-local]=={jaxlib}' {_PTXAS[major]} (the CUDA plugin of jaxlib {jaxlib}, "
            "and ptxas)")


def compiler_problem(jaxlib: str, plugins: dict[str, str], importable: bool) -> tuple[type[DeviceTargetError], str] | None:
    """Why this host cannot compile for a GPU (the error class and the reason, one line),
    or None: a GPU compile uses only a CUDA plugin whose release is jaxlib's, as a GPU
    host of that release runs it (the plugin is part of the key), at or above
    :data:`GPU_FLOOR`. ``plugins``: :func:`cuda_plugins`; ``importable``: whether its
    ``jax_plugins`` module is there (:func:`plugin_installed`)."""
    from aot.jaxcompat.versions import release_tuple

    if release_tuple(jaxlib) < release_tuple(GPU_FLOOR):
        return DeviceTargetError, (
            f"GPU targets need jaxlib {GPU_FLOOR} or later (older CUDA plugins cannot read the GPU target configs "
            f"jax-aot ships), and jaxlib here is {jaxlib}; compile GPU targets with jax {GPU_FLOOR} or later"
        )
    majors = sorted({name.split("-")[1] for name in plugins})
    matching = any(plugins.get(f"jax-{m}-plugin") == jaxlib and plugins.get(f"jax-{m}-pjrt") == jaxlib for m in majors)
    if matching and importable:
        return None
    if matching or not plugins:  # no plugin, or its distribution without its module
        return GpuCompilerMissingError, f"JAX's CUDA plugin is not installed here; {install_command(jaxlib, plugins)}"
    found = ", ".join(f"{name} {version}" for name, version in sorted(plugins.items()))
    return GpuCompilerMissingError, (
        f"the CUDA plugin here is {found} and jaxlib is {jaxlib}; a GPU compile needs the plugin of jaxlib's "
        f"release (a GPU host on jaxlib {jaxlib} runs that one, and it is part of the key): "
        f"{install_command(jaxlib, plugins)}"
    )


def problem_here() -> tuple[type[DeviceTargetError], str] | None:
    """:func:`compiler_problem` of this process's jaxlib and CUDA plugin."""
    return compiler_problem(jaxlib_version(), cuda_plugins(), plugin_installed())


def check_compiler(name: str) -> None:
    """Refuses, in one line, a compile for GPU target ``name`` that this host's CUDA
    plugin cannot make for jaxlib's release (:func:`compiler_problem`)."""
    problem = problem_here()
    if problem is not None:
        error, reason = problem
        raise error(f"cannot compile for {name}: {reason}")


@lru_cache(maxsize=None)
def _devices(config: GpuConfig, hosts: int, per_host: int, name: str) -> tuple[Any, ...]:
    from jax.experimental import topologies

    from aot.libtpu_log import quiet_libtpu_load

    try:
        # The plugin starts here (the first topology): on a host without a CUDA driver it
        # says so on fd 2 ("Could not find cuda drivers"), which a deviceless compile expects.
        with quiet_libtpu_load():
            topology = topologies.get_topology_desc(
                platform=PLATFORM, target_config=config.text, topology=f"1x{hosts}x{per_host}",
            )
    except (RuntimeError, NotImplementedError) as exc:  # JaxRuntimeError is a RuntimeError
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        if "not implemented for cuda" in first:
            # The plugin registers its deviceless topologies when it initialises, which
            # fails without a CUDA driver unless JAX_PLATFORMS keeps it from checking.
            raise GpuCompilerMissingError(
                f"cannot compile for {name}: JAX's CUDA plugin did not start in this process (a host without "
                f"a CUDA driver needs JAX_PLATFORMS=cpu, here {os.environ.get('JAX_PLATFORMS') or 'unset'}); set "
                "JAX_PLATFORMS=cpu before importing jax (aot warmup/compile --target set it themselves)"
            ) from None
        if "Unknown backend" in first or "not found" in first.lower() and "plugin" in first.lower():
            raise GpuCompilerMissingError(f"cannot compile for {name}: {first}; {install_command()}") from None
        raise DeviceTargetError(
            f"cannot compile for {name}: the CUDA plugin refused its target config ({config.source}): {first[:300]}"
        ) from None
    devices = tuple(topology.devices)
    _CONFIG_OF_DEVICES.update(dict.fromkeys(devices, config))
    log.info("target %s: %d compile-only %s device(s) (%s config)", name, len(devices), getattr(devices[0], "device_kind", "?"), config.source)
    return devices


def config_of_devices(devices: Any) -> GpuConfig | None:
    """The config a target's compile-only ``devices`` were made from; None for a real GPU's."""
    return _CONFIG_OF_DEVICES.get(devices[0]) if len(devices) else None


def gpu_parts(devices: Any) -> dict[str, str]:
    """The environment parts of GPU ``devices`` beyond the platform-neutral ones, read
    the same way from a target's compile-only devices (their config and its recorded
    versions) and from a GPU's own (its config and the libraries this process loaded)."""
    config = config_of_devices(devices)
    first = devices[0]
    if config is not None:
        versions = dict(config.versions)
        digest = config.digest
    else:  # this host's own GPU
        from aot.jaxcompat.gpu import gpu_target_config

        text = gpu_target_config(devices)
        digest = config_digest(text if isinstance(text, str) else _as_text(text)) if text is not None else UNKNOWN
        versions = live_versions()
    # A GPU's client says "PJRT C API" and then its CUDA version, a compile-only one the
    # device's name: the first line is the plugin's API, the rest the parts below cover.
    platform_version = str(getattr(getattr(first, "client", None), "platform_version", "")).splitlines()
    return {
        "platform_version": _platform_api(platform_version[0]) if platform_version else UNKNOWN,
        "gpu_compute_capability": str(getattr(first, "compute_capability", UNKNOWN)),
        "gpu_target_config": digest,
        "cuda_versions": " ".join(f"{k}={versions.get(k, UNKNOWN)}" for k in ("runtime", "cudnn", "cublas", "nccl")),
        "gpu_plugin": plugin_versions(),
        # The hosts and GPUs by id: the coordinates a GPU reports are not the same on a
        # GPU and in a deviceless topology, and say nothing the ids and processes don't.
        "topology": ",".join(f"{d.id}/p{d.process_index}" for d in sorted(devices, key=lambda d: d.id)),
    }


def _platform_api(first_line: str) -> str:
    """The plugin's API from the first line of a client's platform version: jaxlib 0.12's
    compile-only client says ``cuda 0`` (no CUDA runtime loaded) where 0.10's says ``PJRT
    C API``; the runtime's number is :func:`gpu_parts`' ``cuda_versions``, not this part
    (a GPU host's loaded runtime would otherwise split its key from a deviceless one)."""
    return re.sub(r"^(cuda|rocm) \d+$", r"\1", first_line.strip())


def live_versions() -> dict[str, str]:
    """The CUDA runtime, driver, cuDNN, cuBLAS versions this process loaded, and NCCL's."""
    from aot.jaxcompat.gpu import cuda_versions

    versions = cuda_versions()
    versions["nccl"] = nccl_version()
    return versions


def capture_here(runtime: str | None, default_devices: Any) -> tuple[str, dict[str, str]]:
    """This host's GPU: its target config (text) and the versions the key and the
    record need (CUDA runtime and driver, cuDNN, cuBLAS, NCCL, the plugin, jaxlib).
    ``runtime``: this host's accelerator runtime (:func:`aot.device.accelerator_runtime`);
    ``default_devices``: what opens its devices (:func:`aot.device.default_devices`), called
    only where there is a GPU. :class:`aot.TargetCaptureError` in one line on a host without
    a GPU (it opens no device there), or where this jaxlib does not expose the config."""
    from aot.errors import TargetCaptureError

    if runtime is None or not plugin_installed():
        raise TargetCaptureError(
            "aot target capture records this host's GPU, and this host has none (no CUDA plugin of JAX, "
            f"{runtime or 'no accelerator'}); run it on a GPU host of the fleet, or record a config written "
            "elsewhere with --from-file CONFIG"
        )
    import jax
    import jaxlib

    from aot.jaxcompat.gpu import gpu_target_config

    devices = default_devices()
    if devices[0].platform != "gpu":
        raise TargetCaptureError(
            f"aot target capture records this host's GPU, and JAX's backend here is {devices[0].platform!r}; "
            "run it on a GPU host (JAX_PLATFORMS unset or cuda), or give --from-file CONFIG"
        )
    config = gpu_target_config(devices[:1])
    if config is None:
        raise TargetCaptureError(
            f"jaxlib {jaxlib.__version__} does not give a GPU's target config (get_topology_for_devices(...)."
            "target_config); capture with jaxlib 0.11 or later, or give --from-file CONFIG"
        )
    if isinstance(config, bytes):
        raise TargetCaptureError(
            f"jaxlib {jaxlib.__version__} gives the GPU's target config as a serialized proto, not text; "
            "give it as text with --from-file CONFIG"
        )
    versions = live_versions()
    versions.update(plugin=plugin_versions(), jax=jax.__version__, jaxlib=jaxlib.__version__,
                    device_kind=devices[0].device_kind, gpus=str(len(devices)))
    return config, versions


def check_config(text: str, source: str) -> str:
    """``text`` when it reads as a GPU target config; :class:`aot.TargetCaptureError` else."""
    from aot.errors import TargetCaptureError

    if "gpu_device_info" not in text or "device_description_str" not in text:
        raise TargetCaptureError(
            f"{source} is not a GPU target config (a stream_executor.GpuTargetConfigProto in text format, "
            "with gpu_device_info and device_description_str); aot target capture NAME on the GPU host writes one"
        )
    return text


def check_autotune(text: str, source: str) -> str:
    """``text`` when it reads as XLA's autotune results (text format, with a version)."""
    from aot.errors import TargetCaptureError

    if not re.search(r"^\s*version:\s*\d+", text, re.MULTILINE):
        raise TargetCaptureError(
            f"{source} is not XLA's autotune results (text format, starting with 'version: N'); write them on "
            "the GPU with XLA_FLAGS=--xla_gpu_dump_autotune_results_to=FILE.textproto"
        )
    return text


def _as_text(config: bytes) -> str:
    return "bytes:" + hashlib.sha256(config).hexdigest()


def autotune_options(config: GpuConfig, folder: Path) -> tuple[dict[str, Any], str] | None:
    """XLA's options that load ``config``'s autotune results (written under ``folder``)
    and require them to be complete, with the results' digest; None without results."""
    if not config.autotune:
        return None
    digest = config.autotune_digest
    assert digest is not None
    path = folder / f"autotune-{digest.split(':', 1)[1][:32]}.textproto"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(config.autotune, encoding="utf-8")
        os.replace(tmp, path)
    return {
        "xla_gpu_load_autotune_results_from": str(path),
        "xla_gpu_require_complete_aot_autotune_results": True,
    }, digest


def _autotune_folder() -> Path:
    folder = _captured_folder()
    if folder is not None:
        return folder
    import tempfile

    return Path(tempfile.gettempdir()) / f"jax-aot-autotune-{os.getuid() if hasattr(os, 'getuid') else 0}"


def missing_results(exc: BaseException) -> bool:
    """Whether XLA refused a compile because the loaded autotune results lack some of
    the program's fusions (``--xla_gpu_require_complete_aot_autotune_results``)."""
    text = str(exc)
    return text.startswith("NOT_FOUND") and ("cached config" in text or "autotun" in text.lower())


def environment_parts(devices: Any) -> dict[str, str]:
    """:func:`gpu_parts`: what a GPU executable depends on besides the platform-neutral parts."""
    return gpu_parts(devices)


def compile_tuned(
    devices: Any, options: dict[str, Any] | None, compile_fn: Any, name: str,
) -> tuple[Any, Tuning | None]:
    """``compile_fn(options)`` for a program lowered on ``devices``, with the captured
    autotune results of their GPU when there are, and what it was compiled with:
    ``tuned sha256:...`` (every fusion found in the GPU's results), ``defaults`` (XLA's
    default configs: no results for this GPU), ``defaults sha256:...`` (some of the
    program's fusions missing from those results, said in a warning), ``measured`` (compiled on the GPU itself, which
    autotunes as it compiles), None (not a GPU)."""
    if not len(devices) or devices[0].platform != "gpu":
        return compile_fn(options), None
    config = config_of_devices(devices)
    if config is None:
        return compile_fn(options), Tuning(MEASURED)
    tuned = autotune_options(config, _autotune_folder())
    if tuned is None:
        return compile_fn(options), Tuning(DEFAULTS)
    from aot.libtpu_log import held_stderr, write_stderr

    extra, digest = tuned
    held: list[str] = []
    try:
        with held_stderr() as held:
            compiled = compile_fn({**(options or {}), **extra})
        write_stderr("".join(held))
        return compiled, Tuning(TUNED, digest)
    except RuntimeError as exc:  # JaxRuntimeError is one
        if not missing_results(exc):
            write_stderr("".join(held))
            first = (str(exc).splitlines() or [""])[0]
            raise DeviceTargetError(
                f"{name}: XLA refused the autotune results captured for cuda:{config.name} ({first[:200]}); "
                f"capture them again on the GPU (aot target capture {config.name} --autotune FILE)"
            ) from None
        # XLA logged each missing fusion with its HLO (a line per fusion, a train step's
        # hundreds): kept at DEBUG; the warning says it once.
        for line in "".join(held).splitlines():
            log.debug("xla: %s", line)
        first = (str(exc).splitlines() or [""])[0].split(" See logs")[0]
        log.warning(
            "%s: the autotune results captured for cuda:%s lack some of its fusions (%s); compiled with "
            "XLA's default configs instead (the entry says 'defaults'); to tune it, warm it up on the GPU "
            "with --xla_gpu_dump_autotune_results_to and capture the results again",
            name, config.name, first[:160],
        )
        # With the results' digest: a later warm-up recompiles it only for other results.
        return compile_fn(options), Tuning(DEFAULTS, digest)


def needs_retune(devices: Any, stored: Tuning | None) -> bool:
    """Whether an entry stored with autotuning ``stored`` (its manifest's) is to be
    compiled again for ``devices``' target: it got XLA's defaults, and results it has
    not tried are captured for the GPU now."""
    config = config_of_devices(devices) if len(devices) else None
    if config is None or not config.autotune or stored is None or not stored.fell_back:
        return False
    return stored.results != config.autotune_digest


def replaces_defaults(stored_manifest: str | None, autotune: str | None) -> bool:
    """Whether an entry compiled with autotuning ``autotune`` (tuned, or its fallback to
    the defaults recorded with the captured results' digest) replaces the stored row of
    its key, manifest text ``stored_manifest``, which got XLA's defaults before: the
    same program and environment (:func:`needs_retune`)."""
    if not autotune or not stored_manifest:
        return False
    try:
        stored = Tuning.parse(json.loads(stored_manifest).get("autotune"))
    except (ValueError, AttributeError):  # an unreadable row: verify's to report, not a retune
        return False
    return stored is not None and stored.fell_back and stored != Tuning.parse(autotune)


def cudnn_missing(exc: BaseException | None) -> BaseException | None:
    """The error in ``exc``'s chain that says cuDNN is missing (JAX checks for it when
    it lowers cuDNN attention; jaxlib 0.12 hands its RuntimeError on as the cause of a
    nanobind SystemError), or None."""
    from aot.jaxcompat.gpu import cudnn_check_failed

    seen = 0
    while exc is not None and seen < 8:
        if "cuDNN" in str(exc) or cudnn_check_failed(exc):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def cudnn_error(name: str, target: str, exc: BaseException | None) -> DeviceTargetError:
    """The one-line error for a program JAX lowers through cuDNN (cuDNN attention:
    ``jax.nn.dot_product_attention(..., implementation="cudnn")``), which JAX checks
    against the cuDNN loaded in the compiling process: none on a CPU runner."""
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, SystemError):  # jaxlib 0.12's untranslated error: it says nothing
        first = "cuDNN not found."
    plugins = cuda_plugins()
    major = _cuda_major(jaxlib_version(), plugins) if plugins else "12"
    return DeviceTargetError(
        f"{name}: cannot be compiled for {target} here: it calls cuDNN (cuDNN attention, for one), which JAX "
        f"looks up in the compiling process when it lowers ({first[:160]}); install cuDNN beside the CUDA plugin "
        f"(pip install nvidia-cudnn-cu{major}) or compile this program on the GPU, or use "
        "implementation='xla' for a deviceless compile"
    )


def gpu_name(parts: dict[str, str] | Any) -> str | None:
    """The GPU name of an environment's parts: a captured or shipped config whose digest
    is the parts' (``h200``), else None."""
    digest = parts.get("gpu_target_config")
    if not digest or parts.get("platform") != "gpu":
        return None
    for name in known():
        try:
            config = config_for(name)
        except DeviceTargetError:
            continue
        if config is not None and config.digest == digest:
            return name
    return None


#: The compile step of the protocol (:mod:`aot.platforms`).
compile_step = compile_tuned


def lowering_error(name: str, target: str, exc: BaseException) -> Exception | None:
    """The one-line error for a lowering that failed for want of cuDNN here
    (:func:`cudnn_error`), or None for another failure."""
    missing = cudnn_missing(exc)
    return cudnn_error(name, target, missing) if missing is not None else None
