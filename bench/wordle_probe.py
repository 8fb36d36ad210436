"""Does a model read Wordle's feedback? Guesses sampled after random ones, by what the feedback allows.

    python bench/wordle_probe.py models/agent-tiny-wordle-letters [--tasks 24] [--before 2] [--samples 8]
    python bench/wordle_probe.py MODEL --config configs/envs/wordle-games.toml --reveal [--tasks 64]
    python bench/wordle_probe.py MODEL --config configs/envs/wordle-games.toml --belief --tasks 2000 --before 3
    python bench/wordle_probe.py MODEL --config configs/envs/wordle-games.toml --quiz [--tasks 64]

Reading the feedback is the skill a Wordle row needs: a policy that guesses at random among the
words the feedback so far allows solves every held-out word of the small list (docs/results.md).
For the train and the test split apart (the test words are never an answer in training), on the
row's env (``--config``), this reports, after ``--before`` random guesses, ``--samples`` guesses
sampled at temperature 1 from the prompt an actor builds: the share that is the answer, another
word the feedback allows (what the row's progress reward pays), a word of the list it rules out,
or no word of the list; and ``uniform``, the share of the list the feedback allows there (the
answer included): what a uniform guess among the list's words would score as answer + allowed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _kind(env, text: str) -> str:  # noqa: ANN001 - a Wordle env mid-game
    word = "".join(text.lower().split()).strip(".")
    if word not in env._all:
        return "not a word"
    allowed = env._consistent()
    return "answer" if word == env._answer else "allowed" if word in allowed else "ruled out"


def _load(model_dir: Path, config: Path):  # noqa: ANN202 - (tokenizer, model, env, env options)
    """The model (eval mode, float32), its tokenizer, and the Wordle env of ``config``'s first env."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.config import load_config
    from agentgym.envpool.envs.wordle import Wordle

    kwargs = dict(load_config(config).env.specs[0].kwargs)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return tok, model, Wordle(**kwargs), kwargs


def _play_random(env, tok, task: int, rng: random.Random, guesses: int | None = None):  # noqa: ANN001, ANN202
    """A game of ``task`` played at random, as an actor builds it: ``guesses`` random guesses or, with
    None, to the end. Returns the conversation (no reply after the game's last guess) and the last
    step's result."""
    from agentgym.actors.play.conversation import Conversation

    conv = Conversation.start(tok, env.instructions() or None, env.reset(task))
    n = 0
    while guesses is None or n < guesses:
        action = env.random_action(rng)
        ids = tok.encode(action, add_special_tokens=False)
        conv.add_agent_turn(ids, [0.0] * len(ids), 0)
        result = env.step(action)
        n += 1
        if result.done:
            break
        conv.add_observation(result.observation)
    return conv, result


def probe(model_dir: Path, config: Path, tasks: int, before: int, samples: int, seed: int = 0) -> dict[str, object]:
    import torch

    from agentgym.actors.play.conversation import Conversation
    from agentgym.envpool.envs.wordle import Wordle

    tok, model, env, kwargs = _load(model_dir, config)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    report: dict[str, object] = {"model": str(model_dir), "config": str(config), "before": before}
    for split in ("train", "test"):
        guessed: Counter[str] = Counter()
        uniform: list[float] = []
        for task in list(Wordle.tasks(split, **kwargs))[:tasks]:
            first = env.reset(task)
            conv = Conversation.start(tok, env.instructions() or None, first)
            for _ in range(before):
                action = env.random_action(rng)
                ids = tok.encode(action, add_special_tokens=False)
                conv.add_agent_turn(ids, [0.0] * len(ids), 0)
                conv.add_observation(env.step(action).observation)
            uniform.append(len(env._consistent()) / len(env._all))
            prompt = torch.tensor([conv.prompt_ids])
            with torch.no_grad():
                out = model.generate(
                    prompt.repeat(samples, 1),
                    max_new_tokens=12,
                    do_sample=True,
                    temperature=1.0,
                    eos_token_id=end,
                    pad_token_id=tok.pad_token_id or 0,
                )
            for row in out[:, prompt.shape[1] :]:
                guessed[_kind(env, tok.decode(row, skip_special_tokens=True))] += 1
        n = sum(guessed.values())
        report[split] = {
            "guesses": {k: round(v / n, 3) for k, v in sorted(guessed.items())},
            "sampled": n,
            "uniform": round(sum(uniform) / len(uniform), 3),
        }
    return report


def _lost_games(env, tok, kwargs: dict, tasks: int, rng: random.Random, hit, key: str) -> dict[str, object]:  # noqa: ANN001
    """For the train and the test split: the first ``tasks`` games played at random to the end, and
    of the lost ones the share where ``hit(conv, result)`` (the conversation without the last reply,
    the last step's result) holds, as ``key``, beside ``reader`` (the answer's chance in a pick
    uniform among the words the feedback allows) and ``uniform`` (1 / the list)."""
    from agentgym.envpool.envs.wordle import Wordle

    report: dict[str, object] = {}
    for split in ("train", "test"):
        hits, reader, games = 0, 0.0, 0
        for task in list(Wordle.tasks(split, **kwargs))[:tasks]:
            conv, result = _play_random(env, tok, task, rng)
            if result.info.get("success"):
                continue  # solved by chance: nothing hidden
            reader += 1 / len(env._consistent())
            hits += bool(hit(conv, result))
            games += 1
        report[split] = {
            "games": games,
            key: round(hits / max(games, 1), 3),
            "reader": round(reader / max(games, 1), 3),
            "uniform": round(1 / len(env._all), 3),
        }
    return report


