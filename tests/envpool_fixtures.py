"""Helpers for the tests that play through a real ``EnvPool``."""

from __future__ import annotations

from agentgym.envpool.pool import EnvPool


async def expert_episode(pool: EnvPool, task_id: int, max_turns: int) -> tuple[str, list[tuple[str, str]], float]:
    """Play the env's expert; returns (first observation, [(action, observation)], final reward).
    Fails the test if the episode is not over within ``max_turns``."""
    async with pool.episode(task_id) as ep:
        first = await ep.reset()
        moves = []
        for _ in range(max_turns):
            action = await ep.expert_action()
            r = await ep.step(action)
            moves.append((action, r.observation))
            if r.done:
                return first, moves, r.reward
    raise AssertionError(f"task {task_id} not solved: {moves}")
