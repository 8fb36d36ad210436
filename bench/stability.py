"""Is async as stable as sync? Real runs, side by side: seeds x {sync, async} x tasks.

    python bench/stability.py --model models/tiny-gn-base --seeds 0,1,2,3,4 --tasks echo,guess_number \
        --steps 100 [--engine hf] [--out runs/stability] [-o learner.lr=3e-3 ...]

Each run is ``agentgym train`` (one learner and ``--actors`` actor processes over ZeroMQ) with
the same settings in both modes: 8 groups of 8 per step, one token per turn, temperature 1,
AdamW at a constant lr 3e-3, grad clip 1.0, no KL, ``learner.max_staleness = 2``, a held-out
evaluation at the end (``--eval-tasks`` test tasks x 8 samples). A run *collapses* when its
training success falls to <= 0.05 and stays there for 10 steps to the end (bench/offpolicy_lag.py
has the same rule). The base model should be one that can act: ``agentgym make-model --arch tiny
--pretrain-steps 1000 --pretrain-env guess_number DIR`` (made when ``--model`` does not exist).

Prints one line per run and a table per task and mode (collapses, final held-out mean and
spread, training success of the last 10 steps, trained tokens past the staleness bound), and
writes ``OUT/results.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from offpolicy_lag import collapsed  # noqa: E402

TASKS = {
    "echo": ['env.name="probe"', 'env.kwargs={kind="echo", low=1, high=8}', "schedule.turn_limits=[[0, 1]]"],
    "guess_number": ['env.name="guess_number"', "env.kwargs={low=1, high=8}", "schedule.turn_limits=[[0, 4]]"],
}
SETTINGS = [
    "rollout.group_size=8",
    "learner.batch_groups=8",
    "rollout.max_tokens_per_turn=1",
    "rollout.temperature=1.0",
    "learner.lr=3e-3",
    'learner.lr_schedule="constant"',
    "learner.max_grad_norm=1.0",
    "learner.kl_coef=0.0",
    "learner.max_staleness=2",
    "eval.at_start=false",
    "eval.at_end=true",
    "eval.every=0",
    "model.create_tiny=false",
]


def one_run(args: argparse.Namespace, task: str, mode: str, seed: int, port: int) -> dict:
    run_dir = args.out / f"{task}-{mode}-s{seed}"
    cmd = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "train",
        "--config",
        str(REPO / "configs" / "quickstart.toml"),
        "--run-dir",
        str(run_dir),
        "--mode",
        mode,
        "--max-steps",
        str(args.steps),
        "--actors",
        str(args.actors),
        *[
            x
            for o in [
                *SETTINGS,
                *TASKS[task],
                f"run.seed={seed}",
                f'model.path="{args.model}"',
                f'actor.engine="{args.engine}"',
                f"eval.tasks={args.eval_tasks}",
                f'learner.bind="tcp://127.0.0.1:{port}"',
                *args.override,
            ]
            for x in ("-o", o)
        ],
    ]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall = time.time() - t0
    if proc.returncode != 0:
        return {"task": task, "mode": mode, "seed": seed, "error": proc.stderr[-2000:], "wall_s": wall}
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    success = [s["success_rate"] for s in steps]
    return {
        "task": task,
        "mode": mode,
        "seed": seed,
        "wall_s": round(wall, 1),
        "steps": len(steps),
        # Steady state: steps after the first (which waits for the engines to start).
        "steps_per_s": round((len(steps) - 1) / max(steps[-1]["time"] - steps[0]["time"], 1e-9), 3),
        "held_out": evals[-1]["success_rate"] if evals else None,
        "collapse_step": collapsed(success),
        "train_last10": round(statistics.mean(success[-10:]), 4),
        "entropy_last": round(steps[-1].get("entropy", float("nan")), 3),
        "over_bound_share": summary.get("trained_staleness", {}).get("over_bound_share"),
        "staleness_max_seen": summary.get("trained_staleness", {}).get("max_seen"),
        "health": summary.get("health"),
        "curve": success,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--tasks", default="echo,guess_number")
    p.add_argument("--modes", default="sync,async")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--engine", default="vllm")
    p.add_argument("--eval-tasks", type=int, default=32)
    p.add_argument("--out", type=Path, default=REPO / "runs" / "stability")
    p.add_argument("-o", "--override", action="append", default=[])
    args = p.parse_args()
    args.model = args.model.resolve()
    if not (args.model / "config.json").exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "agentgym.cli",
                "make-model",
                "--arch",
                "tiny",
                "--pretrain-steps",
                "1000",
                "--pretrain-env",
                "guess_number",
                str(args.model),
            ],
            check=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    port = 5700
    for task in args.tasks.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            for mode in args.modes.split(","):
                r = one_run(args, task, mode, seed, port)
                port += 2
                results.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "curve"}), flush=True)
                (args.out / "results.json").write_text(json.dumps(results))
    print(
        "\n| task | mode | collapsed (bench rule) | run_collapsed fired | held-out mean (min-max) | train success, last 10 | tokens past bound |"
    )
    print("|---|---|---|---|---|---|---|")
    for task in args.tasks.split(","):
        for mode in args.modes.split(","):
            rs = [r for r in results if r["task"] == task and r["mode"] == mode and "error" not in r]
            if not rs:
                continue
            held = [r["held_out"] for r in rs if r["held_out"] is not None]
            fired = sum(bool((r.get("health") or {}).get("collapsed")) for r in rs)
            print(
                f"| {task} | {mode} | {sum(r['collapse_step'] is not None for r in rs)}/{len(rs)} | {fired}/{len(rs)} | "
                f"{statistics.mean(held):.3f} ({min(held):.2f}-{max(held):.2f}) | "
                f"{statistics.mean(r['train_last10'] for r in rs):.3f} | "
                f"{statistics.mean(r['over_bound_share'] or 0 for r in rs):.4f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
