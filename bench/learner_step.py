"""The learner's step alone, against this machine's matmul limit: one process, one model, one batch,
each precision and layout in turn, with the limit measured in the same run.

    python bench/learner_step.py --model models/smollm2-135m                 # probe echo: 8 x 8 episodes
    python bench/learner_step.py --model models/smollm2-135m --shape multiturn --steps 3

The batch is built from the env's own text with the model's chat template, as the actor renders
it: ``echo`` is the probe-echo task of bench/step_cost.py (8 groups of 8, the system prompt and the
number, up to 8 agent tokens); ``multiturn`` is guess_number-like (4 groups of 8, 6 turns of 4
agent tokens and a one-line reply). Agent tokens are random ids (the step's cost does not depend
on them). Settings, each a learner config override set:

- ``fp32``: float32 weights and passes, rows unpacked (the learner before mixed precision);
- ``bf16``: float32 master weights, passes under bfloat16 autocast (model.dtype bfloat16);
- ``bf16+prefix``: the same with each group's shared prompt run once (learner.shared_prefix).

The limit: a 2048 x 2048 matmul on the learner's threads, float32 and bfloat16. ``ideal_s`` is
``6 * tokens * params`` FLOP (forward and backward over every token of the batch, the
parameters outside the embeddings; the LM head on the agent's tokens: ``6 * agent * H * V``) at
the bfloat16 limit; ``x_limit`` is the step's seconds over that (1.0: at the limit; below 1: less
work than the unpacked step, as with a shared prefix). Prints a table and the load average;
compare rows of one invocation only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {
    "fp32": ['model.dtype="float32"', "learner.shared_prefix=false"],
    "bf16": ['model.dtype="bfloat16"', "learner.shared_prefix=false"],
    "bf16+prefix": ['model.dtype="bfloat16"', "learner.shared_prefix=true"],
}


def matmul_limit(threads: int, n: int = 2048, reps: int = 6) -> dict[str, float]:
    import torch

    torch.set_num_threads(threads)
    out = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        out[name] = 2 * n**3 * reps / (time.perf_counter() - t)
    return out


def rollouts(model: Path, shape: str, seed: int = 0) -> list:
    import numpy as np
    from transformers import AutoTokenizer

    sys.path.insert(0, str(REPO / "tests"))
    from learner_fixtures import episode

    from agentgym.protocol import Rollout

    tok = AutoTokenizer.from_pretrained(model)
    rng = np.random.default_rng(seed)
    vocab = len(tok)

    def render(msgs: list[dict[str, str]]) -> list[int]:
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        return list(tok(text, add_special_tokens=False).input_ids)

    out = []
    groups, size = (8, 8) if shape == "echo" else (4, 8)
    for g in range(groups):
        if shape == "echo":
            msgs = [{"role": "system", "content": "say one number."}, {"role": "user", "content": str(1 + g % 8)}]
            turns, per_turn, reply = 1, 8, [tok.eos_token_id or 0]
        else:
            msgs = [
                {
                    "role": "system",
                    "content": "Guess my number between 1 and 100. After each guess I say higher or lower. Answer with a number only.",
                },
                {"role": "user", "content": "I am thinking of a number between 1 and 100. Your guess?"},
            ]
            turns, per_turn = 6, 4
            reply = render([{"role": "user", "content": "Higher."}])
        prompt = render(msgs)
        eps = []
        for i in range(size):
            agent = [[int(t) for t in rng.integers(100, vocab, per_turn)] for _ in range(turns)]
            eps.append(
                episode(
                    prompt,
                    agent,
                    [float(i % 2)] + [0.0] * (turns - 1),
                    behav=[-3.0] * (turns * per_turn),
                    between=reply,
                )
            )
        out.append(Rollout(group_id=f"g{g}", actor_id="a", env=shape, task_id=g, episodes=eps))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--shape", choices=["echo", "multiturn"], default="echo")
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--steps", type=int, default=3, help="timed steps per setting (after one warm-up step)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    args = p.parse_args()

    import torch

    sys.path.insert(0, str(REPO / "tests"))
    from learner_fixtures import make_cfg

    from agentgym.learner.training.trainer import Trainer

    limit = matmul_limit(args.threads)
    batch = rollouts(args.model, args.shape)
    rows = []
    for name in args.settings.split(","):
        cfg = make_cfg(
            args.model,
            f"learner.threads={args.threads}",
            "rollout.max_episode_tokens=8192",
            "learner.lr=1e-6",
            *SETTINGS[name],
        )
        torch.manual_seed(0)
        tr = Trainer.load(cfg)
        params = sum(p.numel() for n, p in tr.model.named_parameters() if "embed" not in n and "lm_head" not in n)
        hidden, vocab = tr.model.config.hidden_size, tr.model.config.vocab_size
        tr.train_step(batch)  # warm-up: first-call allocations and kernel choices
        times, m = [], {}
        for _ in range(args.steps):
            t = time.perf_counter()
            m = tr.train_step(batch)
            times.append(time.perf_counter() - t)
        step_s = statistics.median(times)
        flop = 6 * m["tokens"] * params + 6 * m["trained_tokens"] * hidden * vocab
        ideal = flop / limit["bfloat16"]
        rows.append(
            {
                "setting": name,
                "step_s": round(step_s, 2),
                "tokens": int(m["tokens"]),
                "forward_tokens": int(m["forward_tokens"]),
                "agent_tokens": int(m["trained_tokens"]),
                "tokens_per_s": round(m["tokens"] / step_s, 1),
                "ideal_s": round(ideal, 2),
                "x_limit": round(step_s / ideal, 2),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        del tr
    load = os.getloadavg()
    print(
        f"\nmatmul limit ({args.threads} threads, 2048x2048): float32 {limit['float32'] / 1e9:.0f} GFLOP/s, "
        f"bfloat16 {limit['bfloat16'] / 1e9:.0f} GFLOP/s; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print("| setting | s/step | tokens (forward) | agent tokens | tokens/s | ideal s (bf16 limit) | x limit |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['setting']} | {r['step_s']} | {r['tokens']} ({r['forward_tokens']}) | {r['agent_tokens']} | "
            f"{r['tokens_per_s']} | {r['ideal_s']} | {r['x_limit']} |"
        )
    if args.out:
        args.out.write_text(
            json.dumps({"limit_flops": limit, "load": load, "shape": args.shape, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
