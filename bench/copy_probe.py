"""Does a model copy from its context? TextCraft's crafting book, read at the first turn.

    python bench/copy_probe.py models/agent-tiny-textcraft1 [--tasks 48] [--depth 1 --distractors 2]

A TextCraft action names items of the crafting book in front of the agent; a model that cannot
copy a line of its context writes commands of the right form about items the book does not hold
(docs/results.md, textcraft1). For each held-out task this plays the prompt an actor builds and
reports two figures:

- the greedy first action: a line of the book as written, a craft of an item the book holds
  (wrong ingredients), a craft of an item it does not hold, a ``get`` of a raw material the book
  names, or anything else;
- teacher-forced copy accuracy: with each line of the book appended as the action, the share of
  its tokens after the first three that the model's argmax predicts (the first tokens choose the
  line; the rest are copying).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def probe(model_dir: Path, tasks: int, depth: int, distractors: int) -> dict[str, object]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.actors.play.conversation import Conversation
    from agentgym.envpool.envs.textcraft import TextCraft

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    env = TextCraft(depth=depth, distractors=distractors)
    kinds: Counter[str] = Counter()
    right = total = 0
    for task in TextCraft.tasks("test", depth=depth, distractors=distractors)[:tasks]:
        first = env.reset(task)
        world = env._world
        assert world is not None
        prompt = list(Conversation.start(tok, env.instructions() or None, first).token_ids)
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=32,
                do_sample=False,
                eos_token_id=end,
                pad_token_id=tok.pad_token_id or 0,
            )
        action = tok.decode(out[0, len(prompt) :], skip_special_tokens=True).strip()
        crafted = re.match(r"craft \d+ (.+?) using ", action)
        raws = {i for r in world.recipes.values() for i, _ in r.ingredients}
        if action in world.book:
            kinds["book line"] += 1
        elif crafted:
            kinds["craft of a book item" if crafted.group(1) in world.recipes else "craft of another item"] += 1
        elif re.fullmatch(r"get \d+ (.+)", action) and action.split(" ", 2)[2] in raws:
            kinds["get of a book raw"] += 1
        else:
            kinds["other"] += 1
        for line in world.book:
            ids = tok.encode(line, add_special_tokens=False)
            with torch.no_grad():
                logits = model(torch.tensor([prompt + ids])).logits[0]
            pred = logits[len(prompt) + 2 : len(prompt) + len(ids) - 1].argmax(-1)
            right += int((pred == torch.tensor(ids[3:])).sum())
            total += len(ids) - 3
    return {
        "model": str(model_dir),
        "tasks": tasks,
        "first_action": dict(kinds),
        "teacher_forced_copy_accuracy": round(right / total, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", type=Path)
    p.add_argument("--tasks", type=int, default=48)
    p.add_argument("--depth", type=int, default=1)
    p.add_argument("--distractors", type=int, default=2)
    args = p.parse_args()
    for m in args.models:
        print(json.dumps(probe(m, args.tasks, args.depth, args.distractors)), flush=True)


if __name__ == "__main__":
    main()
