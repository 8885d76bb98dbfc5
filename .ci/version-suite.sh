#!/usr/bin/env bash
# The version suite on one JAX release (issue 50): a virtual environment holding exactly
# what .ci/constraints/jax-RELEASE.txt pins (jax and jaxlib RELEASE and the test extras at
# the versions pip picked beside that jax: reproducible, pip resolves nothing new), the
# project installed editable beside them, then the tests marked `version_suite`
# (pyproject.toml registers the marker).
#
#   bash .ci/version-suite.sh RELEASE            # build the venv, then run the suite
#   bash .ci/version-suite.sh RELEASE --build    # build only
#   bash .ci/version-suite.sh RELEASE --test     # run the suite in the venv already built
#
# The venv is .venvs/jax-RELEASE (VENV overrides it). Its Python: PYTHON, else the one the
# release needs: this machine's python3 up to 0.10.x, a Python >= 3.12 from 0.11 (JAX 0.11
# dropped Python 3.11; .ci/python.sh finds or builds one).
#
# SHARED=1 (.ci/run) installs the constraints file itself (every package it pins, libtpu
# included where it pins it, EXTRAS aside), and reuses the venv VENV when it was made by
# the same Python, swapping its packages to the release's: `pip install --no-deps` of the
# constraints file (only the packages whose version differs are replaced, from pip's
# cache), then whatever the file does not pin is uninstalled (libtpu after the release that
# had it). The venv then holds what a fresh one would, for a sixth of a fresh venv's time
# (measured at load 17: 175-215 s against 1230 s; 310 s when libtpu comes in).
#
# To add a test to the suite, mark it (`@pytest.mark.version_suite`, or
# `pytestmark = pytest.mark.version_suite` for a module): it then runs on every supported
# release. A test that needs another release's Python reads AOT_TEST_JAX_PYTHONS
# (tests/jax_upgrade/helpers.py), which .ci/run exports.
set -euo pipefail
cd "$(dirname "$0")/.."

RELEASE=${1:?usage: .ci/version-suite.sh RELEASE [--build|--test]}
STEP=${2:-all}
# The extras installed: EXTRAS=test,tpu adds libtpu (~700 MB installed, the version
# jax[tpu]==RELEASE pins; the constraints file must pin it too), so that the suite's TPU
# target tests run instead of skipping. .ci/run says which releases get it.
EXTRAS=${EXTRAS:-test}
VENV=${VENV:-.venvs/jax-$RELEASE}
CONSTRAINTS=.ci/constraints/jax-$RELEASE.txt

if [ ! -f "$CONSTRAINTS" ]; then
    echo "error: no $CONSTRAINTS: write one (pip freeze of a venv of jax==$RELEASE) before testing $RELEASE" >&2
    exit 2
fi
if [ -z "${PYTHON:-}" ]; then
    case "$RELEASE" in
        0.9.*|0.10.*) PYTHON=python3 ;;
        *) PYTHON=$(bash .ci/python.sh 3.12) ;;
    esac
fi
# The venv's interpreter as called from here: its bin/python, or, for a venv of
# .ci/python.sh's trixie root (whose bin/python links to the root's), a wrapper running it there.
venv_python() {
    VPY=$VENV/bin/python
    local in_root
    in_root=$(dirname "$PYTHON")/in-root
    if [ ! -e "$VPY" ] && [ -x "$in_root" ] && [ -f "$VENV/pyvenv.cfg" ]; then
        printf '#!/bin/sh\nexec %s %s "$@"\n' "$in_root" "$PWD/$VENV/bin/python" >"$VENV/host-python"
        chmod +x "$VENV/host-python"
        VPY=$VENV/host-python
    fi
}
venv_python

if [ "$STEP" != "--test" ]; then
    start=$(date +%s)
    base=$("$PYTHON" -c 'import sys; print(sys.base_prefix)')
    if [ "${SHARED:-0}" = 1 ] && [ -f "$VENV/pyvenv.cfg" ] \
        && [ "$("$VPY" -c 'import sys; print(sys.base_prefix)' 2>/dev/null)" = "$base" ]; then
        how=swapped
        "$VPY" -m pip install --quiet --no-deps -r "$CONSTRAINTS"
        # What the release's venv would not hold (pip freeze names, normalized).
        extra=$("$VPY" - "$CONSTRAINTS" <<'PY'
import re, subprocess, sys
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
pinned = {norm(l.split("==")[0]) for l in open(sys.argv[1]) if "==" in l and not l.startswith("#")}
frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
                        capture_output=True, text=True, check=True).stdout.splitlines()
print(" ".join(n for n in (l.split("==")[0] for l in frozen if "==" in l) if norm(n) not in pinned))
PY
)
        # shellcheck disable=SC2086
        [ -z "$extra" ] || "$VPY" -m pip uninstall --quiet --yes $extra
    else
        how=built
        rm -rf "$VENV"
        "$PYTHON" -m venv "$VENV"
        venv_python
        "$VPY" -m pip install --quiet --upgrade pip
        if [ "${SHARED:-0}" = 1 ]; then
            # Exactly the file, as a swap leaves it (libtpu where it pins it): nothing to
            # resolve, which is most of a fresh venv's time.
            "$VPY" -m pip install --quiet --no-deps -r "$CONSTRAINTS"
            "$VPY" -m pip install --quiet --no-deps -e .
        else
            "$VPY" -m pip install --quiet -c "$CONSTRAINTS" -e ".[$EXTRAS]"
        fi
    fi
    installed=$("$VPY" -c "import jax, jaxlib; print(jax.__version__, jaxlib.__version__)")
    if [ "$installed" != "$RELEASE $RELEASE" ]; then
        echo "error: $VENV holds jax/jaxlib $installed, not $RELEASE" >&2
        exit 1
    fi
    echo "version suite $RELEASE: venv $how in $(( $(date +%s) - start ))s" >&2
fi

if [ "$STEP" != "--build" ]; then
    start=$(date +%s)
    status=0
    "$VPY" -m pytest -q -p no:cacheprovider -m version_suite || status=$?
    echo "version suite $RELEASE: tests ran in $(( $(date +%s) - start ))s (exit $status)" >&2
    exit "$status"
fi
