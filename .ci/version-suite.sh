#!/usr/bin/env bash
# The version suite on one JAX release (issue 50): a virtual environment of its own holding
# jax and jaxlib RELEASE and the test extras at the versions .ci/constraints/jax-RELEASE.txt
# pins (reproducible: pip resolves nothing new), the project installed editable beside
# them, then the tests marked `version_suite` (pyproject.toml registers the marker).
#
#   bash .ci/version-suite.sh RELEASE            # build the venv, then run the suite
#   bash .ci/version-suite.sh RELEASE --build    # build only (.ci/run builds every release
#                                                # first: cross-release tests need them all)
#   bash .ci/version-suite.sh RELEASE --test     # run the suite in the venv already built
#
# The venv is .venvs/jax-RELEASE (VENV overrides it). To add a test to the suite, mark it
# (`@pytest.mark.version_suite`, or `pytestmark = pytest.mark.version_suite` for a module):
# it then runs on every supported release. A test that needs another release's Python
# reads AOT_TEST_JAX_PYTHONS (tests/jax_upgrade/helpers.py), which .ci/run exports.
set -euo pipefail
cd "$(dirname "$0")/.."

RELEASE=${1:?usage: .ci/version-suite.sh RELEASE [--build|--test]}
STEP=${2:-all}
PYTHON=${PYTHON:-python3}
# The extras installed: EXTRAS=test,tpu adds libtpu (~700 MB installed, the version
# jax[tpu]==RELEASE pins; the constraints file must pin it too), so that the suite's TPU
# target tests run instead of skipping. .ci/run asks for it on the oldest release only.
EXTRAS=${EXTRAS:-test}
VENV=${VENV:-.venvs/jax-$RELEASE}
CONSTRAINTS=.ci/constraints/jax-$RELEASE.txt

if [ ! -f "$CONSTRAINTS" ]; then
    echo "error: no $CONSTRAINTS: write one (pip freeze of a venv of jax==$RELEASE) before testing $RELEASE" >&2
    exit 2
fi

if [ "$STEP" != "--test" ]; then
    start=$(date +%s)
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -c "$CONSTRAINTS" -e ".[$EXTRAS]"
    installed=$("$VENV/bin/python" -c "import jax, jaxlib; print(jax.__version__, jaxlib.__version__)")
    if [ "$installed" != "$RELEASE $RELEASE" ]; then
        echo "error: $VENV holds jax/jaxlib $installed, not $RELEASE" >&2
        exit 1
    fi
    echo "version suite $RELEASE: venv built in $(( $(date +%s) - start ))s" >&2
fi

if [ "$STEP" != "--build" ]; then
    start=$(date +%s)
    status=0
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m version_suite || status=$?
    echo "version suite $RELEASE: tests ran in $(( $(date +%s) - start ))s (exit $status)" >&2
    exit "$status"
fi
