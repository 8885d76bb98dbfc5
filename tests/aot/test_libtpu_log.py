"""libtpu's start-up lines (aot.libtpu_log): what docs/accelerators.md tells a CPU-only
runner to do about them in its plain JAX processes, which jax-aot does not run."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.aot.test_targets import needs_libtpu

PLAIN_JAX = "import jax, jax.numpy as jnp; print(float(jnp.ones(3).sum()))"


def _plain_jax(**env: str) -> subprocess.CompletedProcess[str]:
    """A plain JAX process as CI runs it: stdin not a terminal, no jax-aot imported."""
    base = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    return subprocess.run([sys.executable, "-c", PLAIN_JAX], env={**base, **env}, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)


@needs_libtpu
def test_a_cpu_runner_that_sets_jax_platforms_cpu_gets_no_libtpu_lines() -> None:
    """With the tpu extra installed, a plain JAX process on a CPU host loads libtpu while
    it looks for a backend and prints its 5 start-up lines (issue 52); with
    JAX_PLATFORMS=cpu, as the docs say a CPU runner sets, it prints nothing."""
    quiet = _plain_jax(JAX_PLATFORMS="cpu")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "3.0\n", "")
