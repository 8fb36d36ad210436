"""The demo's base model (agentgym/models/base.py): language-model pretraining on random play
teaches the tiny model to read the history, never shows a good move, and is made once."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from agentgym.actors.play.conversation import Conversation  # noqa: E402
from agentgym.config import load_config  # noqa: E402
from agentgym.envpool.envs.guess_number import GuessNumber  # noqa: E402
from agentgym.envpool.envs.maze import Maze  # noqa: E402
from agentgym.models.base import ensure_model, lm_loss, pretrain_on_play, random_play  # noqa: E402
from agentgym.models.tiny import make_default_tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# Histories after which the hint to the last guess is forced: (guesses and hints, guess, the hint).
FORCED = [
    ([(6, "lower")], 7, "lower"),
    ([(2, "higher")], 1, "higher"),
    ([(5, "lower")], 8, "lower"),
    ([(3, "higher")], 2, "higher"),
    ([(4, "higher"), (7, "lower")], 8, "lower"),
    ([(4, "lower")], 6, "lower"),
]


def forced_hint_probability(model_dir: Path) -> float:
    """Mean probability the model gives the forced hint (against the other word) over FORCED."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    env = GuessNumber()
    probs = []
    for history, guess, right in FORCED:
        logp = {}
        for word in ("higher", "lower"):
            conv = Conversation.start(tok, env.instructions(), "guess a number from 1 to 8")
            for g, hint in [*history, (guess, word)]:
                conv.add_agent_turn(tok.encode(str(g), add_special_tokens=False), [0.0], 0)
                conv.add_observation(hint)
            ids = torch.tensor([list(conv.token_ids)])
            with torch.no_grad():
                lp = torch.log_softmax(model(ids).logits[0, :-1], -1)
            logp[word] = float(lp.gather(1, ids[0, 1:, None]).sum())  # the prefixes are the same
        probs.append(math.exp(logp[right]) / (math.exp(logp["higher"]) + math.exp(logp["lower"])))
    return sum(probs) / len(probs)


# The skill shows in a jump whose place depends on the draw of transcripts (docs/results-log.md,
# 2026-11-25; 1,000 steps were past it for every draw tried). For this seed, forced-hint
# probability 0.62 at 400 steps, 0.95 at 500, 0.94 at 600 (2026-11-28, "The suite's two
# pretrainings"): 600 is past the jump with a margin, at 60% of the time.
PRETRAIN_STEPS = 600


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    root = tmp_path_factory.mktemp("base")
    raw = make_default_tiny_model(root / "random", seed=0)
    record = pretrain_on_play(raw, root / "base", "guess_number", steps=PRETRAIN_STEPS, seed=0)
    return raw, root / "base", record


def test_pretraining_teaches_the_model_to_read_the_history(models: tuple[Path, Path, dict]) -> None:
    raw, base, record = models
    # The random model cannot tell which hint a history forces; the base model must have read
    # the earlier hint to give the forced one (a hint after one guess alone is a coin flip).
    assert abs(forced_hint_probability(raw) - 0.5) < 0.1
    assert forced_hint_probability(base) > 0.75
    saved = json.loads((base / "pretrain.json").read_text())
    assert saved == record and saved["env"] == "guess_number" and saved["steps"] == PRETRAIN_STEPS
    assert saved["heldout_loss_after"] < 0.3 * saved["heldout_loss_before"]