def reveal(model_dir: Path, config: Path, tasks: int, seed: int = 0) -> dict[str, object]:
    """What the model expects the env to reveal: games played at random to the last guess and lost,
    then every word of the list scored as the word in "the word was ..."; the share of games whose
    best-scored word is the answer (``_lost_games``). A base pretrained with
    ``model.pretrain_endings`` has seen those endings."""
    import copy

    import torch

    tok, model, env, kwargs = _load(model_dir, config)

    def best_is_answer(conv, result) -> bool:  # noqa: ANN001
        shown = env._shown(env._answer)
        scores = []
        for word in env._sorted_all:
            c = copy.deepcopy(conv)
            c.add_observation(result.observation.replace(f"the word was {shown}.", f"the word was {env._shown(word)}."))
            ids = torch.tensor([c.token_ids])
            with torch.no_grad():
                logp = torch.log_softmax(model(ids).logits[0, :-1], -1).gather(1, ids[0, 1:, None]).sum()
            scores.append(float(logp))
        return env._sorted_all[max(range(len(scores)), key=scores.__getitem__)] == env._answer

    lost = _lost_games(env, tok, kwargs, tasks, random.Random(seed), best_is_answer, "best_is_answer")
    return {"model": str(model_dir), "config": str(config), "reveal": True, **lost}


def quiz(model_dir: Path, config: Path, tasks: int, seed: int = 0) -> dict[str, object]:
    """Does the model name the hidden word in its own turn? Games played at random to the last guess
    and lost, then the env's question (``Env.quiz``: "... No guesses left. What was the word?")
    and the model's greedy answer: the share that is the word (``_lost_games``). A base pretrained
    with ``model.pretrain_quiz`` has seen such endings."""
    import torch

    tok, model, env, kwargs = _load(model_dir, config)
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def named(conv, result) -> bool:  # noqa: ANN001, ARG001 - the question replaces the last reply
        question, answer = env.quiz()
        conv.add_observation(question)
        prompt = torch.tensor([conv.prompt_ids])
        with torch.no_grad():
            out = model.generate(
                prompt, max_new_tokens=12, do_sample=False, eos_token_id=end, pad_token_id=tok.pad_token_id or 0
            )
        return tok.decode(out[0, prompt.shape[1] :], skip_special_tokens=True).strip() == answer

    lost = _lost_games(env, tok, kwargs, tasks, random.Random(seed), named, "named")
    return {"model": str(model_dir), "config": str(config), "quiz": True, **lost}


def belief(model_dir: Path, config: Path, games: int, before: int, seed: int = 0) -> dict[str, object]:
    """Is the hidden word readable from the model's state where it writes its guess? Games of the
    train split played at random for ``before`` guesses (the unsolved ones), the last layer's
    hidden state at the generation prompt, and a linear probe (multinomial logistic regression)
    fitted on 3/4 of the games to name the answer; its accuracy on the other 1/4, beside
    ``reader`` (a pick uniform among the words the feedback allows) and ``uniform``."""
    import torch

    from agentgym.envpool.envs.wordle import Wordle

    tok, model, env, kwargs = _load(model_dir, config)
    rng = random.Random(seed)
    feats, labels, reader = [], [], []
    for task in list(Wordle.tasks("train", **kwargs))[:games]:
        conv, result = _play_random(env, tok, task, rng, before)
        if result.done:
            continue
        with torch.no_grad():
            out = model(torch.tensor([list(conv.prompt_ids)]), output_hidden_states=True)
        feats.append(out.hidden_states[-1][0, -1])
        labels.append(env._sorted_all.index(env._answer))
        reader.append(1 / len(env._consistent()))
    x, y = torch.stack(feats), torch.tensor(labels)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    cut = len(y) * 3 // 4
    torch.manual_seed(seed)
    probe_layer = torch.nn.Linear(x.shape[1], len(env._sorted_all))
    opt = torch.optim.Adam(probe_layer.parameters(), lr=1e-2, weight_decay=1e-3)
    for _ in range(500):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(probe_layer(x[:cut]), y[:cut]).backward()
        opt.step()
    with torch.no_grad():
        acc = (probe_layer(x[cut:]).argmax(-1) == y[cut:]).float().mean().item()
        fit = (probe_layer(x[:cut]).argmax(-1) == y[:cut]).float().mean().item()
    return {
        "model": str(model_dir),
        "belief": True,
        "before": before,
        "games": len(y),
        "probe_test": round(acc, 3),
        "probe_fit": round(fit, 3),
        "reader": round(sum(reader[cut:]) / len(reader[cut:]), 3),
        "uniform": round(1 / len(env._all), 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", type=Path)
    p.add_argument("--config", type=Path, default=REPO / "configs" / "envs" / "wordle-letters.toml")
    p.add_argument("--tasks", type=int, default=24)
    p.add_argument("--before", type=int, default=2)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--reveal", action="store_true", help="instead: which word the model expects a lost game to reveal")
    p.add_argument(
        "--quiz", action="store_true", help="instead: does the model name the hidden word of a lost game when asked"
    )
    p.add_argument(
        "--belief",
        action="store_true",
        help="instead: a linear probe for the hidden word on the state where the model writes its guess (--tasks games)",
    )
    args = p.parse_args()
    for m in args.models:
        if args.belief:
            out = belief(m, args.config, args.tasks, args.before)
        elif args.quiz:
            out = quiz(m, args.config, args.tasks)
        elif args.reveal:
            out = reveal(m, args.config, args.tasks)
        else:
            out = probe(m, args.config, args.tasks, args.before, args.samples)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
