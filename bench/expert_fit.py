"""Can the model represent the expert? Supervised fit of guess_number's binary-search expert.

    python bench/expert_fit.py [--model models/tiny] [--steps 300] [--lr 3e-3] [--dagger 0.5]

The question behind a plateau in RL: is the policy class able to play well at all? This fits the
model by cross-entropy to the env's ``expert_action`` on the exact token sequences the actors
build (``actors/play/conversation.Conversation``, the env's instructions as system message, one token
per turn), then plays every target with the fitted model at temperature 1 and greedily.

States: with ``--dagger p`` each turn of a training episode plays a uniformly random valid
number with probability p instead of the expert's (the label is still the expert's action in
that state), so the fit also covers histories the expert never produces, as an RL policy's own
samples do. p = 0 fits the expert's own 8 trajectories only.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agentgym.actors.play.conversation import Conversation  # noqa: E402
from agentgym.envpool.envs.guess_number import GuessNumber  # noqa: E402


def expert_episode(tok, env: GuessNumber, task_id: int, turns: int, dagger: float, rng: random.Random):
    """(token ids, positions to predict, target token ids) of one episode labelled by the expert."""
    conv = Conversation.start(tok, env.instructions(), env.reset(task_id))
    pos, tgt = [], []
    for _ in range(turns):
        label = tok.encode(env.expert_action(), add_special_tokens=False)
        pos.append(len(conv) - 1)
        tgt.append(label[0])
        act = str(rng.randint(env.low, env.high)) if rng.random() < dagger else env.expert_action()
        conv.add_agent_turn(tok.encode(act, add_special_tokens=False), [0.0], 0)
        res = env.step(act)
        if res.done:
            break
        conv.add_observation(res.observation)
    return list(conv.token_ids), pos, tgt


def play(model, tok, env: GuessNumber, task_id: int, turns: int, greedy: bool, gen) -> bool:
    import torch

    conv = Conversation.start(tok, env.instructions(), env.reset(task_id))
    for _ in range(turns):
        with torch.no_grad():
            logits = model(torch.tensor([conv.prompt_ids])).logits[0, -1]
        t = int(logits.argmax()) if greedy else int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        conv.add_agent_turn([t], [0.0], 0)
        res = env.step(tok.decode([t], skip_special_tokens=True))
        if res.done:
            return bool(res.info.get("success"))
        conv.add_observation(res.observation)
    return False


def main() -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "tiny")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dagger", type=float, default=0.0)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    env, rng, gen = GuessNumber(), random.Random(args.seed), torch.Generator().manual_seed(args.seed)

    def evaluate(step: int, loss: float) -> None:
        model.eval()
        tasks = range(10_000, 10_064)  # 64 tasks: every target several times
        samp = sum(play(model, tok, env, t, args.turns, False, gen) for t in tasks) / len(tasks)
        greedy = sum(play(model, tok, env, t, 3, True, gen) for t in range(10_000, 10_016)) / 16
        print(
            f"step {step:4d} loss {loss:.4f} success@{args.turns} sampled {samp:.3f} greedy@3 {greedy:.3f}", flush=True
        )
        model.train()

    evaluate(0, float("nan"))
    for step in range(1, args.steps + 1):
        eps = [expert_episode(tok, env, rng.randrange(10**6), args.turns, args.dagger, rng) for _ in range(args.batch)]
        width = max(len(ids) for ids, _, _ in eps)
        ids = torch.tensor([e[0] + [0] * (width - len(e[0])) for e in eps])
        logits = model(ids).logits
        rows = torch.tensor([i for i, e in enumerate(eps) for _ in e[1]])
        cols = torch.tensor([c for e in eps for c in e[1]])
        tgt = torch.tensor([t for e in eps for t in e[2]])
        loss = torch.nn.functional.cross_entropy(logits[rows, cols], tgt)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % max(1, args.steps // 6) == 0 or step == args.steps:
            evaluate(step, float(loss))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
