"""Off-policy training with a fixed, known lag, in one process: the async learner's maths without
its timing noise.

    python bench/offpolicy_lag.py --config /path/echo.toml --lags 0,2,4 --seeds 0,1,2 --steps 60 \
        [-o learner.staleness_mode="drop" ...] [--tag NAME] [--out runs/lag]

Each step plays ``batch_groups`` groups with the weights the learner had ``lag`` steps before
(the transformers reference engine, one sampling seed per request), then trains one step on them
with the learner's own ``Trainer``. lag 0 is the synchronous baseline; lag L makes every trained
token exactly L versions old, which the real async path produces with an actor that is L versions
behind. What it isolates is the off-policy correction (importance weights, staleness weights,
clipping) and what sampling allows (special tokens), not the transport or the scheduler.

Per step it records training success, entropy, grad norm and the share of sampled action tokens
that are special tokens; at the end held-out success on ``--eval-tasks`` test tasks x 4. A run
*collapses* when its training success falls to <= 0.05 and stays there for 10 steps.
Writes ``OUT/TAG/lag<L>-seed<S>.json`` and prints one line per run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from learn_curve import EVAL_EPISODES, RequestSeededEngine, play_groups  # noqa: E402

from agentgym.config import Config, load_config  # noqa: E402
from agentgym.envpool.pool import EnvPool  # noqa: E402
from agentgym.learner.control.actor_control import rollout_spec  # noqa: E402
from agentgym.learner.training.trainer import Trainer  # noqa: E402
from agentgym.protocol import Ticket  # noqa: E402

COLLAPSE_SUCCESS, COLLAPSE_STEPS = 0.05, 10


def collapsed(success: list[float]) -> int | None:
    """The first step of a run of >= COLLAPSE_STEPS steps at success <= COLLAPSE_SUCCESS that lasts to the end."""
    n = len(success)
    i = n
    while i > 0 and success[i - 1] <= COLLAPSE_SUCCESS:
        i -= 1
    return i if n - i >= COLLAPSE_STEPS else None


async def run(cfg: Config, lag: int, eval_tasks: int) -> dict:
    from transformers import AutoTokenizer

    env = cfg.env.specs[0]
    spec = rollout_spec(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    special = set(tokenizer.all_special_ids)
    trainer = Trainer.load(cfg)
    engine = RequestSeededEngine(cfg.model.path, seed=cfg.run.seed)
    pool = EnvPool(env.name, dict(env.kwargs), 8)
    snapshots: collections.deque = collections.deque()
    steps: list[dict] = []
    t0 = time.time()
    await engine.start()
    await pool.start()
    try:
        draw = random.Random(cfg.run.seed)
        for step in range(cfg.run.max_steps):
            tickets = [
                Ticket(
                    group_id=f"train:{step}:{g}", env=env.name, task_id=env.task_start + draw.randrange(env.task_count)
                )
                for g in range(cfg.learner.batch_groups)
            ]
            rollouts = await play_groups(
                engine, tokenizer, pool, spec, tickets, spec.group_size, cfg.schedule.turn_limit(step)
            )
            eps = [e for r in rollouts for e in r.episodes]
            acts = np.concatenate(
                [np.frombuffer(e.token_ids, np.int32)[np.frombuffer(e.loss_mask, np.uint8) != 0] for e in eps]
            )
            m = trainer.train_step(rollouts)
            m["special_share"] = float(np.isin(acts, list(special)).mean()) if len(acts) else 0.0
            m["success"] = sum(e.success for e in eps) / len(eps)
            steps.append({k: v for k, v in m.items() if isinstance(v, (int, float))})
            snapshots.append((trainer.version, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}))
            # The engine serves the weights of `lag` versions ago (all of them at lag 0).
            while snapshots and snapshots[0][0] <= trainer.version - lag:
                version, state = snapshots.popleft()
                await engine.update_weights(state, version)
        held_out = [Ticket(group_id=f"eval:{i}", env=env.name, task_id=i, split="test") for i in range(eval_tasks)]
        while snapshots:  # evaluate the final weights
            version, state = snapshots.popleft()
            await engine.update_weights(state, version)
        groups = await play_groups(
            engine, tokenizer, pool, spec, held_out, EVAL_EPISODES, cfg.schedule.turn_limit(cfg.run.max_steps)
        )
        held = [e.success for g in groups for e in g.episodes]
    finally:
        await pool.close()
        await engine.close()
        trainer.close()
    success = [s["success"] for s in steps]
    return {
        "steps": steps,
        "held_out": sum(held) / len(held),
        "collapse_step": collapsed(success),
        "wall_s": time.time() - t0,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--seeds", default="0")
    p.add_argument("--lags", default="0,2")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--eval-tasks", type=int, default=32)
    p.add_argument("-o", "--override", action="append", default=[])
    p.add_argument("--tag", default="base")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "lag")
    args = p.parse_args()
    for lag in [int(x) for x in args.lags.split(",")]:
        for seed in [int(s) for s in args.seeds.split(",")]:
            overrides = [f"run.seed={seed}", 'learner.device="cpu"', "model.create_tiny=false", *args.override]
            if args.steps is not None:
                overrides.append(f"run.max_steps={args.steps}")
            cfg = load_config(args.config, overrides)
            res = asyncio.run(run(cfg, lag, args.eval_tasks))
            res.update(lag=lag, seed=seed, overrides=overrides)
            out = args.out / args.tag
            out.mkdir(parents=True, exist_ok=True)
            (out / f"lag{lag}-seed{seed}.json").write_text(json.dumps(res))
            s = res["steps"]
            last = s[-10:]
            print(
                f"[{args.tag}] lag={lag} seed={seed} held_out={res['held_out']:.3f} "
                f"train_last10={np.mean([x['success'] for x in last]):.3f} collapse_step={res['collapse_step']} "
                f"entropy_last={s[-1].get('entropy', float('nan')):.2f} special_share_last10={np.mean([x['special_share'] for x in last]):.2f} "
                f"wall={res['wall_s']:.0f}s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
