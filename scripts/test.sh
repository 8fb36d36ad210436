#!/usr/bin/env bash
# Runs ruff (pyflakes rules: undefined names, unused imports) and the test suite, installing first
# if needed. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/ruff check --quiet . || { echo "ruff: fix the findings above (pyproject.toml [tool.ruff])" >&2; exit 1; }
set +e
.venv/bin/python -m pytest "$@"
code=$?
set -e
if [ "$code" = 5 ]; then echo "pytest collected no tests"; exit 1; fi
exit "$code"
