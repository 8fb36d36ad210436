"""Shared by the env benches: play episodes through an ``EnvPool`` for a while, timing each call.

``concurrency`` players take the tasks ``tasks[k::concurrency]`` in turn until ``seconds`` have
passed; each episode is a reset and up to ``max_steps`` steps, the action chosen by ``choose``
(awaited outside the step's timing, so an expert's planning is not counted as env time).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Choose = Callable[[Any, int, int], Awaitable[str]]
"""(episode, task id, step index) -> action."""


@dataclass
class PoolRun:
    steps: int = 0
    step_s: list[float] = field(default_factory=list)
    """Seconds of each ``step`` call as the caller sees it."""
    resets: list[float] = field(default_factory=list)
    """Seconds of each ``reset`` call."""
    pids: set[int] = field(default_factory=set)
    """Worker processes that played (read their memory before closing the pool)."""
    solved: int = 0
    """Episodes that ended with reward 1."""
    elapsed: float = 0.0


async def expert(ep: Any, task: int, i: int) -> str:
    return await ep.expert_action()


async def play_for(
    pool: Any, tasks: Sequence[int], concurrency: int, seconds: float, max_steps: int, choose: Choose = expert
) -> PoolRun:
    run = PoolRun()
    t0 = time.perf_counter()

    async def player(k: int) -> None:
        for task in tasks[k::concurrency]:
            if time.perf_counter() - t0 > seconds:
                return
            async with pool.episode(task) as ep:
                t = time.perf_counter()
                await ep.reset()
                run.resets.append(time.perf_counter() - t)
                run.pids.add(ep.worker_pid)
                for i in range(max_steps):
                    action = await choose(ep, task, i)
                    t = time.perf_counter()
                    r = await ep.step(action)
                    run.step_s.append(time.perf_counter() - t)
                    run.steps += 1
                    if r.done:
                        run.solved += r.reward == 1.0
                        break

    await asyncio.gather(*(player(k) for k in range(concurrency)))
    run.elapsed = time.perf_counter() - t0
    return run
