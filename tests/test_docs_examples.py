"""The env written out in docs/environments.md ("Adding an environment in one file") works as printed."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from agentgym.envpool import registry
from agentgym.envpool.pool import EnvPool
from agentgym.envpool.registry import register_env

DOC = Path(__file__).resolve().parents[1] / "docs" / "environments.md"


def test_the_documented_env_plays_through_the_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = re.search(r"```python\n(# envpool/envs/nim\.py\n.*?)```", DOC.read_text(), re.S)
    assert m, "the nim example is missing from docs/environments.md"
    pkg = tmp_path / "doc_envs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nim.py").write_text(m.group(1))
    # The pool's workers import the module: it must be on their PYTHONPATH, as the doc says.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    # The registry is this process's: a copy for this test, so that doc_nim is gone with it (other
    # tests list every env the process knows).
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register_env("doc_nim", "doc_envs.nim:Nim")

    async def play() -> tuple[list[float], list[bool], str]:
        rewards, valid = [], []
        async with EnvPool("doc_nim", {"stones": 12}, size=2) as pool:
            async with pool.episode(task_id=0) as ep:
                await ep.reset()
                bad = await ep.step("take 7")  # an invalid move is a turn with feedback
                valid.append(bad.info.get("valid", True))
            for task in range(12):
                async with pool.episode(task_id=task) as ep:
                    obs = await ep.reset()
                    heap = int(re.search(r"There are (\d+) stones", obs).group(1))  # type: ignore[union-attr]  # the env's observation names the heap
                    while True:
                        r = await ep.step(await ep.expert_action())
                        if r.done:
                            break
                    # The expert wins every heap that is not a multiple of 4 (it moves first).
                    if heap % 4:
                        rewards.append(r.reward)
            return rewards, valid, ep.instructions

    rewards, valid, instructions = asyncio.run(play())
    assert valid == [False]
    assert rewards and all(r == 1.0 for r in rewards), rewards
    assert "Nim" in instructions
