"""How much of guess_number's return can a critic explain? Offline fits on a trained policy's episodes.

    python bench/critic_fit.py --policy RUN/checkpoints/step_000300 [--init models/tiny] \
        [--groups 64] [--turn-limit 6] [--epochs 60] [--lr 1e-2]

Plays ``--groups`` train tasks and as many other tasks (the test half) x 8 samples with the
policy checkpoint (the transformers reference engine, the actor's rollout code, a real EnvPool),
then, per agent token, the Monte Carlo return G (γ = 1: the episode's 0/1 reward) and:

- the ceiling: a table of the mean return of each exact prefix (the whole observation a critic
  sees) fitted on the train half; its explained variance on the test half is what a critic that
  memorises every state reaches on these episodes (unseen prefixes predict the train mean);
- critics fitted by Adam on the train half (squared error, all agent tokens of a minibatch),
  explained variance on the test half after each ``--report`` epochs: a linear head on the
  frozen trained policy's last hidden state, a linear head on the initial model's, and a
  separate value model (learner/model/value_model.py) started from the initial weights, from a fresh
  random initialisation, and from the trained policy.

Explained variance is the learner's: 1 − Var(G − V) / Var(G) over agent tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import random
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agentgym.actors.engines.hf_engine import HfEngine  # noqa: E402
from agentgym.actors.play.rollout import play_episode  # noqa: E402
from agentgym.config import load_config  # noqa: E402
from agentgym.envpool.envs.guess_number import GuessNumber, parse_number  # noqa: E402
from agentgym.envpool.pool import EnvPool  # noqa: E402
from agentgym.learner.algorithms.advantages import gae  # noqa: E402
from agentgym.learner.algorithms.estimators import explained_variance  # noqa: E402
from agentgym.learner.control.actor_control import rollout_spec  # noqa: E402
from agentgym.learner.model.policy import load_causal_lm  # noqa: E402
from agentgym.learner.model.value_model import ValueHead, align_values, build_value_model  # noqa: E402
from agentgym.learner.training.batch import Batch, collate, trainable_episodes  # noqa: E402
from agentgym.protocol import Rollout, Ticket  # noqa: E402


async def play(policy: Path, task_ids: list[int], turn_limit: int, seed: int) -> list[Rollout]:
    from transformers import AutoTokenizer

    cfg = load_config(REPO / "configs" / "quickstart.toml", [f'model.path="{policy}"', "model.create_tiny=false"])
    spec = rollout_spec(cfg)
    tok = AutoTokenizer.from_pretrained(policy)
    engine = HfEngine(str(policy), seed=seed)
    pool = EnvPool("guess_number", {"low": 1, "high": 8}, 8)
    await engine.start()
    await pool.start()
    try:

        async def group(t: Ticket) -> Rollout:
            eps = await asyncio.gather(*(play_episode(engine, tok, pool, t, i, spec, turn_limit) for i in range(8)))
            return Rollout(group_id=t.group_id, actor_id="fit", env=t.env, task_id=t.task_id, episodes=list(eps))

        tickets = [Ticket(group_id=f"fit:{i}", env="guess_number", task_id=i) for i in task_ids]
        return list(await asyncio.gather(*(group(t) for t in tickets)))
    finally:
        await pool.close()
        await engine.close()


def reward_with_shaping(b: Batch, tasks: torch.Tensor, shaping: float, tok: object) -> Batch:
    """The same episodes rewarded as guess_number with ``shaping`` would have rewarded them: the
    env replayed on each row's decoded guesses, each turn's reward on its agent token."""
    rewards = torch.zeros_like(b.token_rewards)
    for row in range(b.size):
        env = GuessNumber(shaping=shaping)
        env.reset(int(tasks[row]))
        for t in (b.loss_mask[row] != 0).nonzero().flatten().tolist():
            rewards[row, t] = env.step(tok.decode([int(b.input_ids[row, t])])).reward  # type: ignore[attr-defined]  # tok: a transformers tokenizer, typed object here
    return Batch(**{**b.tensors(), "token_rewards": rewards, "rewards": rewards.sum(-1)})


def mc_returns(b: Batch) -> torch.Tensor:
    """G_t per agent token (γ = 1, λ = 1, no bootstrap: the turn limit ends the game)."""
    _, ret = gae(b.token_rewards, torch.zeros_like(b.token_rewards), b.loss_mask, gamma=1.0, lam=1.0)
    return ret


def state_keys(b: Batch, targets: list[int], tok: object) -> list[list[tuple]]:
    """Per row, per agent token (in order): (turn, lo, hi, guesses so far, exact prefix), where
    [lo, hi] is the interval the hints so far allow (the target's true interval)."""
    out = []
    for row in range(b.size):
        lo, hi, guesses, keys = 1, 8, (), []
        for turn, t in enumerate((b.loss_mask[row] != 0).nonzero().flatten().tolist()):
            keys.append((turn, lo, hi, guesses, tuple(b.input_ids[row, :t].tolist())))
            g = parse_number(tok.decode([int(b.input_ids[row, t])]))  # type: ignore[attr-defined]  # tok: a transformers tokenizer, typed object here
            guesses = (*guesses, g)
            if g is not None and 1 <= g <= 8 and g < targets[row]:
                lo = max(lo, g + 1)
            elif g is not None and 1 <= g <= 8 and g > targets[row]:
                hi = min(hi, g - 1)
        out.append(keys)
    return out


def table_ev(
    fit_b: Batch, eval_b: Batch, fit_keys: list[list[tuple]], eval_keys: list[list[tuple]], depth: int, shrink: float
) -> tuple[float, float, torch.Tensor]:
    """EV on ``eval_b`` of V(s) = the mean return of ``fit_b``'s agent tokens with the same key
    (the first ``depth`` fields of :func:`state_keys`), shrunk towards the mean of the key one
    field shorter by ``shrink`` pseudo-counts; unseen keys predict their parent's mean. Fitted
    and evaluated on the same half, a state's own return is left out of its mean (leave-one-out)."""
    g_fit, g_eval = mc_returns(fit_b), mc_returns(eval_b)
    same = fit_b is eval_b
    sums: dict[tuple, list[float]] = {}
    for row, keys in enumerate(fit_keys):
        for t, key in zip((fit_b.loss_mask[row] != 0).nonzero().flatten().tolist(), keys, strict=True):
            for d in range(depth + 1):
                s = sums.setdefault(key[:d], [0.0, 0.0])
                s[0] += float(g_fit[row, t])
                s[1] += 1

    def value(key: tuple, d: int, own: float) -> float:
        s = sums.get(key[:d], [0.0, 0.0])
        tot, n = (s[0] - own, s[1] - 1) if same else (s[0], s[1])
        if d == 0:
            return tot / max(n, 1)
        parent = value(key, d - 1, own)
        return (tot + shrink * parent) / (n + shrink) if n + shrink > 0 else parent

    v = torch.zeros_like(g_eval)
    seen = total = 0
    for row, keys in enumerate(eval_keys):
        for t, key in zip((eval_b.loss_mask[row] != 0).nonzero().flatten().tolist(), keys, strict=True):
            own = float(g_eval[row, t]) if same else 0.0
            v[row, t] = value(key, depth, own)
            seen, total = seen + (key[:depth] in sums), total + 1
    return explained_variance(v, g_eval, eval_b.loss_mask), seen / total, v


class FrozenBodyHead(torch.nn.Module):
    """A linear head on a frozen causal LM's last hidden state (the shared head with no body step)."""

    own_body = True

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.head = ValueHead(model.config.hidden_size)

    def state_values(self, hidden: object, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            h = self.model(input_ids=ids, attention_mask=attn, output_hidden_states=True).hidden_states[-1]
        return self.head(h)


def values_of(critic: torch.nn.Module, b: Batch) -> torch.Tensor:
    return align_values(critic.state_values(None, b.input_ids, b.attention_mask), b.attention_mask)[0]


def fit(
    name: str, critic: torch.nn.Module, train: Batch, test: Batch, epochs: int, lr: float, report: int, mb: int = 64
) -> None:
    opt = torch.optim.Adam([p for p in critic.parameters() if p.requires_grad], lr=lr)
    g_tr, g_te = mc_returns(train), mc_returns(test)
    gen = torch.Generator().manual_seed(0)
    t0 = time.time()
    line = []
    for ep in range(1, epochs + 1):
        for rows in torch.randperm(train.size, generator=gen).split(mb):
            m = train.loss_mask[rows]
            v = values_of(critic, Batch(**{k: x[rows] for k, x in train.tensors().items()}))
            loss = (((v - g_tr[rows]) ** 2) * m).sum() / m.sum()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0)
            opt.step()
        if ep % report == 0 or ep == epochs:
            with torch.no_grad():
                ev_tr = explained_variance(values_of(critic, train), g_tr, train.loss_mask)
                ev_te = explained_variance(values_of(critic, test), g_te, test.loss_mask)
            line.append(f"{ep}:{ev_tr:.2f}/{ev_te:.2f}")
    print(f"{name:34s} train/test EV by epoch  {'  '.join(line)}  ({time.time() - t0:.0f}s)", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", type=Path, required=True, help="a checkpoint directory of a trained run")
    p.add_argument("--init", type=Path, default=REPO / "models" / "tiny", help="the run's initial model")
    p.add_argument("--groups", type=int, default=64)
    p.add_argument("--turn-limit", type=int, default=6)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--report", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--lam", type=float, default=0.95, help="GAE λ of the learner's value targets")
    p.add_argument("--tables-only", action="store_true")
    p.add_argument("--shaping", type=float, default=0.0, help="reward the episodes as guess_number(shaping=...) would")
    p.add_argument("--cache", type=Path, default=None, help="episodes saved here, read back if it exists")
    p.add_argument("--only", default="", help="comma-separated subset of the fitted critics")
    args = p.parse_args()
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    if args.cache is not None and args.cache.exists():
        saved = torch.load(args.cache, weights_only=True)
        train, test, tasks = Batch(**saved["train"]), Batch(**saved["test"]), saved["tasks"]
    else:
        task_ids = list(range(1000, 1000 + 2 * args.groups))
        rollouts = asyncio.run(play(args.policy, task_ids, args.turn_limit, seed=0))
        train, test = collate(rollouts[: args.groups], 0), collate(rollouts[args.groups :], 0)
        tasks = torch.tensor([r.task_id for r in rollouts for _ in trainable_episodes(r)])
        if args.cache is not None:
            torch.save({"train": train.tensors(), "test": test.tensors(), "tasks": tasks}, args.cache)
    targets = [random.Random(int(t)).randint(1, 8) for t in tasks.tolist()]
    tok = AutoTokenizer.from_pretrained(args.policy)
    if args.shaping:
        train, test = (
            reward_with_shaping(b, tasks[i : i + b.size], args.shaping, tok)
            for b, i in ((train, 0), (test, train.size))
        )
    for name, b in (("train", train), ("test", test)):
        g = mc_returns(b)[b.loss_mask != 0]
        print(
            f"{name}: {b.size} episodes, success {float(b.success.mean()):.3f}, turns {float(b.turns.mean()):.2f}, "
            f"agent tokens {int((b.loss_mask != 0).sum())}, return mean {float(g.mean()):.3f} "
            f"var {float(g.var()):.3f}"
        )
    keys_tr, keys_te = state_keys(train, targets[: train.size], tok), state_keys(test, targets[train.size :], tok)
    for kname, k in (("turn", 1), ("turn, interval", 3), ("turn, interval, guesses", 4), ("exact prefix", 5)):
        for shrink in (0.0, 5.0):
            ev_te, seen, v = table_ev(train, test, keys_tr, keys_te, k, shrink)
            ev_tr, _, _ = table_ev(train, train, keys_tr, keys_tr, k, shrink)
            # The learner's own figure: EV against the GAE(γ = 1, λ) targets R = Â + V built with this V.
            _, ret_lam = gae(test.token_rewards, v, test.loss_mask, gamma=1.0, lam=args.lam)
            ev_lam = explained_variance(v, ret_lam, test.loss_mask)
            print(
                f"table V(s) = mean G by ({kname}), shrink {shrink:g}: test EV {ev_te:.3f}, against λ-returns "
                f"{ev_lam:.3f} (train-half EV {ev_tr:.3f}; {seen:.0%} of test states seen in train)"
            )
    if args.tables_only:
        return 0
    dtype = torch.float32
    trained, init = load_causal_lm(args.policy, dtype), load_causal_lm(args.init, dtype)
    fresh = copy.deepcopy(init)
    torch.manual_seed(1)
    fresh.apply(fresh._init_weights)
    critics = {
        "shared head, trained policy frozen": lambda: FrozenBodyHead(copy.deepcopy(trained)),
        "shared head, initial model frozen": lambda: FrozenBodyHead(copy.deepcopy(init)),
        "separate, initial weights": lambda: build_value_model("separate", init),
        "separate, fresh init": lambda: build_value_model("separate", fresh),
        "separate, trained policy": lambda: build_value_model("separate", trained),
    }
    only = [s for s in args.only.split(",") if s]
    for name, make in critics.items():
        if not only or any(o in name for o in only):
            fit(name, make(), train, test, args.epochs, args.lr, args.report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
