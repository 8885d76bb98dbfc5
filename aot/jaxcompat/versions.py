"""The JAX releases jax-aot supports, and the check ``import aot`` makes.

The serving path rebuilds JAX's executable objects from data through private API
(this package), so a release nobody tested fails deep inside a load, or worse. The
range is :data:`SUPPORTED_JAX`: exactly what CI tests (.ci/run: the full suite on the
newest release, the version suite on the others), the same pins as pyproject.toml
(tests/aot/jaxcompat/test_versions.py keeps them equal). Widen it only for a release a
test has run on.

The check reads the version file of the ``jax`` and ``jaxlib`` that Python would
import, without importing them (``import aot`` and the commands that need no device
stay free of JAX); :mod:`aot.jax_support` raises its refusal as
:class:`aot.UnsupportedJaxError`. Installing with ``--no-deps``, or upgrading JAX after
jax-aot, bypasses pip's pins, never this check.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

#: The supported releases of jax and of jaxlib: ``(lowest, first unsupported)``, as
#: pyproject.toml's ``jax>=LOWEST,<FIRST_UNSUPPORTED`` (and jaxlib's, and the tpu extra's).
SUPPORTED_JAX: tuple[str, str] = ("0.9.0", "0.12.2")

#: The releases CI runs (.ci/run reads this list): the last one the full suite, every
#: other one the version suite (.ci/version-suite.sh).
TESTED_RELEASES: tuple[str, ...] = (
    "0.9.0", "0.9.0.1", "0.9.1", "0.9.2", "0.10.0", "0.10.1", "0.10.2",
    "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.12.0.1", "0.12.1",
)

_VERSION_LINE = re.compile(r'^_version(?:\s*:\s*str)?\s*=\s*["\']([^"\']+)["\']', re.MULTILINE)


def release_tuple(version: str) -> tuple[int, ...]:
    """``"0.10.2"`` -> ``(0, 10, 2)``; the leading numeric parts only (``0.10.3.dev1``
    -> ``(0, 10, 3)``, a pre-release of 0.10.3 is not 0.10.2)."""
    parts = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.group() != part:
            break
    return tuple(parts)


def supported(version: str) -> bool:
    """Whether a jax (or jaxlib) version is in :data:`SUPPORTED_JAX`."""
    lowest, first_unsupported = SUPPORTED_JAX
    return release_tuple(lowest) <= release_tuple(version) < release_tuple(first_unsupported)


def supported_range_text() -> str:
    """``0.9.0 through 0.10.2``: the range as a user reads it."""
    return f"{SUPPORTED_JAX[0]} through {TESTED_RELEASES[-1]}"


def installed_version(package: str) -> str | None:
    """The version of ``package`` (``jax``, ``jaxlib``) that ``import package`` would
    load, from its ``version.py`` without importing it; else from the installed
    distribution's metadata; None when it is not installed."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or ():
        try:
            found = _VERSION_LINE.search((Path(location) / "version.py").read_text(encoding="utf-8"))
        except OSError:
            continue
        if found:
            return found.group(1)
    # Only here: importlib.metadata costs milliseconds of imports that `import aot` spares.
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


def unsupported_jax() -> tuple[str, tuple[tuple[str, str | None], ...]] | None:
    """None when the jax and jaxlib Python would import are releases in
    :data:`SUPPORTED_JAX`; else the refusal (what is installed, the range, what to do)
    and the ``(package, version)`` pairs found."""
    installed = (("jax", installed_version("jax")), ("jaxlib", installed_version("jaxlib")))
    if all(version is not None and supported(version) for _, version in installed):
        return None
    lowest, first_unsupported = SUPPORTED_JAX
    found = ", ".join(f"{name} {version or 'not installed'}" for name, version in installed)
    message = (
        f"jax-aot supports JAX {supported_range_text()} (jax and jaxlib of one release); "
        f"this environment has {found}. Install a supported release, e.g. "
        f"pip install 'jax>={lowest},<{first_unsupported}' 'jaxlib>={lowest},<{first_unsupported}', "
        f"or a jax-aot that supports yours."
    )
    return message, installed
