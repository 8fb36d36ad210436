"""The actor's players: each takes tickets off the queue, plays the group, and sends its Rollout.

    class Actor(WeightSync, Playing): ...   # actors/runtime.py; Actor.run starts max_groups players

A mix-in of ``actors/runtime.Actor``: it uses the actor's Welcome (rollout spec), config,
concurrency controller, ticket queue, engine, tokenizer, env pools, agent runner, control link,
stats and the ``unacked`` rollouts the receive loop clears on the learner's Ack. Players past the
controller's target idle until it grows (``capacity_changed``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from agentgym.protocol import Rollout, Ticket

log = structlog.get_logger(__name__)


class Playing:
    cfg: Any
    welcome: Any
    concurrency: Any
    engine: Any
    tokenizer: Any
    agents: Any
    link: Any
    pools: dict[str, Any]
    pools_lock: asyncio.Lock
    tickets: asyncio.Queue[Ticket]
    unacked: dict[str, Rollout]
    stats: dict[str, int]
    turn_limit: int
    turn_limits: dict[str, int]
    running_groups: int
    leaving: asyncio.Event
    capacity_changed: asyncio.Event
    actor_id: str

    async def pool_for(self, env: str):
        from agentgym.envpool.pool import EnvPool

        # Players ask concurrently; the first one starts the pool and the others wait for it.
        async with self.pools_lock:
            pool = self.pools.get(env)
            if pool is None:
                spec = self.welcome.rollout
                size = self.cfg.actor.env_workers or self.concurrency.target * spec.group_size
                pool = EnvPool(env, dict(spec.env_kwargs.get(env, {})), size, step_timeout_s=self.cfg.actor.step_timeout_s)
                self.pools[env] = pool
                t0 = time.monotonic()
                await pool.start()
                log.info("env_pool_started", env=env, workers=size, seconds=round(time.monotonic() - t0, 1))
        return pool

    async def player(self, n: int) -> None:
        from agentgym.actors.critic import shared_critic
        from agentgym.actors.handover import play_group

        spec = self.welcome.rollout
        critic = await shared_critic(spec.critic, self.engine, self.tokenizer, self.cfg.run.seed)  # None: off
        while True:
            while n >= self.concurrency.target:  # this player is beyond the current capacity: idle
                await self.capacity_changed.wait()
            ticket = await self.tickets.get()
            if self.leaving.is_set():  # the Leave returns it to the learner
                return
            await self.wait_version(max(ticket.min_version, 0))  # actors/weight_sync.py
            agents = self.agents if self.agents is not None and self.agents.plays(ticket.env) else None
            pool = None if agents else await self.pool_for(ticket.env)
            self.running_groups += 1
            t0 = time.monotonic()
            turn_limit = self.turn_limits.get(ticket.env, self.turn_limit)
            episodes = await (asyncio.gather(*(agents.play(ticket, i, spec, turn_limit) for i in range(spec.group_size)))
                              if agents else play_group(self, ticket, pool, spec, turn_limit, critic))  # fmt: skip
            self.running_groups -= 1
            if episodes is None:  # stopped to leave: handed over in self.handovers
                return
            rollout = Rollout(
                group_id=ticket.group_id, actor_id=self.actor_id, env=ticket.env, task_id=ticket.task_id,
                episodes=list(episodes), elapsed_s=time.monotonic() - t0,
            )  # fmt: skip
            self.unacked[ticket.group_id] = rollout
            await self.link.send(rollout)
            self.stats["groups_sent"] += 1
            if self.stats["groups_sent"] == 1:  # the last phase of the launch-to-first-step time
                log.info("first_rollout_sent", group_id=ticket.group_id, play_s=round(rollout.elapsed_s, 2))
            self.stats["episodes_sent"] += len(episodes)
