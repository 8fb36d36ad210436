"""A real model shape trains a few steps end to end on this CPU: LoRA or full fine-tuning.

    .venv/bin/python bench/real_train.py --arch qwen2.5-1.5b --rank 8
    .venv/bin/python bench/real_train.py --arch qwen2.5-0.5b --rank 0

What runs: ``agentgym train`` (the launcher) with one learner and one vLLM-CPU actor over ZeroMQ,
on guess_number, with a randomly initialised model of the named architecture's exact shape
(``agentgym make-model --arch``: Qwen2.5-0.5B/1.5B, Llama-3.2-1B) and the project's own
tokenizer, in bfloat16. ``--rank R`` trains LoRA adapters of rank R (``learner.lora``: each
version ships the adapter); ``--rank 0`` fine-tunes every parameter (each version ships the
whole model in bf16). Full AdamW state for 1.5B parameters (weights + gradients + two moments,
~25 GB in float32) does not fit this 24 GiB machine; LoRA's does, and 0.5B's full state does.

Measured, from the run's own logs (docs/benchmarks.md, "Real shapes end to end"):
- update bytes: what each version ships (the actor's ``weights_updated.mib``) against a full
  update of the same model in bfloat16 (and float32), counted from its parameters;
- weight sync: learner export + actor fetch + engine load (the learner's ``adapter_exported``
  seconds or the step's ``learner_export_s``, + ``weights_updated.fetch_s`` + ``load_s``), and
  the engine's pause inside it (``engine_weights_loaded.drain_s + load_s``), against the
  learner's step time (``train_time_s``);
- peak RSS of the learner process and of the actor's process tree (the vLLM engine core
  included), sampled every 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _tree_rss(p) -> int:  # noqa: ANN001
    import psutil

    total = 0
    for q in [p, *p.children(recursive=True)]:
        try:
            total += q.memory_info().rss
        except psutil.Error:
            pass
    return total


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def _train_cmd(run_dir: Path, port: int, model: Path, args: argparse.Namespace) -> list[str]:
    """``agentgym train`` with one actor on quickstart's config, small enough for ``model`` on one GPU."""
    cmd = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "train",
        "--config",
        str(REPO / "configs" / "quickstart.toml"),
        "--run-dir",
        str(run_dir),
        "--actors",
        "1",
        "--max-steps",
        str(args.steps),
        "-o",
        f'learner.bind="tcp://127.0.0.1:{port}"',
        "-o",
        f'model.path="{model}"',
        "-o",
        "model.create_tiny=false",
        "-o",
        'model.dtype="bfloat16"',
        "-o",
        f"learner.lora.rank={args.rank}",
        "-o",
        f"learner.lora.alpha={2 * max(args.rank, 1)}",
        "-o",
        f"learner.lr={1e-4 if args.rank else 1e-5}",
        "-o",
        "learner.batch_groups=1",
        "-o",
        "rollout.group_size=2",
        "-o",
        "rollout.max_episode_tokens=160",
        "-o",
        "actor.max_groups=1",
        "-o",
        "actor.kv_cache_gib=0.5",
        "-o",
        "schedule.turn_limits=[[0, 2]]",
        "-o",
        "eval.at_start=false",
        "-o",
        "eval.at_end=false",
        "-o",
        "learner.threads=2",
    ]
    return cmd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="qwen2.5-1.5b", help="a shape of agentgym make-model (default: qwen2.5-1.5b)")
    ap.add_argument("--rank", type=int, default=8, help="LoRA rank; 0 = full fine-tuning (default: 8)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/agentgym_real_train"))
    ap.add_argument("--model-dir", type=Path, default=None, help="default: models/ARCH-shape")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    args.model_dir = args.model_dir or REPO / "models" / f"{args.arch}-shape"
    import psutil

    t0 = time.monotonic()
    from agentgym.models.make import make_model

    model = args.model_dir if (args.model_dir / "config.json").exists() else make_model(args.arch, args.model_dir)
    print(f"model ready in {time.monotonic() - t0:.0f} s: {model}", flush=True)
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), "pt") as f:  # tied embeddings are stored once
        n_params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())

    run_dir = args.out / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    from agentgym.host.netutil import free_port_pair

    port = free_port_pair()
    cmd = _train_cmd(run_dir, port, model, args)
    t_run = time.monotonic()
    console = open(args.out / "launcher.log", "w")  # noqa: SIM115 - closed when the run ends
    launcher = subprocess.Popen(
        cmd, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=console, stderr=subprocess.STDOUT
    )
    me = psutil.Process(launcher.pid)
    peak = {"learner": 0, "actor": 0}
    while launcher.poll() is None:
        for child in me.children():
            try:
                line = " ".join(child.cmdline())
            except psutil.Error:
                continue
            role = "learner" if "agentgym.learner" in line else "actor" if "agentgym.actors" in line else None
            if role:
                rss = child.memory_info().rss if role == "learner" else _tree_rss(child)
                peak[role] = max(peak[role], rss)
        time.sleep(0.5)
    wall = time.monotonic() - t_run
    console.close()
    if launcher.returncode != 0:
        print(f"the run failed (exit {launcher.returncode}); see {args.out / 'launcher.log'}", file=sys.stderr)
        return 1

    learner = _events(run_dir / "logs" / "learner.jsonl")
    (actor_log,) = [p for p in (run_dir / "logs").glob("actor-*.jsonl") if "console" not in p.name]
    actor = _events(actor_log)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [e for e in actor if e.get("event") == "weights_updated"]
    loads = [e for e in actor if e.get("event") == "engine_weights_loaded"]
    started = [e for e in actor if e.get("event") == "engine_started" and e.get("engine") == "vllm"]
    if args.rank:  # version i was the i-th adapter export
        export_s = {i: e["seconds"] for i, e in enumerate(e for e in learner if e.get("event") == "adapter_exported")}
    else:  # step i's record times the export of version i (version 0's, at start, is not timed)
        export_s = {m["step"]: m["learner_export_s"] for m in metrics if "learner_export_s" in m}
    syncs = [export_s.get(u["version"], 0.0) + u["fetch_s"] + u["load_s"] for u in updates]
    pauses = [e["drain_s"] + e["load_s"] for e in loads]
    steps = [m["train_time_s"] for m in metrics]
    update_bytes = round(updates[-1]["mib"] * 2**20)
    what = f"LoRA rank {args.rank}" if args.rank else "full fine-tuning"
    res = {
        "model": f"{args.arch} shape (random init), bfloat16",
        "params": n_params,
        "training": what,
        "steps": len(metrics),
        "update_bytes": update_bytes,
        "full_bytes_bf16": 2 * n_params,
        "full_bytes_fp32": 4 * n_params,
        "update_frac_of_bf16": update_bytes / (2 * n_params),
        "update_frac_of_fp32": update_bytes / (4 * n_params),
        "sync_s": syncs,
        "engine_pause_s": pauses,
        "export_s": list(export_s.values()),
        "step_s": steps,
        "sync_over_step": (sum(syncs) / len(syncs)) / (sum(steps) / len(steps)) if syncs and steps else None,
        "peak_rss_learner_gib": peak["learner"] / 2**30,
        "peak_rss_actor_gib": peak["actor"] / 2**30,
        "engine_start_s": started[0]["seconds"] if started else None,
        "wall_s": wall,
        "rewards": [m["reward_mean"] for m in metrics],
    }
    (args.out / "real_train.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    print(f"""
| model | training | update bytes | full update bf16 | ratio | weight sync (mean) | engine pause (mean) | learner step (mean) | sync / step | peak RSS learner | peak RSS actor (+vLLM) |
|---|---|---|---|---|---|---|---|---|---|---|
| {args.arch} shape, bf16 | {what} | {update_bytes / 2**20:.1f} MiB | {2 * n_params / 2**30:.2f} GiB | {100 * res["update_frac_of_bf16"]:.2f} % | {sum(syncs) / max(len(syncs), 1):.2f} s | {sum(pauses) / max(len(pauses), 1):.3f} s | {sum(steps) / len(steps):.1f} s | {100 * (res["sync_over_step"] or 0):.2f} % | {res["peak_rss_learner_gib"]:.1f} GiB | {res["peak_rss_actor_gib"]:.1f} GiB |""")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
