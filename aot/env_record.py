"""A per-host record of this environment's fingerprint parts, so that commands that only
list or filter (``aot ls``, ``show``, ``stats``, ``rm``, completion) need not import JAX.

The environment fingerprint (:func:`aot.fingerprint.environment_parts`) asks the
devices: it needs JAX and a backend, 1-2 s. Every process that computes it with JAX
(a compile, a warm-up, ``aot.load``, ``aot doctor``) writes what it found here, under a
*key* made of everything that can change the answer without the machine rebooting:

- the record format, the Python environment (``sys.prefix``) and the installed
  versions of jax, jaxlib and every JAX plugin or libtpu (their ``.dist-info``
  folders in site-packages: no import, no metadata parsed);
- every environment variable JAX, XLA or a device runtime reads: ``JAX_*``, ``XLA_*``,
  ``TPU_*``, ``CUDA_*``, ``ROCM_*``, ``HIP_*``, ``ROCR_*``, ``NVIDIA_*``, ``NEURON_*``,
  ``MEGASCALE_*``, ``PJRT_*``, ``*_VISIBLE_DEVICES``, ``LD_LIBRARY_PATH``;
- the boot id (``/proc/sys/kernel/random/boot_id``): a new boot, new hardware or a
  new driver is a new key. Without a boot id (not Linux) nothing is recorded.

Reading recomputes the key from the reading process (no JAX) and takes the record
only if it was written under exactly that key; anything else (no file, another key,
unreadable JSON) is "no record", and the caller computes the real fingerprint.

Honesty on the writing side: a process records only what a fresh process with the same
key would compute. It does not when its configuration differs from what the
environment variables say (``jax.config.update`` of x64, platforms or the CPU device
count), when it asked for a non-default backend, or when the key's variables changed
since it started (the backend may have started under the old ones; ``/proc/self/environ``
holds them).

A host of a slice: a process of a multi-process job (``jax.distributed``,
``process_count > 1``) computes the slice's environment (every process's devices, the
process count: the same in every process of the job), which is what that host serves.
The same key can also give a single-process answer (the job's code calls
``jax.distributed.initialize``, which no environment variable shows), so the slice's
parts go to a record of their own (:func:`slice_record_path`), never over the host's.
A reader takes the slice's record when there is one under its key: a host that has run
as part of a slice, with these versions, variables and boot, serves the slice's entries,
and ``aot ls`` / ``why`` label those ``this`` without opening the device.

``import jax`` sets a few variables itself (``TPU_LIBRARY_PATH``, ``TPU_ML_PLATFORM``, ...:
:data:`_SET_BY_JAX`); the key takes them as they were when the process started, on
both sides, so that TPU hosts get records. Without a record, a host with a device
(:func:`aot.device.accelerator_runtime`) does not compute the environment (it would open, or wait for, a device another
process may hold): :func:`aot.fingerprint.known_environment`.

The record only serves listing, filtering, ``why``, ``verify`` and ``doctor``:
:func:`aot.load` and compiles always compute the real fingerprint, so a stale record
can at worst mislabel the ENV column of a listing, never make the loader serve a wrong entry.

``AOT_ENV_RECORD``: the folder of the records (default: ``$XDG_CACHE_HOME/jax-aot/environment``,
i.e. ``~/.cache/jax-aot/environment``); ``off`` (or ``0``) disables reading and writing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RECORD_ENV = "AOT_ENV_RECORD"
RECORD_FORMAT = 1
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"

_PREFIXES = (
    "JAX_", "XLA_", "TPU_", "CUDA_", "ROCM_", "HIP_", "ROCR_", "NVIDIA_", "NEURON_",
    "MEGASCALE_", "PJRT_", "CLOUD_TPU", "LIBTPU",
)
_NAMES = frozenset({"LD_LIBRARY_PATH"})
# Distributions whose presence or version can change what JAX finds: jax, jaxlib,
# jax_cuda12_plugin, jax_cuda12_pjrt, jax_rocm*, libtpu, ...
_DISTRIBUTION_PREFIXES = ("jax", "libtpu")
_TRUE = ("y", "yes", "t", "true", "on", "1")
# Set by `import jax` itself, the same way in every process (jax/_src/cloud_tpu_init.py;
# libtpu/__init__.py sets TPU_LIBRARY_PATH): a change of one of these since the process
# started is JAX's own, when the variable was unset at the start (``setdefault``) or,
# for the two JAX sets unconditionally, when it has the value JAX gives it.
_SET_BY_JAX = frozenset({
    "TPU_SKIP_MDS_QUERY", "TPU_ML_PLATFORM", "TPU_ML_PLATFORM_VERSION", "LIBTPU_INIT_ARGS", "TPU_LIBRARY_PATH",
})
_LAUNCH_BARRIER = " --xla_tpu_use_enhanced_launch_barrier=true"


def _set_by_jax(name: str, before: str | None, now: str | None) -> bool:
    """Whether ``name`` changing from ``before`` (at the start) to ``now`` is JAX's doing."""
    if name not in _SET_BY_JAX or now is None:
        return False
    if before is None:
        return True
    if name == "LIBTPU_INIT_ARGS":
        return now == before + _LAUNCH_BARRIER
    return name == "TPU_SKIP_MDS_QUERY" and now == "1"


