"""This host's default devices, opened only by what needs them, and who holds them.

A TPU chip is opened by one process at a time: while a server holds it, JAX's backend
initialisation in any other process fails after about a second ("The TPU is already in
use by process with pid N"). Commands that only read the cache never open it (their
environment comes from :mod:`aot.env_record`); those that need it call
:func:`default_devices`, which turns JAX's failure into one line that names the holder
and says what to do (:class:`aot.DeviceBusyError`).

:func:`accelerator_runtime` says, without importing JAX, whether initialising the
default backend here could open (or wait for) an accelerator; :func:`device_holder`
finds the process holding a TPU device file (``/dev/vfio/*``, ``/dev/accel*``) by
scanning ``/proc/*/fd``, also without JAX.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aot.errors import DeviceBusyError, DeviceUnavailableError
from aot.platforms.names import label

# Device files a TPU runtime holds open (v5e and later: VFIO; older: /dev/accel*).
# GPUs are shared between processes: their device files say nothing about a holder.
TPU_DEVICE_FILES = ("/dev/vfio/[0-9]*", "/dev/accel*")
# Distributions (``.dist-info`` folder names, lower case) that give JAX a non-CPU backend.
# (libtpu is not one: without a chip it only compiles for TPU targets; a chip is seen by
# its device files, wherever JAX and libtpu are installed.)
_ACCELERATOR_DISTRIBUTIONS = ("jax_cuda", "jax_rocm", "jax-cuda", "jax-rocm", "jax_plugins")
_PID = re.compile(r"in use by process with pid (\d+)")
_BACKEND = re.compile(r"Unable to initialize backend '([\w-]+)'")
_COMMAND_WIDTH = 120  # a holder's command line, shortened: the busy error stays one line
_TARGET_HINT = "compile without the device with --target (e.g. --target tpu:v5e:1x1; see docs/cli.md)"


@dataclass(frozen=True, slots=True)
class Holder:
    """A process that holds a device file open."""

    pid: int
    command: str | None = None  # its command line, when /proc lets us read it
    path: str | None = None  # the device file

    def describe(self) -> str:
        return f"process {self.pid}" + (f" ({self.command})" if self.command else "")


def accelerator_runtime(
    environ: Any = None, distributions: Sequence[str] | None = None,
    device_files: Sequence[str] = TPU_DEVICE_FILES,
) -> str | None:
    """What could make JAX's default backend an accelerator here (``JAX_PLATFORMS``
    naming a non-CPU platform, a TPU's device files, or an installed CUDA / ROCm plugin), or None on
    a CPU-only host, where initialising the backend opens nothing another process can
    hold. Imports nothing."""
    environ = os.environ if environ is None else environ
    platforms = {p.strip().lower() for p in environ.get("JAX_PLATFORMS", "").split(",") if p.strip()}
    if platforms:
        other = sorted(platforms - {"cpu"})
        return f"JAX_PLATFORMS={environ['JAX_PLATFORMS']}" if other else None
    chips = [p for pattern in device_files for p in glob.glob(pattern)]
    if chips:
        return f"a TPU ({sorted(chips)[0]})"
    if distributions is None:
        from aot.env_record import installed_distributions

        distributions = installed_distributions()
    for path in distributions:
        name = os.path.basename(path).lower()
        if name.startswith(_ACCELERATOR_DISTRIBUTIONS):
            return name.split("-")[0] if "-" in name else name
    return None


def has_tpu_device(patterns: Sequence[str] = TPU_DEVICE_FILES) -> bool:
    """Whether this host has a TPU chip: its device files exist."""
    return any(glob.glob(pattern) for pattern in patterns)


def _command_line(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # One line, whatever the arguments hold (``python -c "...multi-line script..."``):
    # it is printed inside a one-line error.
    text = " ".join(" ".join(p.decode(errors="replace").split()) for p in raw.split(b"\0") if p.strip())
    return (text if len(text) <= _COMMAND_WIDTH else text[:_COMMAND_WIDTH - 3] + "...") or None


def device_holder(patterns: Sequence[str] = TPU_DEVICE_FILES, *, proc: str = "/proc") -> Holder | None:
    """Another process that holds one of the device files matching ``patterns`` open,
    or None (no such file, nobody else holds it, or /proc does not tell)."""
    devices = {os.path.realpath(p) for pattern in patterns for p in glob.glob(pattern)}
    if not devices:
        return None
    me = os.getpid()
    try:
        pids = sorted(int(p) for p in os.listdir(proc) if p.isdigit())
    except OSError:
        return None
    for pid in pids:
        if pid == me:
            continue
        folder = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(folder)
        except OSError:
            continue  # gone, or another user's
        for fd in fds:
            try:
                target = os.readlink(f"{folder}/{fd}")
            except OSError:
                continue
            if target in devices:
                return Holder(pid, _command_line(pid), target)
    return None


def held_pid(message: str) -> int | None:
    """The pid in JAX's "already in use by process with pid N" message, or None."""
    found = _PID.search(message)
    return int(found.group(1)) if found else None


def device_error(exc: BaseException, patterns: Sequence[str] = TPU_DEVICE_FILES) -> DeviceUnavailableError | None:
    """The one-line error for JAX's failure to start the default backend (``exc``), or
    None when ``exc`` is not such a failure."""
    message = str(exc)
    backend = _BACKEND.search(message)
    if backend is None and "in use by process" not in message:
        return None
    name = backend.group(1) if backend else "tpu"
    platform = label(name)
    pid = held_pid(message)
    if pid is not None or "already in use" in message:
        holder = device_holder(patterns)
        if holder is None and pid is not None:
            holder = Holder(pid, _command_line(pid))
        who = holder.describe() if holder is not None else "another process"
        return DeviceBusyError(
            f"the {platform} is held by {who}: this command needs the device; stop that process, "
            f"or {_TARGET_HINT}",
            holder.pid if holder is not None else None,
        )
    first = message.splitlines()[0] if message else type(exc).__name__
    reason = first.split(": ", 1)[1] if first.startswith("Unable to initialize backend") and ": " in first else first
    reason = reason.split(" (set JAX_PLATFORMS")[0]
    return DeviceUnavailableError(
        f"the {platform} backend could not start ({reason[:200]}): this command needs the device; "
        f"check the device and JAX_PLATFORMS, or {_TARGET_HINT}"
    )


def default_devices(backend: str | None = None) -> list[Any]:
    """``jax.devices(backend)``; JAX's failure to start the backend becomes
    :class:`aot.DeviceBusyError` (held by another process) or
    :class:`aot.DeviceUnavailableError`, in one line."""
    import jax

    from aot.jaxcompat.runtime import backend_started
    from aot.libtpu_log import quiet_libtpu_load

    try:
        if backend_started():
            return list(jax.devices(backend))
        # The first start may load libtpu (installed for target compiles on a CPU host
        # too), which writes its start-up noise to stderr.
        with quiet_libtpu_load():
            return list(jax.devices(backend))
    except RuntimeError as exc:
        error = device_error(exc)
        if error is None:
            raise
        raise error from None


__all__ = [
    "TPU_DEVICE_FILES", "Holder", "accelerator_runtime", "default_devices", "device_error",
    "device_holder", "has_tpu_device", "held_pid",
]
