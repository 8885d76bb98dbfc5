"""``aot.jax_cache.install`` turns on compile-once-per-slice for multi-process jobs
(JAX's binary sharing, a slice-invariant key) and ``uninstall`` puts JAX back as it
was; a single-process key is JAX's own. The multi-process behaviour itself is tested
in tests/distributed/test_slice.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import aot
from aot.jaxcompat import persistent_cache as jaxpc


@pytest.fixture
def jax_settings():
    before = (jax.config.jax_share_binary_between_hosts, jax.config.jax_share_binary_between_hosts_timeout_ms)
    yield before
    aot.jax_cache.uninstall()
    jax.config.update("jax_share_binary_between_hosts", before[0])
    jax.config.update("jax_share_binary_between_hosts_timeout_ms", before[1])


def _key_of_a_program() -> str:
    from jax._src import cache_key
    from jax._src.lib import xla_client

    lowered = jax.jit(lambda x: jnp.sin(x) * 2).lower(jnp.ones((4,), jnp.float32))
    module = lowered.compiler_ir("stablehlo")
    import numpy as np

    options = xla_client.CompileOptions()
    return cache_key.get(module, np.array(jax.devices()[:1]), options, jax.devices()[0].client)


def test_install_shares_between_hosts_and_uninstall_restores(tmp_path, jax_settings, monkeypatch) -> None:
    monkeypatch.setenv("AOT_SLICE_WAIT_SECONDS", "42")
    single_before = _key_of_a_program()
    aot.jax_cache.install(str(tmp_path / "cache"))
    assert jax.config.jax_share_binary_between_hosts is True
    assert jax.config.jax_share_binary_between_hosts_timeout_ms == 42_000
    assert jaxpc.slice_invariant_keys(True) is True  # on
    assert _key_of_a_program() == single_before  # one process: JAX's own key
    aot.jax_cache.uninstall()
    assert (jax.config.jax_share_binary_between_hosts,
            jax.config.jax_share_binary_between_hosts_timeout_ms) == jax_settings
    assert jaxpc.slice_invariant_keys(False) is False  # was off again


def test_slice_share_false_leaves_jax_alone(tmp_path, jax_settings) -> None:
    aot.jax_cache.install(str(tmp_path / "cache"), slice_share=False)
    assert jax.config.jax_share_binary_between_hosts == jax_settings[0]
    assert jaxpc.slice_invariant_keys(False) is False
