"""libtpu's start-up noise on stderr, kept out of CI logs without hiding a real error.

libtpu writes from C++ straight to file descriptor 2, so Python's logging cannot route
it: :func:`quiet_libtpu_load` captures fd 2 while libtpu loads (for a device target's
topology, :mod:`aot.targets`, or as this host's backend, :func:`aot.device.default_devices`),
then logs the lines known to be start-up noise at DEBUG and writes every other line
to the real stderr unchanged.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aot.jaxcompat.runtime import BACKEND_LOGGER

log = logging.getLogger(__name__)

__all__ = [
    "LIBTPU_NOISE", "XLA_CPU_LOAD_NOISE", "deserialize_quietly", "filter_libtpu_stderr", "held_stderr", "quiet_cpu_load",
    "quiet_jax_import", "quiet_libtpu_load", "write_stderr",
]

# What libtpu (0.0.42.1, under jax 0.10.2) writes to stderr, from C++ on fd 2, whenever a
# process loads it (for a target's topology, or as a backend JAX tries) on a host that is
# not a TPU VM (a CPU CI runner, a laptop): it looks for this host's accelerator type and
# TPU workers (GCE metadata, TPU_* variables), finds none, and carries on; a deviceless
# compile needs neither (seen on this project's CPU machines and quoted in issue 43). An
# "E0000 ... INVALID_ARGUMENT" line reads as a failure in CI logs, so these lines are
# logged at DEBUG instead. Only these: any other line is written to stderr unchanged.
# Do not silence them by setting TPU_* variables: libtpu reads every one, and they
# enter the environment record's key (aot.env_record).
LIBTPU_NOISE: tuple[re.Pattern[str], ...] = (
    re.compile(r"^Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type"),
    re.compile(r"^WARNING: Logging before InitGoogle\(\) is written to STDERR$"),
    re.compile(
        r"^E\d{4} [\d:.]+\s+\d+ common_lib\.cc:\d+\] INVALID_ARGUMENT: Error: unexpected worker "
        r"hostname 'WARNING: could not determine TPU worker hostnames"
    ),
    re.compile(r"^I\d{4} [\d:.]+\s+\d+ \S+\] "),  # glog INFO lines: never a failure
    # JAX's CUDA plugin, loaded by `import jax` where it is installed (jax-aot[cuda12]), on a
    # host without a CUDA driver (a CPU runner compiling for cuda: targets): absl's banner,
    # then glog INFO "cudart_stub.cc] Could not find cuda drivers on your machine" (above).
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"),
)
# What XLA's CPU runtime of jaxlib 0.9.x writes to fd 2 each time it loads a stored CPU
# executable (seen with 0.9.2 on an AMD EPYC with AVX-512; 0.10.2 writes nothing there):
# - "W ... pjrt_executable.cc:642] Assume version compatibility. PjRt-IFRT does not track
#   XLA executable versions.": every deserialization, whatever the executable;
# - "E ... cpu_aot_loader.cc:220] ... Target machine feature +prefer-no-gather is not
#   supported on the host machine ... SIGILL", once per such feature. XLA's CPU compiler
#   adds LLVM *tuning* features (+prefer-no-gather, +prefer-no-scatter: gathers and
#   scatters are slow on AMD Zen) to the features it compiles for, and its loader checks
#   every compile feature against the host's hardware features, which never list a
#   tuning one. The compile happened on this CPU (the environment key holds its ISA), so
#   nothing can SIGILL; no compile option drops those two features (XLA adds them
#   itself), so the lines are caught here. Only tuning features (prefer-, fast-, slow-):
#   a missing hardware feature (+avx512f) is still written, it is a real warning.
#   jaxlib 0.10.2 carries the same message (at E or W level, whichever a release uses),
#   though it did not write it on this project's machine: caught on every release.
XLA_CPU_LOAD_NOISE: tuple[re.Pattern[str], ...] = (
    re.compile(
        r"^W\d{4} [\d:.]+\s+\d+ pjrt_executable\.cc:\d+\] Assume version compatibility\. "
        r"PjRt-IFRT does not track XLA executable versions\.$"
    ),
    re.compile(
        r"^[EW]\d{4} [\d:.]+\s+\d+ cpu_aot_loader\.cc:\d+\] Loading XLA:CPU AOT result\. Target machine "
        r"feature \+(prefer|fast|slow)-[\w.-]+ is not\s+supported on the host machine\."
    ),
)
# The lines of a source-location trace that follow a glog line: they go where it goes.
_TRACE_LINE = re.compile(r"^(=== Source Location Trace: ===|[\w./-]+\.cc:\d+)$")
# fd 2 is the process's: one capture at a time (another thread's writes to stderr
# during a load are held back until it ends, then written, never dropped).
_CAPTURE_LOCK = threading.RLock()  # re-entrant: a nested capture writes into the outer one


def filter_libtpu_stderr(text: str, noise_patterns: tuple[re.Pattern[str], ...] = LIBTPU_NOISE) -> tuple[str, list[str]]:
    """Splits what libtpu wrote to stderr while loading into the text to write on
    (every line that is not :data:`LIBTPU_NOISE`, or ``noise_patterns``, unchanged)
    and the noise lines."""
    kept: list[str] = []
    dropped: list[str] = []
    noise = False
    for line in text.splitlines(keepends=True):
        bare = line.strip()
        if not (_TRACE_LINE.match(bare) and kept + dropped):
            noise = any(p.match(bare) for p in noise_patterns)
        (dropped if noise else kept).append(line)
    return "".join(kept), [line.rstrip("\n") for line in dropped]


@contextmanager
def quiet_libtpu_load() -> Iterator[None]:
    """Captures fd 2 while libtpu loads; afterwards logs its start-up noise at DEBUG and
    writes every other line to the real stderr. When the load fails, every line is
    written (never hide what explains a failure); the exception passes unchanged."""
    with _quiet(LIBTPU_NOISE, "libtpu"):
        yield


@contextmanager
def quiet_cpu_load() -> Iterator[None]:
    """:func:`quiet_libtpu_load` for XLA's CPU runtime loading a stored executable:
    :data:`XLA_CPU_LOAD_NOISE` logged at DEBUG, every other line written on."""
    with _quiet(XLA_CPU_LOAD_NOISE, "XLA:CPU load"):
        yield


def deserialize_quietly(backend: Any, exe_bytes: bytes, devices: Any) -> Any:
    """XLA's deserialization of a stored executable (the one path of every load, and
    of the serving read-ahead); on CPU under :func:`quiet_cpu_load`."""
    from aot.jaxcompat.deserialize import deserialize_xla_executable

    if getattr(backend, "platform", None) != "cpu":
        return deserialize_xla_executable(backend, exe_bytes, devices)
    with quiet_cpu_load():
        return deserialize_xla_executable(backend, exe_bytes, devices)


@contextmanager
def _quiet(noise_patterns: tuple[re.Pattern[str], ...], source: str) -> Iterator[None]:
    held: list[str] = []
    failed = True
    try:
        with held_stderr() as held:
            yield
        failed = False
    finally:
        text = "".join(held)
        kept, dropped = (text, []) if failed else filter_libtpu_stderr(text, noise_patterns)
        for line in dropped:
            log.debug("%s: %s", source, line)
        write_stderr(kept)


@contextmanager
def held_stderr() -> Iterator[list[str]]:
    """Holds what is written to fd 2 (XLA's C++ logging) while the block runs; the
    yielded list receives it at the end, for the caller to write on
    (:func:`write_stderr`) or to log: a deviceless GPU compile whose autotune results
    miss fusions logs every one of them, with its HLO, before jax-aot compiles it again
    with the defaults (aot.platforms.cuda)."""
    held: list[str] = []
    with _CAPTURE_LOCK:  # fd 2 is saved under the lock too: never another capture's file
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):  # no fd 2 (or no sys.stderr): nothing held
            saved = None
        if saved is None:
            yield held
            return
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                yield held
            finally:
                try:
                    sys.stderr.flush()
                except (OSError, ValueError, AttributeError):
                    pass
                os.dup2(saved, 2)
                os.close(saved)
                captured.seek(0)
                held.append(captured.read().decode(errors="replace"))


def write_stderr(text: str) -> None:
    """Writes ``text`` to fd 2 as it came (what :func:`held_stderr` held)."""
    if text:
        sys.stderr.flush()
        os.write(2, text.encode())


class _QuietJaxImport(importlib.abc.MetaPathFinder):
    """The finder of the first ``import jax``: it hands the import on to the other finders
    with its module's execution under :func:`quiet_libtpu_load` (then steps aside)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "jax":
            return None
        _remove_finder(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        with quiet_libtpu_load():
            self._loader.exec_module(module)


def _remove_finder(finder: object) -> None:
    try:
        sys.meta_path.remove(finder)  # type: ignore[arg-type]
    except ValueError:
        pass


class _PluginStartFilter(logging.Filter):
    """JAX's "Jax plugin configuration error" of the CUDA plugin on a host without a GPU
    (no NVIDIA device file; it cannot start there, as expected: jaxlib 0.10 says it cannot
    load the CUDA libraries, 0.12 that it cannot load cuDNN): logged at DEBUG here instead
    of an ERROR with its traceback. On a host with a GPU, and for any other failure, the
    record passes unchanged."""

    _NO_GPU = re.compile(r"Error loading CUDA libraries|no CUDA-capable device|CUDA_ERROR_NO_DEVICE|"
                         r"Could not find cuda drivers|CUDA driver version is insufficient|Unable to load CUDA|"
                         r"Unable to load cuDNN")

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Jax plugin configuration error") or "cuda" not in record.getMessage():
            return True
        if os.path.exists("/dev/nvidiactl"):  # a GPU host: its plugin's failure is news
            return True
        error = record.exc_info[1] if record.exc_info else None
        while error is not None:
            if self._NO_GPU.search(str(error)):
                log.debug("%s: %s (no CUDA GPU here)", record.getMessage(), str(error).splitlines()[0])
                return False
            error = error.__cause__ or error.__context__
        return True


def quiet_jax_import() -> None:
    """For a command-line process on a host where JAX's CUDA plugin is installed: the
    first ``import jax`` (which loads the plugin) runs under :func:`quiet_libtpu_load`, so
    its driver-less start-up noise (absl's banner, "Could not find cuda drivers") goes to
    DEBUG, and the plugin's start-up failure on a host without a GPU too. Nothing is
    imported here; a process that never imports JAX (``aot ls``) pays a finder's lookup."""
    if "jax" in sys.modules or importlib.util.find_spec("jax_plugins") is None:
        return
    if not any(isinstance(f, _QuietJaxImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietJaxImport())
    logging.getLogger(BACKEND_LOGGER).addFilter(_PluginStartFilter())
