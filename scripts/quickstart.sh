#!/usr/bin/env bash
# Installs everything, then trains a tiny agent: one learner and two actors (separate processes
# over ZeroMQ on loopback) on the built-in guess_number environment. Extra arguments go to
# `agentgym train` (e.g. --max-steps 20, -o run.mode=sync).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/agentgym train --config configs/quickstart.toml "$@"
