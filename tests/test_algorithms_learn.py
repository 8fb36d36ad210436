"""Each learner algorithm raises held-out success on the built-in environment: one real, short
training run per algorithm, in this process.

For every selectable ``learner.algorithm`` the loop is the synchronous one, without sockets: the
transformers reference engine (actors/hf_engine.py) plays groups of guess_number episodes with
the actor's rollout code (actors/rollout.py) on a real EnvPool; the learner's Trainer takes one
step on each batch of groups (``Trainer.train_step``: the algorithm's advantages, the shared
loss, AdamW); the new weights go into the engine (``update_weights``) before the next batch is
played. Held-out success is measured on the same test tasks with the same sampling seeds before
the first step and after the last one, and must rise by a clear margin. ``bench/algorithms.py``
makes the same comparison at the quickstart's size through real actor processes and vLLM.

Settings: the quickstart's config, made smaller where it costs time. Numbers 1 to 4, a limit of
2 turns of at most 2 tokens, 40 steps of 4 groups x 8 episodes. Each token costs one forward
pass of the reference engine, which bounds the run (about 30 s per algorithm on 2 CPU cores).
The random tiny model solves 0.016 of the held-out episodes; after 40 steps it solves
0.15-0.23 of them with seed 0 (docs/results-log.md has the figures per algorithm and seed).
64 held-out tasks with 4 episodes each: the first 16 test tasks alone hold one task with
target 1, so a policy that favours one number would be judged by luck.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from dataclasses import replace
from pathlib import Path
from typing import get_args

import pytest

from agentgym.actors.engine import Generation, SamplingSpec
from agentgym.actors.hf_engine import HfEngine
from agentgym.actors.rollout import play_episode
from agentgym.config import Config, LearnerConfig, load_config
from agentgym.envpool.pool import EnvPool
from agentgym.learner.algorithms import ALGORITHMS
from agentgym.learner.control import rollout_spec
from agentgym.learner.trainer import Trainer
from agentgym.protocol import Rollout, RolloutSpec, Ticket
from agentgym.models.tiny import make_default_tiny_model

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart.toml"
SEED = 0
STEPS = 40
HELD_OUT_TASKS, HELD_OUT_EPISODES = 64, 4
# Held-out success after − before. Measured: 0.13-0.21 with seed 0, 0.098-0.27 over seeds 1-5 and
# the four algorithms. Same weights and sampling seeds give a rise of exactly 0; 0.06 is 15 more
# of the 256 held-out episodes solved, a margin that other CPUs' float rounding (another
# trajectory) keeps; a learner that unlearns (a sign error) or does nothing fails it.
MIN_RISE = 0.06
SETTINGS = (
    "env.kwargs={ low = 1, high = 4 }", "schedule.turn_limits=[[0, 2]]", "rollout.max_tokens_per_turn=2",
    "rollout.group_size=8", "learner.batch_groups=4", "learner.lr=1e-2", f"run.max_steps={STEPS}",
    # The loss and schedule the figures above were measured with (the quickstart's may change).
    'learner.loss_agg="token_mean"', 'learner.lr_schedule="constant"',
    # The turn limit is fixed and success within it is what counts: PPO's cut episodes are
    # terminal (docs/off_policy.md: bootstrapping them with gamma = 1 leaves PPO no signal).
    # The other algorithms have no critic and ignore it.
    'learner.truncation="terminal"', 'learner.device="cpu"', "model.create_tiny=false",
)  # fmt: skip


class RequestSeededEngine(HfEngine):
    """The reference engine with one sampling seed per request, derived from the request id
    (group/episode/turn): concurrent episodes reach the engine in an order that depends on the
    env workers' timing, and this way each one still samples the same tokens in every run."""

    async def generate(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        seed = zlib.crc32(f"{self.seed}:{request_id}".encode())
        return await super().generate(request_id, prompt_ids, replace(spec, seed=seed))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_default_tiny_model(tmp_path_factory.mktemp("learn") / "tiny", seed=0)


def config(model_dir: Path, algorithm: str, *overrides: str) -> Config:
    return load_config(QUICKSTART, [*SETTINGS, f'model.path="{model_dir}"', f"learner.algorithm={algorithm}",
                                    f"run.seed={SEED}", *overrides])  # fmt: skip


async def play_groups(
    engine: HfEngine, tokenizer: object, pool: EnvPool, spec: RolloutSpec, tickets: list[Ticket], episodes: int,
    turn_limit: int,
) -> list[Rollout]:  # fmt: skip
    """``episodes`` episodes of each ticket, all at once, as actors play them."""

    async def group(t: Ticket) -> Rollout:
        eps = await asyncio.gather(*(play_episode(engine, tokenizer, pool, t, i, spec, turn_limit) for i in range(episodes)))
        return Rollout(group_id=t.group_id, actor_id="test", env=t.env, task_id=t.task_id, episodes=list(eps))

    return list(await asyncio.gather(*(group(t) for t in tickets)))


async def train_and_evaluate(cfg: Config) -> tuple[float, float, list[dict[str, float]]]:
    """Held-out success of the initial and of the trained weights, and each step's metrics."""
    from transformers import AutoTokenizer

    env = cfg.env.specs[0]
    spec = rollout_spec(cfg)  # how actors play, as the learner's Welcome tells them
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    trainer = Trainer.load(cfg)
    engine = RequestSeededEngine(cfg.model.path, seed=cfg.run.seed)
    pool = EnvPool(env.name, dict(env.kwargs), 8)
    held_out = [Ticket(group_id=f"eval:{i}", env=env.name, task_id=i, split="test") for i in range(HELD_OUT_TASKS)]

    async def success(turn_limit: int) -> float:
        groups = await play_groups(engine, tokenizer, pool, spec, held_out, HELD_OUT_EPISODES, turn_limit)
        eps = [e for g in groups for e in g.episodes]
        return sum(e.success for e in eps) / len(eps)

    await engine.start()
    await pool.start()
    try:
        before = await success(cfg.schedule.turn_limit(0))
        draw = random.Random(cfg.run.seed)  # training tasks from the train range, seeded by run.seed
        metrics = []
        for step in range(cfg.run.max_steps):
            tickets = [Ticket(group_id=f"train:{step}:{g}", env=env.name, task_id=env.task_start + draw.randrange(env.task_count))
                       for g in range(cfg.learner.batch_groups)]  # fmt: skip
            rollouts = await play_groups(engine, tokenizer, pool, spec, tickets, spec.group_size, cfg.schedule.turn_limit(step))
            metrics.append(trainer.train_step(rollouts))
            await engine.update_weights({k: v.detach() for k, v in trainer.model.state_dict().items()}, trainer.version)
        after = await success(cfg.schedule.turn_limit(trainer.step))
    finally:
        await pool.close()
        await engine.close()
        trainer.close()
    return before, after, metrics


def test_every_selectable_algorithm_is_tested() -> None:
    assert set(ALGORITHMS) == set(get_args(LearnerConfig.model_fields["algorithm"].annotation))


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_algorithm_raises_held_out_success(model_dir: Path, algorithm: str) -> None:
    cfg = config(model_dir, algorithm)
    before, after, metrics = asyncio.run(asyncio.wait_for(train_and_evaluate(cfg), 540))
    train = [round(m["success_rate"], 2) for m in metrics]
    print(f"\n{algorithm}: held-out success {before:.3f} -> {after:.3f}; training success per step {train}")
    # Each batch was played by the weights it trains, with the learner's own numerics: μ = π_prox.
    assert all(m["staleness_max"] == 0 for m in metrics)
    assert max(abs(m["is_weight_mean"] - 1) for m in metrics) < 1e-3
    assert ("value_loss" in metrics[-1]) == (algorithm == "ppo")
    assert after >= before + MIN_RISE, (
        f"{algorithm}: held-out success {before:.3f} -> {after:.3f} after {len(metrics)} steps "
        f"(needs a rise of {MIN_RISE}); training success per step {train}"
    )
