"""What an optimizer step costs: agentgym (learner + actor processes) against an in-process GRPO
trainer (TRL's ``GRPOTrainer``) on the same model, task, batch and optimizer, side by side.

    pip install trl          # the bench extra: pip install -e '.[bench]'
    python bench/step_cost.py --model models/tiny-gn-base --steps 40 [--engines hf,vllm] [--out runs/step_cost]
    python bench/step_cost.py --model models/smollm2-135m --real --steps 8 --engines vllm
    python bench/step_cost.py --tiny-model models/tiny --real-model models/smollm2-135m --engines vllm   # both, one invocation

``--real`` is the preset for an instruct model: at most 8 new tokens a turn, AdamW at a constant lr
1e-6, and agentgym in mixed precision (``model.dtype = "bfloat16"``: bfloat16 engines and wire,
float32 master weights; docs/adr/0023) with each group's prompt run once; TRL as it runs by
default on a CPU (float32). ``--trl-bf16`` gives TRL bfloat16 autocast too (its ``bf16`` flag).

The task is the echo probe (observation: a number 1-8; reward 1 for saying it), one token per
turn, 8 groups of 8 per step, temperature 1, AdamW at a constant lr 3e-3, grad clip 1.0, no KL.
TRL renders the same prompts with the model's chat template and generates with plain
``transformers``; agentgym runs ``agentgym train --mode sync`` (and async) with 2 actors of each
engine. Steady-state steps/s: steps after the first over the time between them (agentgym: the
``time`` stamps of metrics.jsonl; TRL: a callback's clock). Also the engine start-up: from the
launch to the first step's data (agentgym's first ``learner_wait_s``).

Prints a table and writes ``OUT/step_cost.json``. Compare figures from one invocation only: the
machine's load moves them all.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
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
    "eval.at_end=false",
    "eval.every=0",
    "model.create_tiny=false",
    'env.name="probe"',
    'env.kwargs={kind="echo", low=1, high=8}',
    "schedule.turn_limits=[[0, 1]]",
    "learner.log_episodes=0",
    "learner.checkpoint_every=0",
    "learner.checkpoint_minutes=0",
]


REAL = [
    "rollout.max_tokens_per_turn=8",
    "learner.lr=1e-6",
    'model.dtype="bfloat16"',
    "learner.shared_prefix=true",
    "rollout.max_episode_tokens=256",
    "actor.kv_cache_gib=0.5",
]
"""--real: the settings an instruct model is measured with (they follow SETTINGS, so they win)."""


def agentgym_run(model: Path, engine: str, mode: str, steps: int, out: Path, port: int, extra: list[str]) -> dict:
    run_dir = out / f"agentgym-{engine}-{mode}"
    overrides = [
        *SETTINGS,
        *extra,
        f'model.path="{model}"',
        f'actor.engine="{engine}"',
        f'learner.bind="tcp://127.0.0.1:{port}"',
    ]
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
        str(steps),
        "--actors",
        "2",
        *[x for o in overrides for x in ("-o", o)],
    ]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        return {"system": f"agentgym {mode}, {engine}", "error": proc.stderr[-1500:]}
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    parts = {
        k: sum(r.get(f"learner_{k}_s", 0.0) for r in recs[1:]) / max(len(recs) - 1, 1)
        for k in ("wait", "train", "export")
    }
    return {
        "system": f"agentgym {mode}, {engine}",
        "steps": len(recs),
        "wall_s": round(time.time() - t0, 1),
        "steps_per_s": round((len(recs) - 1) / (recs[-1]["time"] - recs[0]["time"]), 3),
        "startup_s": round(recs[0].get("learner_wait_s", float("nan")), 1),
        "per_step_s": {k: round(v, 4) for k, v in parts.items()},
        "success_last10": round(sum(r["success_rate"] for r in recs[-10:]) / min(10, len(recs)), 3),
    }


def trl_run(model: Path, steps: int, out: Path, *, max_tokens: int = 1, lr: float = 3e-3, bf16: bool = False) -> dict:
    """TRL's GRPOTrainer on the same prompts, reward, batch and optimizer."""
    try:
        from datasets import Dataset
        from transformers import AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:
        return {"system": "TRL GRPOTrainer", "error": f"{e} (pip install trl)"}
    sys.path.insert(0, str(REPO))
    from agentgym.envpool.envs.probe import Probe

    env = Probe(kind="echo")
    tok = AutoTokenizer.from_pretrained(model)
    rows = []
    for task in range(10_000, 10_000 + 64 * steps):
        obs = env.reset(task)
        rows.append(
            {
                "prompt": [{"role": "system", "content": env.instructions()}, {"role": "user", "content": obs}],
                "target": obs,
            }
        )
    random.Random(0).shuffle(rows)

    def reward(completions, target, **_):
        return [1.0 if c[0]["content"].strip() == t else 0.0 for c, t in zip(completions, target)]

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.time())

    cfg = GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=max_tokens,
        learning_rate=lr,
        bf16=bf16,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        beta=0.0,
        temperature=1.0,
        max_steps=steps,
        use_cpu=True,
        report_to=[],
        logging_steps=10,
        save_strategy="no",
        dataloader_num_workers=0,
        seed=0,
    )
    t0 = time.time()
    trainer = GRPOTrainer(
        model=str(model),
        reward_funcs=reward,
        args=cfg,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[Clock()],
    )
    start = time.time() - t0
    trainer.train()
    return {
        "system": f"TRL GRPOTrainer (in-process{', bf16' if bf16 else ''})",
        "steps": len(stamps),
        "wall_s": round(time.time() - t0, 1),
        "steps_per_s": round((len(stamps) - 1) / (stamps[-1] - stamps[0]), 3),
        "startup_s": round(start, 1),
    }


