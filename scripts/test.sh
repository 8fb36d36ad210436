#!/usr/bin/env bash
# Runs the test suite (installing first if needed). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
set +e
.venv/bin/python -m pytest "$@"
code=$?
set -e
if [ "$code" = 5 ]; then echo "pytest collected no tests"; exit 1; fi
exit "$code"
