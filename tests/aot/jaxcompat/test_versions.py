"""The supported JAX range: one constant, the same as pyproject.toml's pins, and a
release outside it refused in one line at ``import aot`` and by every command, also
when pip's pins were bypassed (``--no-deps``, a JAX upgraded afterwards).

The refused releases are fake ``jax``/``jaxlib`` packages (a ``version.py``, as JAX's)
put first on ``PYTHONPATH``: the check reads what Python would import, and must not
import it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from pathlib import Path

import pytest

from aot.jaxcompat import versions
from aot.jax_support import check_installed_jax

# Runs on every supported JAX release (.ci/version-suite.sh).
pytestmark = pytest.mark.version_suite

REPO = Path(__file__).resolve().parents[3]


def _fake_jax(root: Path, jax_version: str | None, jaxlib_version: str | None) -> Path:
    for name, version in (("jax", jax_version), ("jaxlib", jaxlib_version)):
        if version is None:
            # Shadows the real one with a package Python cannot import from: "not installed".
            continue
        package = root / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("raise SystemExit('the version check imported JAX')\n")
        (package / "version.py").write_text(f'_version: str = "{version}"\n')
    return root


def _run(root: Path, *argv: str, hide_jaxlib: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(REPO)])
    if hide_jaxlib:
        # A jax without jaxlib: a site-packages without it is out of reach, so the
        # process runs with -S and only the fake root and the repository on its path.
        argv = ("-S", *argv)
    return subprocess.run([sys.executable, *argv], cwd=root, env=env, capture_output=True, text=True, timeout=60)


def _expected(jax_version: str, jaxlib_version: str) -> str:
    return (
        "jax-aot supports JAX 0.9.0 through 0.12.1 (jax and jaxlib of one release); "
        f"this environment has jax {jax_version}, jaxlib {jaxlib_version}. Install a supported release, "
        "e.g. pip install 'jax>=0.9.0,<0.12.2' 'jaxlib>=0.9.0,<0.12.2', or a jax-aot that supports yours."
    )


def test_pyprojects_pins_are_the_supported_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lowest, first_unsupported = versions.SUPPORTED_JAX
    pins = {f"jax>={lowest},<{first_unsupported}", f"jaxlib>={lowest},<{first_unsupported}"}
    assert pins <= set(project["dependencies"])
    assert project["optional-dependencies"]["tpu"] == [f"jax[tpu]>={lowest},<{first_unsupported}"]
    # Every release CI tests is in the range, the newest last (it runs the full suite).
    assert all(versions.supported(r) for r in versions.TESTED_RELEASES)
    assert list(versions.TESTED_RELEASES) == sorted(versions.TESTED_RELEASES, key=versions.release_tuple)
    assert not versions.supported(first_unsupported)


def test_the_installed_jax_is_supported_and_read_without_importing_it() -> None:
    import jax
    import jaxlib

    assert versions.installed_version("jax") == jax.__version__.split("+")[0].split(".dev")[0]
    assert versions.installed_version("jaxlib") == jaxlib.__version__.split("+")[0].split(".dev")[0]
    assert versions.unsupported_jax() is None
    check_installed_jax()


@pytest.mark.parametrize(
    ("version", "ok"),
    [("0.8.3", False), ("0.9.0", True), ("0.9.0.1", True), ("0.10.2", True), ("0.11.0", True),
     ("0.12.0.1", True), ("0.12.1", True), ("0.12.2", False), ("0.12.2.dev20261201", False),
     ("0.13.0", False), ("1.0", False)],
)
def test_the_range_is_inclusive_below_and_exclusive_above(version: str, ok: bool) -> None:
    assert versions.supported(version) is ok


@pytest.mark.parametrize(("jax_version", "jaxlib_version"), [("0.8.0", "0.8.0"), ("0.13.0", "0.13.0"), ("0.12.1", "0.12.2")])
def test_import_aot_refuses_an_unsupported_jax_in_one_line(tmp_path: Path, jax_version: str, jaxlib_version: str) -> None:
    root = _fake_jax(tmp_path, jax_version, jaxlib_version)
    done = _run(root, "-c", "import aot")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == f"aot.UnsupportedJaxError: {_expected(jax_version, jaxlib_version)}\n"


def test_the_error_can_be_caught_and_names_what_is_installed(tmp_path: Path) -> None:
    root = _fake_jax(tmp_path, "0.8.0", "0.8.0")
    code = (
        "import sys\n"
        "try:\n"
        "    import aot\n"
        "except Exception as exc:\n"
        "    from aot.errors import AotError, UnsupportedJaxError\n"
        "    print(type(exc).__name__, isinstance(exc, AotError), exc.installed, 'jax' in sys.modules)\n"
    )
    done = _run(root, "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "UnsupportedJaxError True (('jax', '0.8.0'), ('jaxlib', '0.8.0')) False\n"


@pytest.mark.parametrize("argv", [("-m", "aot", "ls"), ("-m", "aot", "warmup", "fixtures/warmup.toml"),
                                  ("-m", "aot", "--help"), ("-m", "aot", "doctor")])
def test_every_command_refuses_it_in_one_line(tmp_path: Path, argv: tuple[str, ...]) -> None:
    root = _fake_jax(tmp_path, "0.13.0", "0.13.0")
    done = _run(root, *argv)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"Error: {_expected('0.13.0', '0.13.0')}\n"


@pytest.mark.parametrize("argv", [("-m", "aot", "--version"), ("-m", "aot", "--cache", "x", "--version")])
def test_aot_version_answers_under_any_jax(tmp_path: Path, argv: tuple[str, ...]) -> None:
    """`aot --version` is what one asks first under a JAX it refuses: it answers, without
    importing JAX (the fake one exits if imported)."""
    from importlib import metadata

    root = _fake_jax(tmp_path, "0.8.0", "0.8.0")
    done = _run(root, *argv)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"aot, version {metadata.version('jax-aot')}\n", "")


def test_the_console_script_refuses_it_in_one_line(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("aot")
    if not script.exists():
        pytest.skip("no console script `aot` beside this Python (not installed with pip)")
    root = _fake_jax(tmp_path, "0.8.0", "0.8.0")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(REPO)])
    done = subprocess.run([str(script), "ls"], cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"Error: {_expected('0.8.0', '0.8.0')}\n"


def test_a_jax_without_jaxlib_is_refused(tmp_path: Path) -> None:
    root = _fake_jax(tmp_path, "0.10.2", None)
    done = _run(root, "-c", "import aot", hide_jaxlib=True)
    assert done.returncode == 1
    assert re.fullmatch(r"aot\.UnsupportedJaxError: .*this environment has jax 0\.10\.2, jaxlib not installed\..*\n", done.stderr)


def test_other_errors_keep_their_traceback(tmp_path: Path) -> None:
    root = _fake_jax(tmp_path, "0.8.0", "0.8.0")
    done = _run(root, "-c", "try:\n    import aot\nexcept Exception:\n    pass\nraise KeyError('other')")
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback") and done.stderr.endswith("KeyError: 'other'\n")


def test_every_release_of_the_version_suite_has_its_constraints() -> None:
    """.ci/version-suite.sh installs each release from its frozen constraints file."""
    for release in versions.TESTED_RELEASES[:-1]:
        path = REPO / ".ci" / "constraints" / f"jax-{release}.txt"
        assert path.exists(), f"no {path.name}: .ci/version-suite.sh {release} cannot build its venv"
        pins = set(path.read_text().split())
        assert {f"jax=={release}", f"jaxlib=={release}"} <= pins, path.name
