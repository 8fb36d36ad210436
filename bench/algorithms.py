"""Does each learner algorithm raise success on the built-in environment? One real run per algorithm.

    python bench/algorithms.py [--config configs/quickstart.toml] [--steps 80] [--algorithms grpo,ppo,...]

Runs ``agentgym train`` once per ``learner.algorithm`` (grpo, ppo, reinforce_pp, rloo) with
everything else equal: a real learner and real actor processes with vLLM engines over loopback,
the quickstart's tiny random model on guess_number. Held-out success is evaluated on the same
test tasks before the first step (version 0) and after the last one (``eval.at_start``,
``eval.at_end``), so the table shows what each algorithm learned in the same number of steps.
Also reported from ``metrics.jsonl``: the training success of the last 10 batches, mean
|advantage|, mean clip fraction and importance weight, PPO's explained variance, and the
training wall time (first to last optimizer step). docs/results-log.md quotes a run of it.
Numbers vary with the seed and the machine; what to look for is after > before for every row.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentgym.host.netutil import free_port_pair

REPO = Path(__file__).resolve().parents[1]

ALGORITHMS = ("grpo", "ppo", "reinforce_pp", "rloo")


def _mean(recs: list[dict], key: str) -> float:
    vals = [r[key] for r in recs if key in r and r[key] == r[key]]
    return sum(vals) / len(vals) if vals else float("nan")


def run(algorithm: str, config: Path, steps: int, actors: int, out: Path, extra: list[str]) -> dict[str, float]:
    run_dir = out / algorithm
    port = free_port_pair()
    overrides = [
        f'learner.bind="tcp://127.0.0.1:{port}"',
        f'learner.algorithm="{algorithm}"',
        "eval.at_start=true",
        "eval.at_end=true",
        "eval.every=0",
        *extra,
    ]
    cmd = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "train",
        "--config",
        str(config),
        "--max-steps",
        str(steps),
        "--actors",
        str(actors),
        "--run-dir",
        str(run_dir),
    ]
    for o in overrides:
        cmd += ["-o", o]
    print(f"[{algorithm}] {' '.join(cmd[2:])}", flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"[{algorithm}] run failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    first = min(evals, key=lambda e: e["version"])
    last = max(evals, key=lambda e: e["version"])
    res = {
        "eval_success_before": first["success_rate"],
        "eval_success_after": last["success_rate"],
        "train_success_first10": _mean(recs[:10], "success_rate"),
        "train_success_last10": _mean(recs[-10:], "success_rate"),
        "advantage_abs_mean": _mean(recs, "advantage_abs_mean"),
        "is_weight_mean": _mean(recs, "is_weight_mean"),
        "clip_frac": _mean(recs, "clip_frac"),
        "explained_variance_last10": _mean(recs[-10:], "explained_variance"),
        "train_s": recs[-1]["time"] - recs[0]["time"],
        "total_s": time.time() - t0,
    }
    print(f"[{algorithm}] " + " ".join(f"{k}={v:.3f}" for k, v in res.items()), flush=True)
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=REPO / "configs" / "quickstart.toml")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--algorithms", default=",".join(ALGORITHMS), help="comma-separated subset")
    p.add_argument("-o", "--override", action="append", default=[], help="extra KEY=VALUE for every run")
    p.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temp dir)")
    args = p.parse_args()
    algos = [a for a in args.algorithms.split(",") if a]
    unknown = [a for a in algos if a not in ALGORITHMS]
    if unknown:
        raise SystemExit(f"--algorithms: unknown {unknown}; choose from {ALGORITHMS}")
    out = args.out or Path(tempfile.mkdtemp(prefix="agentgym-algorithms-"))
    res = {a: run(a, args.config.resolve(), args.steps, args.actors, out, args.override) for a in algos}
    keys = list(next(iter(res.values())))
    print(f"\n{args.steps} steps, {args.actors} actors, config {args.config.name}, runs in {out}\n")
    print("| algorithm | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for a, r in res.items():
        print(f"| {a} | " + " | ".join(f"{r[k]:.3f}" for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
