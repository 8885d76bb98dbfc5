"""Helpers of the reliability tests (a module of its own: test modules cannot import
conftest.py unambiguously, tests/conftest.py has the same module name)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "reliability_workers.py"


# ---------------------------------------------------------------- child processes


def child_env() -> dict[str, str]:
    """The environment of child processes: the same 8 CPU devices as this process
    (the device count is part of the environment fingerprint, so keys agree)."""
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("AOT_SIGNING_KEY", None)
    env.pop("AOT_CACHE", None)
    return env


def worker_command(*args: str) -> list[str]:
    return [sys.executable, str(WORKERS), *args]


def run_worker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        worker_command(*args), env=child_env(), capture_output=True, text=True, timeout=timeout,
    )


# ---------------------------------------------------------------- artifacts


class TinyArtifacts:
    """Artifacts of ``reliability_workers.scaled`` for f32[1..N], compiled once."""

    NAME = "rel.tiny"

    def __init__(self, count: int) -> None:
        import aot
        from aot.artifact import EXECUTABLE
        from aot.build import build_artifact

        from tests.reliability import reliability_workers as workers

        self.by_size: dict[int, Any] = {}
        for n in range(1, count + 1):
            computation = aot.lower(workers.scaled, aot.spec(f"f32[{n}]"), name=self.NAME)
            executable = computation.compile()
            self.by_size[n] = build_artifact(executable, computation.portable_hlo(executable))
        self.good_executables = {
            a.manifest.blobs[EXECUTABLE].digest for a in self.by_size.values()
        }

    def all(self) -> list[Any]:
        return list(self.by_size.values())

    def save(self, folder: Path) -> Path:
        for n, artifact in self.by_size.items():
            artifact.save(folder / f"{n:03d}")
        return folder


def check_scaled(executable: Any, n: int) -> None:
    import jax.numpy as jnp
    import numpy as np

    from tests.reliability import reliability_workers as workers

    out = np.asarray(executable(jnp.arange(n, dtype=jnp.float32)).block_until_ready())
    np.testing.assert_allclose(out, workers.expected_scaled(n))


# ---------------------------------------------------------------- spies


class DeserializeSpy:
    """Records the sha256 of every byte string handed to XLA's deserializer.

    The PJRT client is a C++ object whose attributes are read-only, but its class
    (``jaxlib._jax.Client``) accepts a replacement method: every call of
    ``client.deserialize_executable`` in this process goes through :meth:`record`.
    """

    def __init__(self) -> None:
        self.digests: list[str] = []

    def bad(self, good: set[str]) -> list[str]:
        return [d for d in self.digests if d not in good]


# ---------------------------------------------------------------- file-system snapshots


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with (size, mtime_ns): to prove nothing was written."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            try:
                st = p.lstat()
            except FileNotFoundError:
                continue
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out
