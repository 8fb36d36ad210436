"""ScalingInter-RL at small scale: a fixed short turn limit, a fixed long one, and a staged schedule.

    python bench/scaling_inter.py [--seeds 0,1,2] [--steps 60] [--out runs/scaling_inter] [--plot docs/img/scaling_inter.png]
    python bench/scaling_inter.py --row maze3-map --limits 4,6,8 --steps 30 --eval-every 10 -o ... --out runs/scaling_inter_maze3map --plot ...

AgentGym-RL's ScalingInter-RL (arXiv 2509.08755) trains with a short interaction horizon first
and lengthens it in stages; its claim is that this is more stable and ends higher than a fixed
long horizon (which collapses) and than a fixed short one (which plateaus). Three arms, the same
number of learner steps and everything else equal, each with the in-process loop of
bench/learn_curve.py (transformers engine, the real rollout code and EnvPool, the learner's
Trainer):

    short   schedule.turn_limits = [[0, SHORT]]
    long    schedule.turn_limits = [[0, LONG]]
    staged  [[0, SHORT], [steps/3, MID], [2*steps/3, LONG]]

The env is guess_number with numbers 1 to 8, one token per turn (the number): binary search
needs up to 4 turns, and within 2 turns no policy solves more than 3 of the 8 targets, so the
horizon matters. The maze and BabyAI envs were the first choice,
but the tiny model's tokenizer knows only guess_number's words and a random model almost never
emits a valid move, so no arm would see a reward within the budget (docs/results-log.md, "ScalingInter-RL at small scale"). Held-out
success is always measured at the LONG limit: the task is the same for every arm, only the
training horizon differs. Results go to OUT/<arm>/seed<S>.json; ``--plot`` draws the three arms.

``--row R`` runs the comparison on a row of the results table instead (configs/envs/R.toml, its
base model made and pretrained first if missing), with ``--limits SHORT,MID,LONG``: a multi-token
env where the horizon matters. Run on BabyAI GoToObj (limits 12, 18, 24) and maze3-map (4, 6, 8);
docs/results.md has the commands and the results. Maze 5x5 on one map gives its base no success
at all. The summary adds, per arm, the largest drop of held-out success after its peak and the
final policy entropy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learn_curve import LOOP_OVERRIDES, REPO, train_curve  # noqa: E402

from agentgym.config import load_config  # noqa: E402

SHORT, MID, LONG = 2, 4, 6


def arms(steps: int, short: int = SHORT, mid: int = MID, long: int = LONG) -> dict[str, str]:
    return {
        "short": f"[[0, {short}]]",
        "long": f"[[0, {long}]]",
        "staged": f"[[0, {short}], [{steps // 3}, {mid}], [{2 * steps // 3}, {long}]]",
    }


def collapse(folder: Path) -> str:
    """Per seed: final held-out success, the largest drop after the peak, the last step's entropy."""
    out = []
    for f in sorted(folder.glob("seed*.json")):
        r = json.loads(f.read_text())
        ys = [y for _, y in r["curve"]]
        drop = max((max(ys[: i + 1]) - y for i, y in enumerate(ys)), default=0.0)
        ent = r["metrics"][-1].get("entropy", float("nan")) if r["metrics"] else float("nan")
        out.append(
            f"{f.stem}: final {ys[-1]:.2f}, peak {max(ys):.2f}, largest drop after peak {drop:.2f}, entropy {ent:.2f}"
        )
    return f"{folder.name}: " + "; ".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=REPO / "configs" / "quickstart.toml")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--eval-every", type=int, default=15)
    p.add_argument("--eval-tasks", type=int, default=32)
    p.add_argument("--arms", default="short,long,staged")
    p.add_argument("-o", "--override", action="append", default=[])
    p.add_argument("--out", type=Path, default=REPO / "runs" / "scaling_inter")
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--row", default="", help="a results-table row instead: configs/envs/ROW.toml")
    p.add_argument("--limits", default=f"{SHORT},{MID},{LONG}", help="SHORT,MID,LONG turn limits")
    p.add_argument(
        "--engine",
        choices=("hf", "vllm"),
        default="hf",
        help="hf: the reference engine, one request at a time; vllm: the actors' engine, batched",
    )
    args = p.parse_args()
    from agentgym.models.tiny import make_default_tiny_model

    short, mid, long = (int(x) for x in args.limits.split(","))
    base = [
        "env.kwargs={ low = 1, high = 8 }",
        "rollout.max_tokens_per_turn=1",
        "rollout.group_size=8",
        "learner.batch_groups=4",
        f"run.max_steps={args.steps}",
        *LOOP_OVERRIDES,
        "model.create_tiny=false",
    ]
    if args.row:
        from agentgym.models.base import ensure_model

        args.config = REPO / "configs" / "envs" / f"{args.row}.toml"
        ensure_model(load_config(args.config, [*args.override]))
        base = [f"run.max_steps={args.steps}", *LOOP_OVERRIDES, "model.create_tiny=false"]
    for seed in [int(s) for s in args.seeds.split(",")]:
        for arm in args.arms.split(","):
            limits = arms(args.steps, short, mid, long)[arm]
            cfg = load_config(
                args.config,
                [
                    *base,
                    f"run.seed={seed}",
                    f"schedule.turn_limits={limits}",
                    f'actor.engine="{args.engine}"',
                    *args.override,
                ],
            )
            if not Path(cfg.model.path, "config.json").exists():
                make_default_tiny_model(Path(cfg.model.path), seed=0)
            print(f"[{arm} seed {seed}] turn_limits={limits}", flush=True)
            res = asyncio.run(
                train_curve(
                    cfg,
                    args.eval_every,
                    args.eval_tasks,
                    eval_turn_limit=long,
                    partial=args.out / arm / f"seed{seed}.json",
                    engine_kind=args.engine,
                )
            )
            res.update(arm=arm, turn_limits=limits, seed=seed, engine=args.engine, overrides=[*base, *args.override])
            (args.out / arm).mkdir(parents=True, exist_ok=True)
            (args.out / arm / f"seed{seed}.json").write_text(json.dumps(res))
    if args.plot:
        from plot_curves import plot, table

        folders = [args.out / a for a in args.arms.split(",")]
        what = args.row or "guess_number 1-8"
        plot(folders, args.plot, f"{what}, held-out success at {long} turns")
        print(table(folders))
    for folder in (args.out / a for a in args.arms.split(",")):
        if folder.exists():
            print(collapse(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
