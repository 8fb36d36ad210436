"""An env whose actions are several tokens is learned: maze 3x3, from the agent-tiny base model.

The quickstart's tests learn guess_number, whose action is one token. Here each action is
``move up`` and the like: two tokens of the agent family's tokenizer (agentgym/agent_model.py)
and the end-of-turn token, sampled token by token. The base model is agent-tiny pretrained on
random play of the maze (agentgym/base_model.py): it learns the format of a move, never which
move is good. Then the loop of tests/test_algorithms_learn.py (the transformers reference
engine, the actor's rollout code on a real EnvPool, the learner's Trainer, in this process,
synchronously) trains it with GRPO; held-out success must rise by a clear margin.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_algorithms_learn import train_and_evaluate  # noqa: E402

from agentgym.agent_model import make_agent_model  # noqa: E402
from agentgym.base_model import pretrain_on_play  # noqa: E402
from agentgym.config import load_config  # noqa: E402
from agentgym.envpool.envs.maze import Maze  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PRETRAIN_STEPS, PRETRAIN_LR, TURNS, STEPS = 60, 1e-2, 4, 30
# Held-out success after − before (64 tasks x 4 episodes, the same sampling seeds before and
# after). MIN_RISE is set from the measured spread: see the figures below.
MIN_RISE = 0.1
SETTINGS = (
    f"schedule.turn_limits=[[0, {TURNS}]]", "rollout.max_tokens_per_turn=3", "rollout.group_size=8",
    "learner.batch_groups=4", "learner.lr=1e-2", f"run.max_steps={STEPS}", 'learner.loss_agg="token_mean"',
    'learner.lr_schedule="constant"', 'learner.truncation="terminal"', 'learner.device="cpu"',
    "model.create_tiny=false", 'learner.algorithm="grpo"',
)  # fmt: skip


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("multitoken")
    raw = make_agent_model(root / "random", "agent-tiny", seed=0)
    pretrain_on_play(raw, root / "base", "maze", {"size": 3}, steps=PRETRAIN_STEPS, lr=PRETRAIN_LR, seed=0, turns=TURNS)
    return root / "base"


def test_agent_tokenizer_makes_moves_a_few_tokens(base_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_model)
    for move in ("move up", "move down", "move left", "move right"):
        assert len(tok.encode(move, add_special_tokens=False)) == 2, move


def test_maze_is_learned_with_multi_token_actions(base_model: Path) -> None:
    cfg = load_config(REPO / "configs" / "envs" / "maze3.toml", [*SETTINGS, f'model.path="{base_model}"', "run.seed=0"])
    before, after, metrics = asyncio.run(asyncio.wait_for(train_and_evaluate(cfg), 900))
    train = [round(m["success_rate"], 2) for m in metrics]
    print(f"\nmaze 3x3: held-out success {before:.3f} -> {after:.3f}; training success per step {train}")
    assert all(m["staleness_max"] == 0 for m in metrics)
    assert after >= before + MIN_RISE, (
        f"maze 3x3: held-out success {before:.3f} -> {after:.3f} after {len(metrics)} steps "
        f"(needs a rise of {MIN_RISE}); training success per step {train}"
    )


def test_random_play_takes_multi_token_actions(base_model: Path) -> None:
    """random_play builds transcripts whose actions are several tokens (one logprob each)."""
    from transformers import AutoTokenizer

    from agentgym.base_model import random_play

    tok = AutoTokenizer.from_pretrained(base_model)
    text = tok.decode(random_play(tok, Maze(size=3), 5, 4, random.Random(0)))
    moves = [m.split("<|im_end|>")[0] for m in text.split("<|im_start|>assistant\n")[1:]]
    assert moves and all(m in ("move up", "move down", "move left", "move right") for m in moves)
