"""Envs without an edit to the registry: ``module:Class`` in a config and a package's entry
point in the ``agentgym.envs`` group (a real dist-info on sys.path, found by importlib.metadata)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from agentgym.envpool.pool import EnvPool
from agentgym.envpool.registry import UnknownEnvError, env_target, known_envs, load_target

TARGET = "agentgym.envpool.envs.guess_number:GuessNumber"


def test_module_class_form_plays_through_a_pool() -> None:
    assert env_target(TARGET) == TARGET

    async def play() -> str:
        async with EnvPool(TARGET, {}, 1) as pool:
            async with pool.episode(pool.task_id("test", 0)) as ep:
                return await ep.reset()

    assert asyncio.run(play())
    with pytest.raises(UnknownEnvError, match="'nope'"):
        env_target("nope")
    with pytest.raises(ImportError, match="no_such_module"):
        load_target("no_such_module:Env")


def test_entry_point_group_registers_an_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dist = tmp_path / "coin_envs-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: coin-envs\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[agentgym.envs]\ncoin = {TARGET}\nbroken = not a target\n")
    assert "coin" not in known_envs()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "coin" in known_envs()
    assert env_target("coin") == TARGET
    assert load_target(env_target("coin")).__name__ == "GuessNumber"
    with pytest.raises(UnknownEnvError, match="'broken'"):
        env_target("broken")
    assert sys.path[0] == str(tmp_path)


def test_one_check_names_the_config_key_the_env_and_the_bad_option() -> None:
    from agentgym.envpool.registry import EnvOptionsError, check_env

    # The default check_options: option names against the __init__ chain, nothing constructed.
    with pytest.raises(EnvOptionsError) as err:
        check_env("maze", {"sise": 5})
    assert str(err.value).startswith("env.kwargs: env maze: unknown option(s) ['sise']; its options are [")
    assert "'size'" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(
        EnvOptionsError, match=r"^env\.mix\[1\]\.kwargs: env guess_number: unknown option\(s\) \['hihg'\]"
    ):
        check_env("guess_number", {"low": 1, "hihg": 8}, "env.mix[1]")
    with pytest.raises(UnknownEnvError, match=r"'mazee' \(from env\.mix\[0\]\.name\); known environments: .*maze"):
        check_env("mazee", {}, "env.mix[0]")
    assert check_env("guess_number", {"low": 1, "high": 8}).name == "guess_number"


def test_every_shipped_config_passes_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """No false refusal: each env of each config in configs/ (paths in them are relative to the
    repository), through the check that ``agentgym train`` runs."""
    from agentgym.config import load_config
    from agentgym.envpool.registry import check_env

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)
    checked = set()
    for path in sorted((repo / "configs").rglob("*.toml")):
        cfg = load_config(path, [])
        for spec in cfg.env.specs:
            check_env(spec.name, spec.kwargs)
            checked.add(spec.name)
    assert {
        "guess_number",
        "maze",
        "textcraft",
        "wordle",
        "reasoning_gym",
        "textarena",
        "skyrl_gym",
        "verifiers",
        "openenv",
    } <= checked