def changed_since_start(initial: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The key's variables whose change between ``initial`` (the process's start) and
    ``now`` was not made by ``import jax``, sorted."""
    before, after = relevant_variables(initial), relevant_variables(now)
    return sorted(
        name for name in set(before) | set(after)
        if before.get(name) != after.get(name) and not _set_by_jax(name, before.get(name), after.get(name))
    )


def _as_at_start(environ: Mapping[str, str]) -> Mapping[str, str]:
    """``environ`` with the variables ``import jax`` sets as they were when this process
    started: a reader that has imported JAX (``aot doctor``) finds the record its shell's
    other processes wrote."""
    if not any(name in environ for name in _SET_BY_JAX):
        return environ
    initial = _initial_environment()
    if initial is None:
        return environ
    out = dict(environ)
    for name in _SET_BY_JAX:
        if _set_by_jax(name, initial.get(name), environ.get(name)):
            if name in initial:
                out[name] = initial[name]
            else:
                out.pop(name, None)
    return out


def relevant_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment variables of the key, sorted by name."""
    return {
        k: environ[k] for k in sorted(environ)
        if k.startswith(_PREFIXES) or k.endswith("_VISIBLE_DEVICES") or k in _NAMES
    }


def _boot_id() -> str | None:
    try:
        with open(BOOT_ID_FILE, encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def installed_distributions() -> list[str]:
    """The installed distributions named jax*, libtpu* (jax, jaxlib, the CUDA/ROCm/TPU
    plugins), as their ``NAME-VERSION.dist-info`` folders in the site-packages folders
    on ``sys.path``: a listing of a folder or two, no metadata parsed, nothing imported.
    An upgrade, a new plugin or a removed one changes the list."""
    found: list[str] = []
    for entry in dict.fromkeys(sys.path):
        if not entry.rstrip(os.sep).endswith(("site-packages", "dist-packages")):
            continue
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        found += [
            f"{entry}/{n}" for n in names
            if n.endswith((".dist-info", ".egg-info")) and n.lower().startswith(_DISTRIBUTION_PREFIXES)
        ]
    return sorted(found)


def record_key(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """What a record is written and read under (None: this host cannot have records)."""
    boot = _boot_id()
    if boot is None:
        return None
    return {
        "format": RECORD_FORMAT,
        "boot_id": boot,
        "prefix": sys.prefix,
        "versions": installed_distributions(),
        "variables": relevant_variables(_as_at_start(os.environ) if environ is None else environ),
    }


def record_folder() -> Path | None:
    """Where records live (None: ``AOT_ENV_RECORD=off``)."""
    configured = os.environ.get(RECORD_ENV, "").strip()
    if configured.lower() in ("off", "0", "no", "false"):
        return None
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "jax-aot" / "environment"


def record_path(key: Mapping[str, Any], folder: Path | None = None) -> Path:
    """The file of the record of ``key`` (in :func:`record_folder` unless given)."""
    folder = record_folder() if folder is None else folder
    if folder is None:
        raise ValueError(f"{RECORD_ENV}=off: no environment records")
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return folder / f"{digest[:40]}.json"


def slice_record_path(key: Mapping[str, Any], folder: Path | None = None) -> Path:
    """The file of the slice's record of ``key``: what a process of a multi-process job
    computed (``process_count > 1``), next to the host's own."""
    path = record_path(key, folder)
    return path.with_name(path.stem + ".slice.json")


def read_parts() -> dict[str, str] | None:
    """The environment parts recorded under this process's key, or None: the slice's
    (a process of a multi-process job wrote them) when there are, else the host's."""
    folder = record_folder()
    key = record_key() if folder is not None else None
    if folder is None or key is None:
        return None
    for path in (slice_record_path(key, folder), record_path(key, folder)):
        parts = _read(path, key)
        if parts is not None:
            return parts
    return None


def _read(path: Path, key: Mapping[str, Any]) -> dict[str, str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.debug("environment record %s unreadable (%s): ignored", path, exc)
        return None
    if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("parts"), dict):
        log.debug("environment record %s is not for this key: ignored", path)
        return None
    return {str(k): str(v) for k, v in data["parts"].items()}


def _initial_environment() -> dict[str, str] | None:
    """This process's environment when it started (Linux), or None."""
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            out[name.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _config_matches_environment(parts: Mapping[str, str]) -> bool:
    """Whether JAX's configuration is what the environment variables alone give (a
    fresh ``aot ls`` has no ``jax.config.update`` of its own)."""
    from aot.jaxcompat.releases import config_value

    x64 = os.environ.get("JAX_ENABLE_X64", "0").strip().lower() in _TRUE
    if parts.get("x64") != str(x64).lower():
        return False
    platforms = config_value("jax_platforms") or None
    wanted_platforms = os.environ.get("JAX_PLATFORMS") or None
    # On a TPU host `import jax` sets jax_platforms to "tpu,cpu" when the variable is
    # unset (jax/_src/cloud_tpu_init.py), as it does in every fresh process there; it
    # sets TPU_ML_PLATFORM on the same path.
    by_jax = wanted_platforms is None and platforms == "tpu,cpu" and "TPU_ML_PLATFORM" in os.environ
    if platforms != wanted_platforms and not by_jax:
        return False
    cpu_devices = config_value("jax_num_cpu_devices", -1)
    wanted = os.environ.get("JAX_NUM_CPU_DEVICES", "").strip()
    return str(cpu_devices) == (wanted or "-1")


_written: set[tuple[str, str]] = set()
# (parts, variables) this process has already recorded or refused (a compile computes
# the fingerprint once per computation: 0.6 ms each without this).
_handled: set[tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]] = set()


def remember(parts: Mapping[str, str]) -> None:
    """Records ``parts`` (just computed with JAX, default backend) for this key, when a
    fresh process with this key would compute the same; never fails the caller."""
    seen = (tuple(sorted(parts.items())), tuple(relevant_variables(os.environ).items()))
    if seen in _handled:  # the same answer under the same variables: decided already
        return
    try:
        _remember(parts)
    except Exception as exc:  # noqa: BLE001 - a record is an optimisation, never an error
        log.debug("environment record not written: %s", exc)
    _handled.add(seen)


def _remember(parts: Mapping[str, str]) -> None:
    folder = record_folder()
    if folder is None or not parts.get("process_count", "").isdigit():
        return
    initial = _initial_environment()
    if initial is None:
        return
    # The key holds the variables the process started with, as a fresh `aot ls`
    # started in the same shell has them; JAX's import sets a few itself, the same way
    # in every process (jax/_src/cloud_tpu_init.py). Any other change since the start
    # means the backend may have seen other values: nothing is recorded.
    key = record_key(initial)
    changed = changed_since_start(initial, os.environ)
    if key is None or changed:
        if changed:
            log.debug("environment record not written: %s changed since the process started", ", ".join(changed))
        return
    if not _config_matches_environment(parts):
        return
    # A process of a multi-process job: the slice's parts, in a record of their own.
    path = record_path(key, folder) if parts["process_count"] == "1" else slice_record_path(key, folder)
    body = json.dumps({"key": key, "parts": dict(sorted(parts.items()))}, indent=1, sort_keys=True)
    if (str(path), body) in _written:
        return
    try:
        if path.read_text(encoding="utf-8") == body:
            _written.add((str(path), body))
            return
    except (OSError, ValueError):
        pass
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".record-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _written.add((str(path), body))
    log.debug("environment record written: %s", path)
