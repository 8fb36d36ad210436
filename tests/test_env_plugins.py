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
