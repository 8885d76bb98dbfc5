"""Pins the JAX configuration for every test: 8 virtual CPU devices."""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (must come after XLA_FLAGS)
import pytest  # noqa: E402

assert jax.device_count() == 8, "conftest must run before JAX initialises its backend"


@pytest.fixture(autouse=True)
def _no_x64_leak():
    """Tests that flip x64 must not leak the mode into other tests."""
    before = jax.config.jax_enable_x64
    yield
    jax.config.update("jax_enable_x64", before)
