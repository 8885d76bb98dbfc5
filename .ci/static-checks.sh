#!/usr/bin/env bash
# Static checks over everything the distribution ships, and the tests and benchmarks:
#   ruff: pyflakes' findings and syntax errors (F, E9);
#   mypy: the typed code of aot/, cache/ and cli/ as the one package `aot` that pip installs.
# cache/ and cli/ are installed as aot.cache and aot.cli (pyproject.toml's package-dir), a
# mapping mypy cannot follow from the checkout; so it checks a tree of links laid out as
# installed (aot/ with cache/ and cli/ inside) and reports paths of the checkout.
# Usage: bash .ci/static-checks.sh [PYTHON]   (PYTHON: the venv's, with ruff and mypy)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:-${PYTHON:-.venv/bin/python}}
# Absolute (mypy runs from another folder below), without resolving the venv's link.
case "$PYTHON" in */*) PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" ;; esac

"$PYTHON" -m ruff check --select F,E9 aot cache cli tests benchmarks fixtures

tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/aot"
for f in aot/*; do ln -s "$PWD/$f" "$tree/aot/"; done
ln -s "$PWD/cache" "$tree/aot/cache"
ln -s "$PWD/cli" "$tree/aot/cli"
checkout=$PWD
# mypy's cache stays in the checkout (git-ignored) so that a second run is quick.
(cd "$tree" && "$PYTHON" -m mypy --config-file "$checkout/pyproject.toml" \
    --cache-dir "$checkout/.mypy_cache" -p aot) \
    | sed -e 's#^aot/cache/#cache/#' -e 's#^aot/cli/#cli/#'
exit "${PIPESTATUS[0]}"
