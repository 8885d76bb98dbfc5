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
