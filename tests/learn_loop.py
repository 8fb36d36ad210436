"""The synchronous learning loop of the learning tests, in this process and without sockets.

The transformers reference engine (actors/engines/hf_engine.py) plays groups of episodes with the actor's
rollout code (actors/play/rollout.py) on a real EnvPool; the learner's Trainer takes one step on each
batch of groups (``Trainer.train_step``: the algorithm's advantages, the shared loss, AdamW); the
new weights go into the engine (``update_weights``) before the next batch is played. Held-out
success is measured on the same test tasks with the same sampling seeds before the first step and
after the last one. Used by tests/test_algorithms_learn.py (guess_number, one token a turn) and
tests/test_multitoken_learn.py (maze, several tokens a turn); tests/test_agent_learn.py plays
through the agent endpoint instead (``learn`` with its own ``play``).
"""

from __future__ import annotations

import asyncio
import random
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import replace

from agentgym.actors.engines.engine import Generation, SamplingSpec
from agentgym.actors.engines.hf_engine import HfEngine
from agentgym.actors.play.rollout import play_episode
from agentgym.config import Config
from agentgym.envpool.pool import EnvPool
from agentgym.learner.control.actor_control import rollout_spec
from agentgym.learner.training.trainer import Trainer
from agentgym.protocol import Episode, Rollout, Ticket


class RequestSeededEngine(HfEngine):
    """The reference engine with one sampling seed per request, derived from the request id
    (group/episode/turn): concurrent episodes reach the engine in an order that depends on the
    env workers' timing, and this way each one still samples the same tokens in every run."""

    async def generate(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        seed = zlib.crc32(f"{self.seed}:{request_id}".encode())
        return await super().generate(request_id, prompt_ids, replace(spec, seed=seed))


Play = Callable[[Ticket, int, int], Awaitable[Episode]]
"""How one episode is played: (ticket, episode index, turn limit) -> the finished episode."""


async def play_groups(play: Play, tickets: list[Ticket], episodes: int, turn_limit: int) -> list[Rollout]:
    """``episodes`` episodes of each ticket, all at once, as actors play them."""

    async def group(t: Ticket) -> Rollout:
        eps = await asyncio.gather(*(play(t, i, turn_limit) for i in range(episodes)))
        return Rollout(group_id=t.group_id, actor_id="test", env=t.env, task_id=t.task_id, episodes=list(eps))

    return list(await asyncio.gather(*(group(t) for t in tickets)))


async def learn(
    cfg: Config, trainer: Trainer, engine: HfEngine, play: Play, held_out_tasks: int, held_out_episodes: int
) -> tuple[float, float, list[dict[str, float]]]:
    """Held-out success of the initial and of the trained weights (the first ``held_out_tasks``
    test tasks, ``held_out_episodes`` each), and each of the ``run.max_steps`` steps' metrics;
    every episode is played by ``play`` and the new weights go into ``engine`` after each step."""
    env = cfg.env.specs[0]
    group_size = rollout_spec(cfg).group_size
    held_out = [Ticket(group_id=f"eval:{i}", env=env.name, task_id=i, split="test") for i in range(held_out_tasks)]

    async def success(turn_limit: int) -> float:
        eps = [e for g in await play_groups(play, held_out, held_out_episodes, turn_limit) for e in g.episodes]
        return sum(e.success for e in eps) / len(eps)

    before = await success(cfg.schedule.turn_limit(0))
    draw = random.Random(cfg.run.seed)  # training tasks from the train range, seeded by run.seed
    metrics = []
    for step in range(cfg.run.max_steps):
        tickets = [
            Ticket(group_id=f"train:{step}:{g}", env=env.name, task_id=env.task_start + draw.randrange(env.task_count))
            for g in range(cfg.learner.batch_groups)
        ]
        metrics.append(trainer.train_step(await play_groups(play, tickets, group_size, cfg.schedule.turn_limit(step))))
        await engine.update_weights({k: v.detach() for k, v in trainer.model.state_dict().items()}, trainer.version)
    after = await success(cfg.schedule.turn_limit(trainer.step))
    return before, after, metrics


async def train_and_evaluate(
    cfg: Config, held_out_tasks: int, held_out_episodes: int
) -> tuple[float, float, list[dict[str, float]]]:
    """``learn`` with the actor's rollout code on a real EnvPool and the request-seeded engine."""
    from transformers import AutoTokenizer

    env = cfg.env.specs[0]
    spec = rollout_spec(cfg)  # how actors play, as the learner's Welcome tells them
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    trainer = Trainer.load(cfg)
    engine = RequestSeededEngine(cfg.model.path, seed=cfg.run.seed)
    pool = EnvPool(env.name, dict(env.kwargs), 8)

    async def play(t: Ticket, i: int, turn_limit: int) -> Episode:
        return await play_episode(engine, tokenizer, pool, t, i, spec, turn_limit)

    await engine.start()
    await pool.start()
    try:
        return await learn(cfg, trainer, engine, play, held_out_tasks, held_out_episodes)
    finally:
        await pool.close()
        await engine.close()
        trainer.close()
