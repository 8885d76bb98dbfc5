"""``aot.jax_cache`` is importable under the name the docs use, as one module."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> subprocess.CompletedProcess[str]:
    # A fresh interpreter: this process may already have imported the backend.
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_aot_jax_cache_is_the_backend_module() -> None:
    done = _run(
        "import sys, aot.jax_cache, aot.cache.jax_cache as real\n"
        "assert aot.jax_cache is real, aot.jax_cache\n"
        "assert sys.modules['aot.jax_cache'] is real\n"
        "assert callable(aot.jax_cache.install)\n"
        "print('ok')"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_from_aot_jax_cache_import_install() -> None:
    done = _run(
        "from aot.jax_cache import install, install_from_env\n"
        "import aot\n"
        "assert install is aot.jax_cache.install\n"
        "print('ok')"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_attribute_first_then_import_is_one_module() -> None:
    done = _run(
        "import aot\n"
        "first = aot.jax_cache\n"
        "import aot.jax_cache\n"
        "assert aot.jax_cache is first\n"
        "print('ok')"
    )
    assert done.returncode == 0, done.stderr


def test_install_logs_the_minimum_compile_time(tmp_path, caplog) -> None:  # noqa: ANN001
    import logging

    import jax

    import aot

    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    try:
        for seconds, said in ((1.0, True), (0.0, False)):
            jax.config.update("jax_persistent_cache_min_compile_time_secs", seconds)
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="aot.cache.jax_cache"):
                aot.jax_cache.install(str(tmp_path / "c"))
                aot.jax_cache.uninstall()
            text = caplog.text
            assert ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0" in text) is said, text
            if said:
                assert "(1 s here)" in text
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)
        aot.jax_cache.uninstall()


def test_stats_says_why_no_jit_entry_is_stored() -> None:
    from aot.cache.index.jit_records import JitStats
    from aot.cache.stats_report import StatsReport

    missed = (JitStats("f", hits=0, misses=3, saved_seconds=0.0),)
    report = StatsReport("here", (), None, jit=missed, jit_stored=0)
    assert report.jit_hint is not None
    assert "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0" in report.jit_hint and "1 s by default" in report.jit_hint
    assert StatsReport("here", (), None, jit=missed, jit_stored=2).jit_hint is None
    assert StatsReport("here", (), None, jit=(JitStats("f", 2, 0, 1.0),), jit_stored=0).jit_hint is None
