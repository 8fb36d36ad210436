"""What `agentgym` tells about itself, run as a user runs it: `--version`, `envs` (what each env
is, what it needs from the system, which are for tests only) and `config` (unset keys shown)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

from agentgym.envpool.registry import ENV_INFO, known_envs
from agentgym.protocol import PROTOCOL_VERSION

REPO = Path(__file__).resolve().parents[1]


def _agentgym(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentgym.cli", *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )


def test_version() -> None:
    proc = _agentgym("--version")
    assert proc.returncode == 0 and proc.stdout == f"agentgym {version('agentgym')} (protocol {PROTOCOL_VERSION})\n", (
        proc
    )


def test_envs_describes_each_env_its_needs_and_the_test_only_ones() -> None:
    proc = _agentgym("envs")
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()}
    assert set(lines) == set(known_envs()) and set(ENV_INFO) <= set(lines)  # every built-in has its description
    assert "[test-only]" in lines["chaos"] and "[test-only]" not in lines["guess_number"]
    assert (
        "needs Java 17" in lines["sciworld"] and "needs Chromium" in lines["webshop"] and "wamerican" in lines["wordle"]
    )
    assert "needs" not in lines["maze"] and "higher/lower" in lines["guess_number"]
    # the adapters for other ecosystems' packages, each naming the pip extra it needs
    for env, extra in [
        ("reasoning_gym", "agentgym[reasoning-gym]"),
        ("textarena", "agentgym[textarena]"),
        ("skyrl_gym", "agentgym[skyrl-gym]"),
        ("openenv", "agentgym[openenv]"),
        ("verifiers", "[verifiers]"),
    ]:
        assert extra in lines[env], lines[env]


def test_config_shows_unset_keys_and_stays_valid_toml() -> None:
    proc = _agentgym("config", "--config", "configs/quickstart.toml")
    assert proc.returncode == 0, proc.stderr
    assert "# system_prompt = (unset)" in proc.stdout and "# max_model_len = (unset)" in proc.stdout
    cfg = tomllib.loads(proc.stdout)  # the comments change nothing that parses
    assert cfg["run"]["max_steps"] == 150 and "system_prompt" not in cfg["rollout"]