def test_the_base_model_plays_no_better_than_chance_guesses(models: tuple[Path, Path, dict]) -> None:
    """Random play shows no good move: the base model's first guess is spread over the range, not
    the expert's midpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, base, _ = models
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    env = GuessNumber()
    conv = Conversation.start(tok, env.instructions(), env.reset(0))
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([conv.prompt_ids])).logits[0, -1], -1)
    digits = torch.tensor([tok.encode(str(n), add_special_tokens=False)[0] for n in range(1, 9)])
    mass = p[digits]
    assert float(mass.sum()) > 0.9  # it learned what an action looks like
    assert float(mass.max()) < 0.3  # and no favourite: uniform would be 0.125 each


def test_random_play_is_built_like_an_actor_builds_it(models: tuple[Path, Path, dict]) -> None:
    from transformers import AutoTokenizer

    raw, _, _ = models
    tok = AutoTokenizer.from_pretrained(raw)
    env = GuessNumber()
    ids = random_play(tok, env, 7, 6, random.Random(0))
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n" + env.instructions())
    moves = re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", text)
    replies = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", text)
    assert 1 <= len(moves) <= 6 and all(m in "12345678" and len(m) == 1 for m in moves)
    # The first message is the task; each move but a correct last one has the env's reply after it.
    assert replies[0] == "guess a number from 1 to 8"
    assert all(r in ("higher", "lower") for r in replies[1:]) and len(replies) - 1 in (len(moves), len(moves) - 1)
    assert random_play(tok, env, 7, 6, random.Random(0)) == ids  # deterministic given the seeds


def test_random_play_with_endings_keeps_the_env_s_last_reply(models: tuple[Path, Path, dict]) -> None:
    from transformers import AutoTokenizer

    from agentgym.envpool.envs.wordle import Wordle

    tok = AutoTokenizer.from_pretrained(models[0])
    env = Wordle(word_list=str(REPO / "configs" / "envs" / "wordle-16.txt"), held_out="games", max_guesses=2)
    for task in range(6):
        plain = tok.decode(random_play(tok, env, task, 8, random.Random(task)))
        ended = tok.decode(random_play(tok, env, task, 8, random.Random(task), endings=True))
        assert ended.startswith(plain)  # the same game, the same moves ...
        moves = re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", ended)
        replies = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", ended)
        assert len(replies) == len(moves) + 1  # ... and a reply to every move, the last one too
        assert replies[-1].endswith((f"the word was {env.word(task)}.", "correct! You found the word."))
        assert "the word was" not in plain


def test_random_play_with_quiz_ends_a_lost_game_with_the_agent_naming_the_word(models: tuple[Path, Path, dict]) -> None:
    from transformers import AutoTokenizer

    from agentgym.envpool.envs.wordle import Wordle

    tok = AutoTokenizer.from_pretrained(models[0])
    env = Wordle(word_list=str(REPO / "configs" / "envs" / "wordle-16.txt"), held_out="games", max_guesses=3)
    lost = won = 0
    for task in range(30):
        ended = tok.decode(random_play(tok, env, task, 8, random.Random(task), endings=True))
        quizzed = tok.decode(random_play(tok, env, task, 8, random.Random(task), endings=True, quiz=True))
        moves = re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", quizzed)
        replies = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", quizzed)
        if "correct! You found the word." in ended:
            assert quizzed == ended  # a won game has nothing to ask
            won += 1
            continue
        lost += 1
        # The same moves, then the last feedback without the word, asked, and the word as the agent's turn.
        assert moves[:-1] == re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", ended)
        assert replies[-1].endswith("No guesses left. What was the word?") and "the word was" not in quizzed
        assert moves[-1] == env.word(task) and len(moves) == 4 and len(replies) == 4
    assert lost and won  # both kinds of game were seen
    plain = GuessNumber()  # an env without a quiz ends as endings says
    assert random_play(tok, plain, 3, 6, random.Random(0), quiz=True) == random_play(tok, plain, 3, 6, random.Random(0))


def test_lm_loss_takes_transcripts_of_one_length(models: tuple[Path, Path, dict]) -> None:
    # Random play's ids are numpy int32; a batch that needs no padding (every transcript as long,
    # as maze 5x5 played to its turn cap gives) once reached cross-entropy as int32 and crashed.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    raw = models[0]
    tok = AutoTokenizer.from_pretrained(raw)
    model = AutoModelForCausalLM.from_pretrained(raw, dtype=torch.float32)
    ep = random_play(tok, GuessNumber(), 0, 3, random.Random(0))
    with torch.no_grad():
        same = float(lm_loss(model, [ep, ep], 0))
        padded = float(lm_loss(model, [ep, ep[:-2]], 0))
    assert math.isfinite(same) and math.isfinite(padded) and same > 0


def test_env_without_random_action_is_refused_by_name(models: tuple[Path, Path, dict], tmp_path: Path) -> None:
    raw, _, _ = models
    with pytest.raises(ValueError, match="env 'probe'.*random_action"):
        pretrain_on_play(raw, tmp_path / "x", "probe", steps=1)
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="steps must be >= 1"):
        pretrain_on_play(raw, tmp_path / "x", "guess_number", steps=0)


def test_maze_random_actions_are_valid_moves_through_open_sides() -> None:
    env, rng = Maze(), random.Random(0)
    env.reset(3)
    moves = set()
    for _ in range(60):
        action = env.random_action(rng)
        moves.add(action)
        res = env.step(action)
        assert "Invalid" not in res.observation and "hit a wall" not in res.observation, (action, res.observation)
        if res.done:
            env.reset(4)
    assert moves == {"move up", "move down", "move left", "move right"}


def test_ensure_model_makes_the_configured_model_once(tmp_path: Path) -> None:
    path = tmp_path / "m"
    cfg = load_config(
        REPO / "configs" / "quickstart.toml",
        [f'model.path="{path}"', "model.create_tiny=true", "model.pretrain_steps=3"],
    )
    ensure_model(cfg)
    record = json.loads((path / "pretrain.json").read_text())
    assert record["steps"] == 3 and record["env"] == "guess_number"
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    ensure_model(cfg)  # a model already there is left alone
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary directory left behind
    plain = load_config(
        REPO / "configs" / "quickstart.toml", [f'model.path="{tmp_path / "p"}"', "model.create_tiny=true"]
    )
    ensure_model(plain)
    assert (tmp_path / "p" / "config.json").exists() and not (tmp_path / "p" / "pretrain.json").exists()


def test_expert_policy_plays_the_experts_moves_and_is_recorded(tmp_path: Path) -> None:
    """``model.sft_steps`` after random play, or ``model.pretrain_policy = "expert"`` alone (the
    labelled "SFT on expert" rows): the transcripts are the scripted expert's episodes, built as an
    actor builds them, and the model's record says which stages made it."""
    from transformers import AutoTokenizer

    from agentgym.envpool.envs.textcraft import TextCraft

    path = tmp_path / "m"
    cfg = load_config(
        REPO / "configs" / "envs" / "textcraft1-sft.toml",
        [f'model.path="{path}"', "model.pretrain_steps=2", "model.sft_steps=3"],
    )
    assert cfg.model.pretrain_policy == "random" and cfg.model.arch == "agent-tiny"
    ensure_model(cfg)
    record = json.loads((path / "pretrain.json").read_text())
    assert record["policy"] == "expert" and record["env"] == "textcraft" and record["steps"] == 3
    assert [(r["policy"], r["steps"]) for r in record["stages"]] == [("random", 2), ("expert", 3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no stage's directory left behind
    alone = load_config(
        REPO / "configs" / "envs" / "textcraft1-sft.toml",
        [
            f'model.path="{tmp_path / "e"}"',
            "model.pretrain_steps=2",
            "model.sft_steps=0",
            'model.pretrain_policy="expert"',
        ],
    )
    ensure_model(alone)
    record = json.loads((tmp_path / "e" / "pretrain.json").read_text())
    assert record["policy"] == "expert" and record["steps"] == 2 and "stages" not in record
    tok = AutoTokenizer.from_pretrained(path)
    env = TextCraft(depth=1, distractors=2)
    for task in range(5):
        text = tok.decode(random_play(tok, env, task, 6, random.Random(0), policy="expert"))
        moves = re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", text)
        goal = text.split("Goal: craft ", 1)[1].split(".", 1)[0]
        # Depth 1: gather the raw materials, then craft the goal; the last craft ended the episode.
        assert env._done and moves[-1].startswith("craft ") and f" {goal} using " in moves[-1], (goal, moves)
        assert all(m.startswith("get ") for m in moves[:-1]) and len(moves) <= 4, moves
    with pytest.raises(ValueError, match="policy must be one of random, expert"):
        pretrain_on_play(path, tmp_path / "x", "guess_number", steps=1, policy="greedy")


def test_pretrain_env_kwargs_are_the_options_the_base_is_played_with(tmp_path: Path) -> None:
    """``model.pretrain_env_kwargs``: a run trained on 5x5 mazes from a base pretrained on 3x3 to
    5x5 ones (configs/envs/maze5.toml); the run's own options stay as they were."""
    from transformers import AutoTokenizer

    cfg = load_config(
        REPO / "configs" / "envs" / "maze5.toml",
        [
            f'model.path="{tmp_path / "m"}"',
            "model.pretrain_steps=2",
            'env.kwargs={size=5, progress_reward="record"}',
            "model.pretrain_env_kwargs={train_sizes=[3, 4, 5]}",
        ],
    )
    ensure_model(cfg)
    record = json.loads((tmp_path / "m" / "pretrain.json").read_text())
    assert record["env_kwargs"] == {"size": 5, "progress_reward": "record", "train_sizes": [3, 4, 5]}
    assert "train_sizes" not in cfg.env.kwargs
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    env = Maze(**record["env_kwargs"])
    sizes = {
        re.search(r"maze of (\d) by", tok.decode(random_play(tok, env, task, 2, random.Random(0)))).group(1)
        for task in range(3)
    }
    assert sizes == {"3", "4", "5"}
