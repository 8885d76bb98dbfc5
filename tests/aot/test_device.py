"""A held or missing device: one-line errors naming the holder (aot.device), found
from JAX's message or by scanning /proc, and the test for an accelerator runtime."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import aot
from aot.device import accelerator_runtime, device_error, device_holder, held_pid

# What JAX 0.10.2 raises on a TPU v5e whose chip another process holds (measured).
HELD = (
    "Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process with pid 1612. "
    "Not attempting to load libtpu.so in this process. (set JAX_PLATFORMS='' to automatically choose an "
    "available backend)"
)
# What it raises here, with JAX_PLATFORMS=tpu and no TPU.
MISSING = (
    "Unable to initialize backend 'tpu': NOT_FOUND: TPU initialization failed: No jellyfish device found. "
    "(set JAX_PLATFORMS='' to automatically choose an available backend)"
)


@pytest.fixture
def holder(tmp_path: Path):  # noqa: ANN201
    """A child process holding an fd open on a file standing in for /dev/vfio/0."""
    device = tmp_path / "vfio" / "0"
    device.parent.mkdir()
    device.write_bytes(b"")
    child = subprocess.Popen(
        [sys.executable, "-c", f"f = open({str(device)!r}); import sys; print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    yield child, str(tmp_path / "vfio" / "[0-9]*")
    child.stdin.close()  # type: ignore[union-attr]
    child.wait(timeout=10)


def test_the_pid_is_read_from_jax_message() -> None:
    assert held_pid(HELD) == 1612
    assert held_pid(MISSING) is None


def test_a_held_tpu_is_one_line_naming_the_holder_and_what_to_do(tmp_path: Path) -> None:
    error = device_error(RuntimeError(HELD), patterns=(str(tmp_path / "none*"),))
    assert isinstance(error, aot.DeviceBusyError) and isinstance(error, aot.AotError)
    assert isinstance(error, RuntimeError) and error.pid == 1612
    text = str(error)
    assert "\n" not in text
    assert text.startswith("the TPU is held by process 1612")
    assert "this command needs the device; stop that process" in text and "--target" in text


def test_a_backend_that_cannot_start_says_so() -> None:
    error = device_error(RuntimeError(MISSING))
    assert isinstance(error, aot.DeviceUnavailableError) and not isinstance(error, aot.DeviceBusyError)
    assert str(error).startswith("the TPU backend could not start (NOT_FOUND: TPU initialization failed")
    assert "\n" not in str(error) and "--target" in str(error)
    assert device_error(RuntimeError("something else")) is None


def test_the_holder_is_found_in_proc(holder) -> None:  # noqa: ANN001
    child, pattern = holder
    found = device_holder((pattern,))
    assert found is not None and found.pid == child.pid
    assert found.command is not None and found.command.startswith(sys.executable + " -c f = open(")
    assert device_holder((pattern + "-none",)) is None
    # JAX's message without a pid: the /proc scan names the holder and its command line.
    error = device_error(RuntimeError("Unable to initialize backend 'tpu': ABORTED: The TPU is already in use"),
                         patterns=(pattern,))
    assert isinstance(error, aot.DeviceBusyError) and error.pid == child.pid
    assert f"held by process {child.pid} (" in str(error)


def test_this_process_is_not_its_own_holder(tmp_path: Path) -> None:
    device = tmp_path / "0"
    device.write_bytes(b"")
    with open(device):
        assert device_holder((str(device),)) is None


def test_an_accelerator_runtime_is_seen_without_jax() -> None:
    assert accelerator_runtime({"JAX_PLATFORMS": "cpu"}, ["/sp/libtpu-0.0.42.1.dist-info"]) is None
    assert accelerator_runtime({"JAX_PLATFORMS": "tpu"}, []) == "JAX_PLATFORMS=tpu"
    assert accelerator_runtime({"JAX_PLATFORMS": "cuda,cpu"}, []) == "JAX_PLATFORMS=cuda,cpu"
    chip = [__file__]  # a file standing in for /dev/vfio/0
    # A chip is seen by its device files, wherever JAX and libtpu are installed.
    assert accelerator_runtime({}, ["/sp/jax-0.10.2.dist-info"], chip) == f"a TPU ({__file__})"
    # libtpu without a chip (a CPU-only runner compiling for TPU targets) opens nothing.
    assert accelerator_runtime({}, ["/sp/libtpu-0.0.42.1.dist-info"], ["/nonexistent/vfio/[0-9]*"]) is None
    assert accelerator_runtime({}, ["/sp/jax_cuda12_plugin-0.10.2.dist-info"]) == "jax_cuda12_plugin"
    assert accelerator_runtime({}, ["/sp/jax-0.10.2.dist-info", "/sp/jaxlib-0.10.2.dist-info"]) is None


def test_jax_failure_to_start_becomes_the_typed_error() -> None:
    """A fresh process with JAX_PLATFORMS=tpu and no TPU: environment_parts raises
    DeviceUnavailableError in one line (a held chip gives DeviceBusyError the same way)."""
    code = (
        "import aot\nfrom aot.fingerprint import environment_fingerprint\n"
        "try:\n    environment_fingerprint()\nexcept aot.DeviceUnavailableError as e:\n"
        "    print(type(e).__name__, '|', e)\n"
    )
    import os

    env = {**os.environ, "JAX_PLATFORMS": "tpu"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    name, _, message = done.stdout.strip().partition(" | ")
    assert name in ("DeviceUnavailableError", "DeviceBusyError"), done.stdout
    assert "\n" not in message and "this command needs the device" in message


def test_a_holders_multi_line_command_is_one_short_line(tmp_path: Path) -> None:
    """A server started with ``python -c "<a script>"`` has newlines in its command line;
    the busy error names it on one line, shortened."""
    script = "import sys\n\nprint('ready', flush=True)\n" + "# padding\n" * 30 + "sys.stdin.read()\n"
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        error = device_error(RuntimeError(HELD.replace("1612", str(child.pid))), patterns=(str(tmp_path / "none*"),))
        text = str(error)
        assert isinstance(error, aot.DeviceBusyError) and error.pid == child.pid
        assert "\n" not in text
        assert f"held by process {child.pid} ({sys.executable} -c import sys print('ready', flush=True) # padding" in text
        command = text.split(f"held by process {child.pid} (", 1)[1].split("): this command", 1)[0]
        assert len(command) == 120 and command.endswith("...")
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait(timeout=10)
