#!/usr/bin/env bash
# Runs ruff (the lint rules and the formatter's check, pyproject.toml [tool.ruff]), mypy over the
# whole agentgym package (scripts/typecheck.py), the import rules (import-linter:
# scripts/lint_imports.py), the 100-line limit on a function (scripts/long_functions.py) and the test
# suite, installing first if needed. Extra arguments go to pytest.
# The suite runs on AGENTGYM_TEST_WORKERS pytest-xdist workers (default 2; 0 runs it in this
# process): each module stays on one worker (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/ruff check --quiet . || { echo "ruff: fix the findings above (pyproject.toml [tool.ruff])" >&2; exit 1; }
.venv/bin/ruff format --check --quiet . || { echo "ruff format: run .venv/bin/ruff format . (pyproject.toml [tool.ruff.format])" >&2; exit 1; }
# mypy runs beside the import rules and the tests (about a minute of one core on a fresh clone;
# seconds with its cache in .mypy_cache), and its verdict is read once the tests end.
types_out=$(mktemp)
.venv/bin/python scripts/typecheck.py >"$types_out" 2>&1 &
types_pid=$!
imports=$(.venv/bin/python scripts/lint_imports.py 2>&1) || { echo "$imports"; echo "import-linter: an import breaks a rule of docs/architecture.md (pyproject.toml [tool.importlinter])" >&2; exit 1; }
long=$(.venv/bin/python scripts/long_functions.py 2>&1) || { echo "$long"; echo "long functions: split each function above into parts of at most 100 lines (scripts/long_functions.py)" >&2; exit 1; }
set +e
workers=${AGENTGYM_TEST_WORKERS:-2}
if [ "$workers" -gt 0 ]; then
  .venv/bin/python -m pytest -n "$workers" "$@"
else
  .venv/bin/python -m pytest "$@"
fi
code=$?
wait "$types_pid"
types_code=$?
set -e
if [ "$types_code" != 0 ]; then cat "$types_out"; echo "mypy: fix the errors above (pyproject.toml [tool.mypy])" >&2; exit 1; fi
rm -f "$types_out"
if [ "$code" = 5 ]; then echo "pytest collected no tests"; exit 1; fi
exit "$code"
