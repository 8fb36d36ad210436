"""The echo probe with plain REINFORCE in a few lines of torch: is a failure the learner's or RL's?

    python bench/probe_reinforce.py --lr 3e-3 --steps 300 [--supervised] [--baseline group|batch]

The ``probe`` env's ``echo`` task without any of the project's machinery: the quickstart's tiny
model reads the prompt the actors build ("say one number." as system message, one digit 1-8 as
the observation) and must say the digit back. Every step samples ``--samples`` answers for each
of the eight prompts and takes one AdamW step on the REINFORCE loss with a per-prompt (GRPO:
centred and divided by the std) or whole-batch baseline, or, with ``--supervised``, on the
cross-entropy of the right digit. Prints the mean probability of the right digit and the
entropy every 25 steps, and the share of the final hidden state that depends on the prompt.
docs/results-log.md ("The echo probe") quotes it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agentgym.actors.play.conversation import Conversation  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "tiny")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--samples", type=int, default=8, help="answers sampled per prompt per step")
    p.add_argument("--baseline", choices=("group", "batch"), default="group")
    p.add_argument("--supervised", action="store_true", help="cross-entropy on the right digit instead")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    prompts = torch.tensor([Conversation.start(tok, "say one number.", str(d)).prompt_ids for d in range(1, 9)])
    right = torch.tensor([tok.encode(str(d))[0] for d in range(1, 9)])
    with torch.no_grad():
        h = model(prompts, output_hidden_states=True).hidden_states[-1][:, -1]
    shared = (h - h.mean(0)).norm(dim=1).mean() / h.norm(dim=1).mean()
    print(f"prompt-dependent share of the last hidden state's norm: {shared:.3f}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    rows = torch.arange(8)
    for step in range(args.steps + 1):
        logp = model(prompts).logits[:, -1].float().log_softmax(-1)
        if step % 25 == 0:
            entropy = -(logp.exp() * logp).sum(-1).mean()
            print(f"step {step:4d} p(right) {logp.exp()[rows, right].mean():.3f} entropy {entropy:.2f}", flush=True)
        if args.supervised:
            loss = -logp[rows, right].mean()
        else:
            actions = torch.distributions.Categorical(logits=logp.detach()).sample((args.samples,)).T  # [8, n]
            reward = (actions == right[:, None]).float()
            if args.baseline == "batch":
                adv = reward - reward.mean()
            else:
                adv = (reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-6)
            loss = -(adv * logp.gather(1, actions)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
