"""Held-out success curves of short in-process training runs: the fast loop for tuning the learner.

    python bench/learn_curve.py --config configs/quickstart.toml --seeds 0,1,2 --steps 150 \
        --eval-every 25 --tag base [-o learner.lr=1e-3 ...] [--out runs/curves] [--plot]

The loop is tests/test_algorithms_learn.py's, without sockets: the transformers reference engine
(actors/engines/hf_engine.py, one sampling seed per request) plays groups with the actor's rollout code
on a real EnvPool, the learner's ``Trainer.train_step`` trains on each batch, and the new weights
go into the engine before the next batch. It is synchronous (staleness 0, and the engine is the
learner's own float32 model, so π_prox/μ = 1): what it measures is the optimisation itself
(learning rate, clip, loss), not the off-policy correction. ``--overlap`` plays the next batch
while the trainer steps on this one (every batch one version stale, as with actors beside a
learner; still the same run every time). Held-out success is measured every
``--eval-every`` steps on ``--eval-tasks`` test tasks x 4 samples at the step's turn limit.

Writes ``OUT/TAG/seed<S>.json`` (the config overrides, the held-out curve, every step's metrics,
the decoded actions of the first episode of each held-out task at each evaluation: ``plays``)
and, with ``--plot``, ``OUT/TAG.png``. ``bench/plot_curves.py`` plots several tags together.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from task_overlap import train_task_ids  # noqa: E402

from agentgym.actors.engines.engine import Generation, SamplingSpec  # noqa: E402
from agentgym.actors.engines.hf_engine import HfEngine  # noqa: E402
from agentgym.actors.play.rollout import play_episode  # noqa: E402
from agentgym.config import Config, load_config  # noqa: E402
from agentgym.envpool.pool import EnvPool  # noqa: E402
from agentgym.learner.control.actor_control import rollout_spec  # noqa: E402
from agentgym.learner.training.trainer import Trainer  # noqa: E402
from agentgym.protocol import Rollout, RolloutSpec, Ticket  # noqa: E402

EVAL_EPISODES = 4

LOOP_OVERRIDES = ('learner.device="cpu"', "learner.threads=0")
"""Config overrides of every run of this loop (and of bench/results.py's and scaling_inter.py's):
the CPU, and torch's own thread count for the trainer. The loop samples and trains in turn, so the
trainer has the machine to itself while it trains, where ``agentgym train``'s learner shares the
cores with the actors' engines (the row configs' ``learner.threads = 1``): on 2 cores, a maze5
step's training took 5-7 s instead of 7-10 (docs/results-log.md, 2026-12-01)."""


