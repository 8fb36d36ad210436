"""Each learner algorithm raises held-out success on the built-in environment: one real, short
training run per algorithm, in this process.

For every selectable ``learner.algorithm`` the loop is the synchronous one of tests/learn_loop.py
(the reference engine plays groups of guess_number episodes, the learner's Trainer takes a step
on each batch, the new weights go into the engine), and held-out success, measured on the same
test tasks with the same sampling seeds before the first step and after the last one, must rise
by a clear margin. ``bench/algorithms.py`` makes the same comparison at the quickstart's size
through real actor processes and vLLM.

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
from pathlib import Path
from typing import get_args

import pytest
from learn_loop import train_and_evaluate

from agentgym.config import Config, LearnerConfig, load_config
from agentgym.learner.algorithms.estimators import ALGORITHMS
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
    "env.kwargs={ low = 1, high = 4 }",
    "schedule.turn_limits=[[0, 2]]",
    "rollout.max_tokens_per_turn=2",
    "rollout.group_size=8",
    "learner.batch_groups=4",
    "learner.lr=1e-2",
    f"run.max_steps={STEPS}",
    # The loss and schedule the figures above were measured with (the quickstart's may change).
    'learner.loss_agg="token_mean"',
    'learner.lr_schedule="constant"',
    # The turn limit is fixed and success within it is what counts: PPO's cut episodes are
    # terminal (docs/off_policy.md: bootstrapping them with gamma = 1 leaves PPO no signal).
    # The other algorithms have no critic and ignore it.
    'learner.truncation="terminal"',
    'learner.device="cpu"',
    "model.create_tiny=false",
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_default_tiny_model(tmp_path_factory.mktemp("learn") / "tiny", seed=0)


def config(model_dir: Path, algorithm: str, *overrides: str) -> Config:
    return load_config(
        QUICKSTART,
        [*SETTINGS, f'model.path="{model_dir}"', f"learner.algorithm={algorithm}", f"run.seed={SEED}", *overrides],
    )


def test_every_selectable_algorithm_is_tested() -> None:
    assert set(ALGORITHMS) == set(get_args(LearnerConfig.model_fields["algorithm"].annotation))


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_algorithm_raises_held_out_success(model_dir: Path, algorithm: str) -> None:
    cfg = config(model_dir, algorithm)
    before, after, metrics = asyncio.run(
        asyncio.wait_for(train_and_evaluate(cfg, HELD_OUT_TASKS, HELD_OUT_EPISODES), 540)
    )
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
