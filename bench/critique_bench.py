"""Critique in the loop, measured (figures in docs/critique.md).

    python bench/critique_bench.py --out OUT [--episodes 24] [--train-steps 20] [--seeds 1]

1. Test time, equal samples: the same number of episodes (same tasks, same sampling seeds,
   same turn limit) played by the tiny model alone, with the oracle critic (every_turn,
   after_failure, episode_end) and with an LM critic (the policy's own engine, for the plumbing);
   success rate, episodes/s and sampled agent tokens per episode. The throughput cost of a
   critic is the episodes/s ratio against the plain run, measured in the same process.
2. Training, equal steps: ``agentgym train`` (the quickstart config; learner + one hf actor) without and
   with the oracle critic in the loop, then held-out success on the test split, evaluated
   without the critic (``critic.at_eval = false``).

Writes OUT/critique.json and prints a markdown table. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import numpy as np

REPO = Path(__file__).resolve().parents[1]


async def _play(
    model_dir: Path,
    tok,
    env: str,
    critic_spec,
    episodes: int,
    turn_limit: int,
    max_tokens: int = 4,
    split: str = "train",
) -> dict:
    from agentgym.actors.engines.hf_engine import HfEngine
    from agentgym.actors.play.critic import shared_critic
    from agentgym.actors.play.rollout import play_episode
    from agentgym.envpool.pool import EnvPool
    from agentgym.protocol import RolloutSpec, Ticket
    from agentgym.protocol.arrays import I32, U8, unpack

    if critic_spec is not None and split != "train":
        critic_spec = msgspec.structs.replace(critic_spec, at_eval=True)  # held-out tasks: the critic speaks too
    spec = RolloutSpec(
        group_size=1,
        max_tokens_per_turn=max_tokens,
        max_episode_tokens=512,
        temperature=1.0,
        top_p=1.0,
        critic=critic_spec,
    )
    engine = HfEngine(model_dir, seed=0)
    pool = EnvPool(env, {}, 4)
    await engine.start()
    await pool.start()
    try:
        critic = await shared_critic(critic_spec, engine, tok)
        t0 = time.perf_counter()
        eps = []
        for start in range(0, episodes, 4):  # 4 at a time, as an actor plays a group
            eps += await asyncio.gather(
                *(
                    play_episode(
                        engine,
                        tok,
                        pool,
                        Ticket(group_id=f"g{k}", env=env, task_id=k, split=split),
                        0,
                        spec,
                        turn_limit,
                        seed=k,
                        critic=critic,
                    )
                    for k in range(start, min(start + 4, episodes))
                )
            )
        dt = time.perf_counter() - t0
    finally:
        await pool.close()
        await engine.close()
    return {
        "episodes": len(eps),
        "success_rate": float(np.mean([e.success for e in eps])),
        "episodes_per_s": len(eps) / dt,
        "agent_tokens_per_episode": float(np.mean([unpack(e.loss_mask, U8).sum() for e in eps])),
        "critiques_per_episode": float(np.mean([unpack(e.critiques, I32).size // 2 for e in eps])),
    }


def test_time(
    model_dir: Path,
    episodes: int,
    turn_limit: int,
    envs: tuple[str, ...] = ("guess_number", "maze"),
    arms: list[str] | None = None,
    max_tokens: int = 4,
    split: str = "train",
) -> list[dict]:
    from transformers import AutoTokenizer

    from agentgym.protocol import CriticSpec

    tok = AutoTokenizer.from_pretrained(model_dir)
    every = [
        ("none", None),
        ("oracle every_turn x2", CriticSpec(kind="oracle", when="every_turn", max_revisions=2)),
        ("oracle after_failure", CriticSpec(kind="oracle", when="after_failure")),
        ("oracle episode_end x1", CriticSpec(kind="oracle", when="episode_end", max_revisions=1)),
        ("lm (policy) after_failure", CriticSpec(kind="lm", engine="policy", when="after_failure", max_tokens=8)),
    ]
    rows = []
    for env in envs:
        for name, spec in (a for a in every if arms is None or a[0] in arms):
            r = asyncio.run(_play(model_dir, tok, env, spec, episodes, turn_limit, max_tokens, split))
            rows.append({"env": env, "critic": name, **r})
            print(f"test_time env={env} critic={name} {json.dumps(r)}", flush=True)
    return rows


def train(model_dir: Path, out: Path, steps: int, seed: int, critic: bool) -> dict:
    run_dir = out / f"train_{'critic' if critic else 'plain'}_s{seed}"
    from agentgym.host.netutil import free_port_pair

    args = [
        "train",
        "--config",
        str(REPO / "configs" / "quickstart.toml"),
        "--run-dir",
        str(run_dir),
        "--actors",
        "1",
        "--max-steps",
        str(steps),
        "-o",
        f'learner.bind="tcp://127.0.0.1:{free_port_pair()}"',
        "-o",
        f'model.path="{model_dir}"',
        "-o",
        "model.create_tiny=false",
        "-o",
        'actor.engine="hf"',
        "-o",
        f"run.seed={seed}",
        "-o",
        "eval.at_start=false",
        "-o",
        "eval.every=0",
        "-o",
        "eval.at_end=true",
        "-o",
        "eval.tasks=16",
    ]  # the quickstart's batch (8 groups of 8): smaller ones collapse at its lr
    if critic:
        args += ["-o", "critic.enabled=true", "-o", 'critic.kind="oracle"', "-o", 'critic.when="every_turn"']
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", *args],
        text=True,
        capture_output=True,
        cwd=out,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"train failed ({proc.returncode}): {proc.stderr[-2000:]}")
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines()]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"))
    return {
        "critic": critic,
        "seed": seed,
        "steps": steps,
        "seconds": time.perf_counter() - t0,
        "checkpoint": str(ckpts[-1]) if ckpts else None,
        "train_success_last5": float(np.mean([m["success_rate"] for m in metrics[-5:]])),
        "heldout_success": evals[-1]["success_rate"],
        "heldout_episodes": evals[-1]["episodes"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--episodes", type=int, default=24, help="test-time episodes on the untrained model (0: skip)")
    p.add_argument("--turn-limit", type=int, default=4)
    p.add_argument("--train-steps", type=int, default=20)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument(
        "--trained-episodes",
        type=int,
        default=64,
        help="test-time episodes on each trained policy, with and without the oracle (0: skip)",
    )
    a = p.parse_args()
    from agentgym.models.tiny import make_default_tiny_model

    a.out.mkdir(parents=True, exist_ok=True)
    model_dir = make_default_tiny_model(a.out / "tiny", seed=0)
    result: dict = {"test_time": test_time(model_dir, a.episodes, a.turn_limit) if a.episodes else [], "train": []}
    (a.out / "critique.json").write_text(json.dumps(result, indent=1))
    for seed in range(a.seeds):
        for critic in (False, True):
            if a.train_steps:
                r = train(model_dir, a.out, a.train_steps, seed, critic)
                print(f"train {json.dumps(r)}", flush=True)
                if a.trained_episodes and r["checkpoint"]:
                    # Does a policy trained with critiques in its context use them at test time?
                    r["test_time"] = test_time(
                        Path(r["checkpoint"]),
                        a.trained_episodes,
                        a.turn_limit,
                        ("guess_number",),
                        ["none", "oracle every_turn x2"],
                        max_tokens=1,
                        split="test",
                    )  # one token per turn, as trained
                result["train"].append(r)
                (a.out / "critique.json").write_text(json.dumps(result, indent=1))
    print("| env | critic | success | episodes/s (ratio to none) | agent tokens/ep | critiques/ep |")
    print("|---|---|---|---|---|---|")
    base = {r["env"]: r["episodes_per_s"] for r in result["test_time"] if r["critic"] == "none"}
    for r in result["test_time"]:
        print(
            f"| {r['env']} | {r['critic']} | {r['success_rate']:.3f} | {r['episodes_per_s']:.2f} "
            f"({r['episodes_per_s'] / base[r['env']]:.2f}) | {r['agent_tokens_per_episode']:.1f} | {r['critiques_per_episode']:.2f} |"
        )
    for r in result["train"]:
        tt = " ".join(f"test-time[{x['critic']}]={x['success_rate']:.3f}" for x in r.get("test_time", []))
        print(
            f"train critic={r['critic']} seed={r['seed']} steps={r['steps']} held-out success {r['heldout_success']:.3f} "
            f"(last-5-step train success {r['train_success_last5']:.3f}) {tt}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