class RequestSeeded:
    """Any engine with one sampling seed per request (group/episode/turn), so that concurrent
    episodes sample the same tokens in every run whatever order they reach it in."""

    def __init__(self, engine: object, seed: int) -> None:
        self.engine, self.seed = engine, seed

    async def generate(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        seed = zlib.crc32(f"{self.seed}:{request_id}".encode())
        return await self.engine.generate(request_id, prompt_ids, replace(spec, seed=seed))  # type: ignore[attr-defined]  # the wrapped engine's, typed object here

    def __getattr__(self, name: str) -> object:
        return getattr(self.engine, name)


def RequestSeededEngine(model_dir: Path | str, seed: int) -> RequestSeeded:  # noqa: N802 (reads as the class it was)
    """The reference engine (actors/engines/hf_engine.py), seeded per request."""
    return RequestSeeded(HfEngine(Path(model_dir), seed=seed), seed)


def make_bench_engine(cfg: Config, kind: str) -> object:
    """``hf``: the reference engine, one request at a time, exact float32 logprobs (π_prox/μ = 1).
    ``vllm``: the actors' vLLM engine (batched; its logprobs differ from the learner's by float noise)."""
    if kind == "hf":
        return RequestSeededEngine(cfg.model.path, seed=cfg.run.seed)
    from agentgym.actors.engines.builders import make_engine

    if cfg.actor.engine != kind:
        raise ValueError(f"--engine {kind} needs actor.engine = {kind!r} in the config (main() sets it)")
    return RequestSeeded(make_engine(cfg, Path(cfg.model.path)), cfg.run.seed)


async def play_groups(
    engine: object,
    tokenizer: object,
    pool: EnvPool,
    spec: RolloutSpec,
    tickets: list[Ticket],
    episodes: int,
    turn_limit: int,
) -> list[Rollout]:
    """``episodes`` episodes of each ticket, all at once, as actors play them."""

    async def group(t: Ticket) -> Rollout:
        eps = await asyncio.gather(
            *(play_episode(engine, tokenizer, pool, t, i, spec, turn_limit) for i in range(episodes))
        )
        return Rollout(group_id=t.group_id, actor_id="bench", env=t.env, task_id=t.task_id, episodes=list(eps))

    return list(await asyncio.gather(*(group(t) for t in tickets)))


def _first_episodes_played(tokenizer: Any, groups: list[Rollout]) -> list[str]:
    """What the policy plays: the agent's tokens (the guesses) of each group's first episode, decoded."""
    return [
        tokenizer.decode(np.frombuffer(e.token_ids, np.int32)[np.frombuffer(e.loss_mask, np.uint8) != 0])
        for e in (g.episodes[0] for g in groups)
    ]


async def train_curve(
    cfg: Config,
    eval_every: int,
    eval_tasks: int,
    eval_turn_limit: int | None = None,
    log: bool = True,
    partial: Path | None = None,
    max_wall_s: float | None = None,
    engine_kind: str = "hf",
    overlap: bool = False,
) -> dict:
    """Train ``cfg.run.max_steps`` steps; held-out success at step 0, every ``eval_every`` and at the end.

    ``eval_turn_limit``: evaluate at this turn limit (None: the schedule's limit at that step).
    ``partial``: after each evaluation the curve so far is written there (a run cut short keeps it).
    ``max_wall_s``: stop training once this much wall time has passed, then evaluate (the
    result's ``steps`` says how many steps were taken).
    ``overlap``: play the next batch while the trainer steps on this one (in a thread), as the
    actors do beside the learner: every batch is then one version stale (trained at version v + 1,
    played at v; the trainer's importance weights correct it) and the weights change only between
    batches, so a run still repeats exactly. Without it the loop plays, then trains (staleness 0).
    It measures the off-policy correction, not speed: on 2 cores it is no faster (10 maze5 steps
    took 126 s either way; the step's training slowed from 3.2-4.0 s to 5.6-8.7 s beside the
    sampling, which already keeps both cores busy; docs/results-log.md, 2026-12-02)."""
    from transformers import AutoTokenizer

    # SIGTERM unwinds like Ctrl-C, through the finally below: a vLLM engine's processes are closed
    # with the run instead of being left spinning (bench/results.py and scaling_inter.py too).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    env = cfg.env.specs[0]
    spec = rollout_spec(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    trainer = Trainer.load(cfg)
    engine = make_bench_engine(cfg, engine_kind)
    pool = EnvPool(env.name, dict(env.kwargs), 8)
    held_out = [Ticket(group_id=f"eval:{i}", env=env.name, task_id=i, split="test") for i in range(eval_tasks)]
    curve: list[tuple[int, float]] = []
    plays: list[tuple[int, list[str]]] = []
    metrics: list[dict[str, float]] = []
    t0 = time.time()

    async def evaluate(step: int) -> None:
        limit = eval_turn_limit or cfg.schedule.turn_limit(step)
        groups = await play_groups(engine, tokenizer, pool, spec, held_out, EVAL_EPISODES, limit)
        eps = [e for g in groups for e in g.episodes]
        curve.append((step, sum(e.success for e in eps) / len(eps)))
        plays.append((step, _first_episodes_played(tokenizer, groups)))
        if partial is not None:
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps({"curve": curve, "metrics": metrics, "plays": plays, "partial": True}))
        if log:
            m = metrics[-1] if metrics else {}
            print(
                f"  step {step:4d} held_out {curve[-1][1]:.3f} train {m.get('success_rate', float('nan')):.3f} "
                f"entropy {m.get('entropy', float('nan')):.2f} t {time.time() - t0:.0f}s",
                flush=True,
            )

    playing: asyncio.Future | None = None  # the batch being played
    await engine.start()
    await pool.start()
    try:
        await evaluate(0)
        draw = random.Random(cfg.run.seed)

        def play(step: int) -> asyncio.Future:
            # bench/task_overlap.py replays these draws to find the held-out tasks also trained on.
            tickets = [
                Ticket(group_id=f"train:{step}:{g}", env=env.name, task_id=task)
                for g, task in enumerate(train_task_ids(env, cfg.learner.batch_groups, draw))
            ]
            return asyncio.ensure_future(
                play_groups(engine, tokenizer, pool, spec, tickets, spec.group_size, cfg.schedule.turn_limit(step))
            )

        playing = play(0)
        for step in range(cfg.run.max_steps):
            rollouts = await playing
            if overlap and step + 1 < cfg.run.max_steps:
                playing = play(step + 1)  # at the weights the batch being trained was played with
                metrics.append(await asyncio.to_thread(trainer.train_step, rollouts))
                await asyncio.wait([playing])  # the weights change only between batches
            else:
                metrics.append(trainer.train_step(rollouts))
            await engine.update_weights({k: v.detach() for k, v in trainer.model.state_dict().items()}, trainer.version)
            out_of_time = max_wall_s is not None and time.time() - t0 > max_wall_s
            if (step + 1) % eval_every == 0 or step + 1 == cfg.run.max_steps or out_of_time:
                await evaluate(step + 1)
            if out_of_time:
                break
            if not overlap and step + 1 < cfg.run.max_steps:
                playing = play(step + 1)
    finally:
        if playing is not None and not playing.done():  # a batch played ahead that no step will train (out of time)
            playing.cancel()
            await asyncio.gather(playing, return_exceptions=True)
        await pool.close()
        await engine.close()
        trainer.close()
    return {"curve": curve, "metrics": metrics, "plays": plays, "wall_s": time.time() - t0, "steps": len(metrics)}


async def zero_shot(cfg: Config, eval_tasks: int, turn_limit: int, engine_kind: str = "hf") -> dict:
    """Held-out success of ``cfg.model.path`` as it is (no training), the way ``train_curve``
    measures its step 0: the first ``eval_tasks`` test tasks, ``EVAL_EPISODES`` each, at
    ``turn_limit``, sampled at the config's temperature. No trainer is loaded."""
    from transformers import AutoTokenizer

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    env = cfg.env.specs[0]
    spec = rollout_spec(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    engine = make_bench_engine(cfg, engine_kind)
    pool = EnvPool(env.name, dict(env.kwargs), 8)
    held_out = [Ticket(group_id=f"eval:{i}", env=env.name, task_id=i, split="test") for i in range(eval_tasks)]
    t0 = time.time()
    await engine.start()
    await pool.start()
    try:
        groups = await play_groups(engine, tokenizer, pool, spec, held_out, EVAL_EPISODES, turn_limit)
    finally:
        await pool.close()
        await engine.close()
    eps = [e for g in groups for e in g.episodes]
    return {
        "success": sum(e.success for e in eps) / len(eps),
        "episodes": len(eps),
        "mean_turns": sum(len(e.turn_ends) // 4 for e in eps) / len(eps),  # int32 turn ends
        "turn_limit": turn_limit,
        "wall_s": round(time.time() - t0, 1),
        "engine": engine_kind,
        "plays": _first_episodes_played(tokenizer, groups),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=REPO / "configs" / "quickstart.toml")
    p.add_argument("--seeds", default="0")
    p.add_argument("--steps", type=int, default=None, help="run.max_steps (default: the config's)")
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--eval-tasks", type=int, default=32)
    p.add_argument("--eval-turn-limit", type=int, default=None)
    p.add_argument("-o", "--override", action="append", default=[])
    p.add_argument("--tag", default="run")
    p.add_argument(
        "--engine",
        choices=("hf", "vllm"),
        default="hf",
        help="hf: the reference engine, exact logprobs, one request at a time; vllm: batched",
    )
    p.add_argument(
        "--overlap", action="store_true", help="play the next batch while the trainer steps (one version stale)"
    )
    p.add_argument("--out", type=Path, default=REPO / "runs" / "curves")
    p.add_argument("--plot", action="store_true")
    args = p.parse_args()
    from agentgym.models.tiny import make_default_tiny_model

    for seed in [int(s) for s in args.seeds.split(",")]:
        overrides = [
            f"run.seed={seed}",
            *LOOP_OVERRIDES,
            "model.create_tiny=false",
            f'actor.engine="{args.engine}"',
            *args.override,
        ]
        if args.steps is not None:
            overrides.append(f"run.max_steps={args.steps}")
        cfg = load_config(args.config, overrides)
        if not Path(cfg.model.path, "config.json").exists():
            make_default_tiny_model(Path(cfg.model.path), seed=0)
        print(f"[{args.tag} seed {seed}] {' '.join(args.override)}", flush=True)
        out = args.out / args.tag
        res = asyncio.run(
            train_curve(
                cfg,
                args.eval_every,
                args.eval_tasks,
                args.eval_turn_limit,
                partial=out / f"seed{seed}.json",
                engine_kind=args.engine,
                overlap=args.overlap,
            )
        )
        res.update(config=str(args.config), overrides=overrides, seed=seed, overlap=args.overlap)
        (out / f"seed{seed}.json").write_text(json.dumps(res))
    if args.plot:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from plot_curves import plot

        plot([args.out / args.tag], args.out / f"{args.tag}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
