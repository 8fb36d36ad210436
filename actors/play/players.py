"""The actor's players: each takes tickets off the queue, plays the group, and sends its Rollout.

    players = Players(cfg, actor_id, concurrency, weights, stats)   # actors/runtime.py wires it
    players.granted(grant.tickets)                   # the receive loop, on each Grant
    for n in range(cfg.actor.max_groups):            # once the engine is up
        tg.create_task(players.play(n, serving))

``Players`` owns the ticket queue, the rollouts sent and not yet acknowledged (the receive loop
clears them on the learner's Ack, the re-send loop sends them again after a re-Hello), the env
pools, the count of groups being played, and what leaving produces (``leaving``, ``handovers``:
actors/play/handover.py). It is given the config, the actor's id, the concurrency controller (players
past its target idle until ``wake_idle``), the weight sync (a ticket waits for its version, an
episode takes the latest turn limit) and the actor's stats. What exists only once the actor is
registered and its engine is up comes in a ``Serving``, passed to each player.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from agentgym.actors.play.concurrency import Concurrency
from agentgym.actors.weight_sync import WeightSync
from agentgym.protocol import Episode, Handover, Rollout, RolloutSpec, Ticket

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agentgym.actors.engines.engine import GatedEngine
    from agentgym.actors.play.agent_runner import AgentRunner
    from agentgym.actors.transport import ControlLink
    from agentgym.config import Config
    from agentgym.envpool.pool import EnvPool

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Serving:
    """What the players play with, fixed once the actor is registered and its engine is up
    (``Actor.run`` builds it)."""

    engine: GatedEngine
    tokenizer: PreTrainedTokenizerBase
    agents: AgentRunner | None
    """Plays tickets with the user's agent program through the agent endpoint (actors/play/agent_runner.py); None: off."""
    spec: RolloutSpec
    """How to play: the learner's Welcome."""
    link: ControlLink
    """Where Rollouts go (the learner's control connection)."""


class Players:
    """The actor's players and the tickets, rollouts and env pools they share."""

    def __init__(
        self, cfg: Config, actor_id: str, concurrency: Concurrency, weights: WeightSync, stats: dict[str, int]
    ) -> None:
        self.cfg = cfg
        self.actor_id = actor_id
        self.concurrency = concurrency
        self.weights = weights
        self.stats = stats
        self.tickets: asyncio.Queue[Ticket] = asyncio.Queue()
        self.known: set[str] = set()
        """Group ids granted and not yet acknowledged: a Grant that repeats one queues it once."""
        self.unacked: dict[str, Rollout] = {}
        self.running_groups = 0
        self.pools: dict[str, EnvPool] = {}
        self.pools_lock = asyncio.Lock()
        self.capacity_changed = asyncio.Event()
        self.leaving = asyncio.Event()
        """Set when the actor leaves: episodes stop at a turn boundary (actors/play/handover.py)."""
        self.handovers: list[Handover] = []
        """What the Leave carries to the learner: the groups stopped mid-play."""

    # ------------------------------------------------------------------ from the receive loop
    def granted(self, tickets: list[Ticket]) -> None:
        """Queue the tickets of a Grant not queued before (a re-Hello's Grant repeats them)."""
        for t in tickets:
            if t.group_id not in self.known:
                self.known.add(t.group_id)
                self.tickets.put_nowait(t)

    def acked(self, group_id: str) -> bool:
        """Forget an acknowledged group; True when its rollout was waiting for the Ack."""
        sent = self.unacked.pop(group_id, None) is not None
        self.known.discard(group_id)
        return sent

    # ------------------------------------------------------------------ capacity
    def wake_idle(self) -> None:
        """The concurrency target changed: idle players re-check whether they may play."""
        self.capacity_changed.set()
        self.capacity_changed = asyncio.Event()

    def grow_pools(self, size: int) -> None:
        for pool in self.pools.values():
            pool.grow(size)

    async def pool_for(self, env: str, spec: RolloutSpec) -> EnvPool:
        from agentgym.envpool.pool import EnvPool

        # Players ask concurrently; the first one starts the pool and the others wait for it.
        async with self.pools_lock:
            pool = self.pools.get(env)
            if pool is None:
                size = self.cfg.actor.env_workers or self.concurrency.target * spec.group_size
                pool = EnvPool(
                    env, dict(spec.env_kwargs.get(env, {})), size, step_timeout_s=self.cfg.actor.step_timeout_s
                )
                self.pools[env] = pool
                t0 = time.monotonic()
                await pool.start()
                log.info("env_pool_started", env=env, workers=size, seconds=round(time.monotonic() - t0, 1))
        return pool

    # ------------------------------------------------------------------ playing
    async def play(self, n: int, serving: Serving) -> None:
        """Player ``n``: tickets -> episodes -> Rollout, while ``n`` is within the target."""
        from agentgym.actors.play.critic import shared_critic
        from agentgym.actors.play.handover import play_group

        spec = serving.spec
        critic = await shared_critic(spec.critic, serving.engine, serving.tokenizer, self.cfg.run.seed)  # None: off
        while True:
            while n >= self.concurrency.target:  # this player is beyond the current capacity: idle
                await self.capacity_changed.wait()
            ticket = await self.tickets.get()
            if self.leaving.is_set():  # the Leave returns it to the learner
                return
            await self.weights.wait_version(serving.engine, max(ticket.min_version, 0))
            agents = serving.agents
            play: Awaitable[list[Episode] | None]
            if agents is not None and agents.plays(ticket.env):  # the user's agent program plays the group
                play = self._agents_play(agents, ticket, spec)
            else:  # this actor's engine, on envs of its pool
                pool = await self.pool_for(ticket.env, spec)
                play = play_group(self, serving, ticket, pool, self.weights.turn_limit_for(ticket.env), critic)
            self.running_groups += 1
            t0 = time.monotonic()
            episodes = await play
            self.running_groups -= 1
            if episodes is None:  # stopped to leave: handed over in self.handovers
                return
            rollout = Rollout(
                group_id=ticket.group_id,
                actor_id=self.actor_id,
                env=ticket.env,
                task_id=ticket.task_id,
                episodes=list(episodes),
                elapsed_s=time.monotonic() - t0,
            )
            self.unacked[ticket.group_id] = rollout
            await serving.link.send(rollout)
            self.stats["groups_sent"] += 1
            if self.stats["groups_sent"] == 1:  # the last phase of the launch-to-first-step time
                log.info("first_rollout_sent", group_id=ticket.group_id, play_s=round(rollout.elapsed_s, 2))
            self.stats["episodes_sent"] += len(episodes)

    async def _agents_play(self, agents: AgentRunner, ticket: Ticket, spec: RolloutSpec) -> list[Episode]:
        turn_limit = self.weights.turn_limit_for(ticket.env)
        return await asyncio.gather(*(agents.play(ticket, i, spec, turn_limit) for i in range(spec.group_size)))