def measure(model: Path, real: bool, steps: int, args: argparse.Namespace, port: int) -> list[dict]:
    """TRL (unless ``--skip-trl``) and agentgym's runs on ``model``, each result labelled with it."""
    out = args.out / model.name
    out.mkdir(parents=True, exist_ok=True)
    trl = {"max_tokens": 8, "lr": 1e-6} if real else {}
    results = [] if args.skip_trl else [trl_run(model, steps, out, bf16=args.trl_bf16, **trl)]
    for engine in args.engines.split(","):
        for mode in args.modes.split(","):
            results.append(agentgym_run(model, engine, mode, steps, out, port, REAL if real else []))
            port += 2
    for r in results:
        r.update(model=model.name, preset="real" if real else "tiny", steps=steps)
    return results


def print_table(results: list[dict]) -> None:
    """One table per model, each system's steps/s against TRL's on that model."""
    for name in dict.fromkeys(r["model"] for r in results):
        rows = [r for r in results if r["model"] == name]
        ref = next((r["steps_per_s"] for r in rows if r["system"].startswith("TRL") and "error" not in r), None)
        print(f"\n{name} ({rows[0]['preset']} preset, {rows[0]['steps']} steps)")
        print("| system | steps/s | vs TRL | start-up s | per step: wait / train / export s |")
        print("|---|---|---|---|---|")
        for r in rows:
            if "error" in r:
                print(f"| {r['system']} | error: {r['error'][-200:]!r} | | | |")
                continue
            ratio = f"{r['steps_per_s'] / ref:.2f}x" if ref else "-"
            ps = r.get("per_step_s", {})
            parts = " / ".join(f"{ps[k]:.3f}" for k in ("wait", "train", "export")) if ps else "-"
            print(f"| {r['system']} | {r['steps_per_s']:.2f} | {ratio} | {r['startup_s']} | {parts} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="one model (with --real: the instruct-model preset)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--tiny-model", type=Path, help="a small model measured with the tiny preset (--tiny-steps)")
    p.add_argument("--tiny-steps", type=int, default=100)
    p.add_argument("--real-model", type=Path, help="an instruct model measured with the real preset (--real-steps)")
    p.add_argument("--real-steps", type=int, default=8)
    p.add_argument("--engines", default="hf,vllm")
    p.add_argument("--modes", default="sync,async")
    p.add_argument("--skip-trl", action="store_true")
    p.add_argument(
        "--real", action="store_true", help="the instruct-model preset for --model (see the module docstring)"
    )
    p.add_argument("--trl-bf16", action="store_true", help="TRL with bfloat16 autocast")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "step_cost")
    args = p.parse_args()
    plan = [
        (m.resolve(), real, n)
        for m, real, n in (
            (args.model, args.real, args.steps),
            (args.tiny_model, False, args.tiny_steps),
            (args.real_model, True, args.real_steps),
        )
        if m is not None
    ]
    if not plan:
        p.error("no model: give --model, or --tiny-model and/or --real-model")
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    for i, (model, real, steps) in enumerate(plan):
        results += measure(model, real, steps, args, 5800 + 40 * i)
    load = os.getloadavg()
    (args.out / "step_cost.json").write_text(json.dumps({"load": load, "results": results}, indent=2))
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (compare figures of one invocation only)")
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
