"""``agentgym eval``: evaluate a checkpoint, an HF model or a remote endpoint on held-out tasks.

    agentgym eval --model runs/quickstart/checkpoints/step_000100 --env guess_number --tasks 32 -k 4
    agentgym eval --model runs/quickstart --engine vllm --temperature 0 -k 1      # latest checkpoint
    agentgym eval --model models/tiny --engine remote --url http://host:8000 --served-model tiny
    agentgym eval --model runs/quickstart --critic -o critic.kind=\"oracle\" -o critic.when=\"every_turn\"

A run directory (or a checkpoint in it) brings its ``config.toml``: the evaluation plays with
the token budgets, env options, sampling and engine the run trained with, unless ``--config``
is given; flags and ``-o`` override it, with a warning for each setting that then differs from
training (a model trained to answer in one token scores nothing when given eight).

No learner is started: the command loads one engine, starts one env pool per env and plays
``tasks`` tasks of ``split`` ``k`` times each with the rollout code actors use
(actors/play/rollout.py). It prints a table (avg@k, pass@k per env; agentgym/observe/eval_metrics.py defines them)
and writes the report as JSON (``--out``, default stdout's table only). Every request is seeded
from (seed, env, task, sample, turn), so the same command gives the same numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from agentgym.cli.args import add_config_args, resolve_config
from agentgym.observe.eval_metrics import episode_seed, summarize


def add_parser(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser(
        "eval",
        help="evaluate a checkpoint or model on held-out tasks (avg@k, pass@k)",
        description="Play TASKS held-out tasks of each env K times with one engine (no learner) and report "
        "avg@k and pass@k per env. Greedy with --temperature 0. Seeded per request: the same command gives "
        "the same numbers. Env options, token budgets and the engine come from the config: the run's own "
        "config.toml when --model is a run (or one of its checkpoints), else --config or the defaults.",
    )
    add_config_args(e)
    e.add_argument(
        "--model",
        type=Path,
        required=True,
        help="HF model directory, a checkpoint directory, or a run directory (its latest checkpoint, and "
        "its config.toml unless --config is given); a hub id ORG/NAME in the local Hugging Face cache; "
        "with --engine remote: the tokenizer's directory",
    )
    e.add_argument("--engine", choices=["hf", "vllm", "remote"], help="overrides actor.engine")
    e.add_argument("--url", help="OpenAI-compatible server (with --engine remote)")
    e.add_argument("--served-model", default="", help="model name the remote server serves")
    e.add_argument(
        "--env", action="append", default=[], help="env to evaluate, repeatable (default: the config's envs)"
    )
    e.add_argument("--split", choices=["test", "dev"], help="held-out split (default: eval.split)")
    e.add_argument("--tasks", type=int, help="tasks per env (default: eval.tasks)")
    e.add_argument("-k", type=int, default=1, help="samples per task (pass@k, avg@k)")
    e.add_argument("--temperature", type=float, help="0: greedy (default: rollout.temperature)")
    e.add_argument("--seed", type=int, help="base seed of every request (default: run.seed)")
    e.add_argument(
        "--turn-limit",
        type=int,
        help="turns per episode (default: the schedule's limit at the "
        "checkpoint's step, as the run's own evaluation played it; for other models its last limit)",
    )
    e.add_argument("--concurrency", type=int, default=8, help="episodes played at once")
    e.add_argument("--out", type=Path, help="write the JSON report here")
    e.add_argument(
        "--critic",
        action="store_true",
        help="play with the config's [critic] (kind, when, max_revisions; set them with -o critic.KEY=...) "
        "on every episode; without it the agent plays alone",
    )


def resolve_model(path: Path) -> Path:
    """An HF directory as given; a checkpoint root or a run directory: its newest checkpoint;
    otherwise the model rule every command follows (a hub id in the local Hugging Face cache,
    agentgym/config/model_path.py), whose ``ModelNotFound`` says how to download the model."""
    if (path / "config.json").is_file():
        return path
    from agentgym.config.model_path import ModelNotFound, find_model
    from agentgym.learner.training.checkpoint import latest_checkpoint

    for root in (path, path / "checkpoints"):
        if root.is_dir():
            found = latest_checkpoint(root)
            if found is not None:
                return found
    if path.is_dir():
        raise ModelNotFound(
            f"--model {path}: no config.json there and no checkpoint under it or {path / 'checkpoints'}"
        )
    return find_model(path, "--model")


def trained_config(model: Path) -> Path | None:
    """The ``config.toml`` of the run that made ``model``: a run directory, its ``checkpoints``
    folder or one checkpoint in it; None for a model that no run of this machine trained."""
    candidates = [model / "config.toml"]
    if model.name == "checkpoints":
        candidates.append(model.parent / "config.toml")
    if model.parent.name == "checkpoints":
        candidates.append(model.parent.parent / "config.toml")
    return next((c for c in candidates if c.is_file()), None)


def checkpoint_step(model: Path) -> int | None:
    """The optimizer step of a checkpoint directory (``step_000150``), None for any other model."""
    m = re.fullmatch(r"step_(\d+)", model.name)
    return int(m.group(1)) if m else None


def turn_limit_at(cfg, env: str, step: int | None) -> int:
    """The turn limit ``env`` had at ``step`` of a run with ``cfg`` (its last stage when the step
    is unknown or the stages advance by success): what the learner's own evaluation played."""
    sch = cfg.schedule.for_env(env)
    return sch.turn_limit(step) if step is not None and not sch.by_success else sch.final_limit


def trained_differences(
    cfg, trained, envs: list[str], temperature: float, turn_limit: int, step: int | None = None
) -> list[str]:
    """What this evaluation plays differently from how the model was trained (``trained``, up to
    ``step``): the rollout settings, the sampling temperature, the turn limit, the envs' options."""
    out = [
        f"rollout.{k} = {v!r} (trained with {getattr(trained.rollout, k)!r})"
        for k, v in cfg.rollout.model_dump().items()
        if k != "temperature" and v != getattr(trained.rollout, k)
    ]
    if temperature != trained.rollout.temperature:
        out.append(f"temperature {temperature} (trained with rollout.temperature = {trained.rollout.temperature})")
    ours = {e.name: e.kwargs for e in cfg.env.specs}
    theirs = {e.name: e for e in trained.env.specs}
    for env in envs:
        if env in theirs:
            last = turn_limit_at(trained, env, step)
            if turn_limit != last:
                out.append(f"turn limit {turn_limit} on {env} (trained with {last} turns)")
            if ours.get(env, {}) != theirs[env].kwargs:
                out.append(f"{env} options {ours.get(env, {})} (trained with {theirs[env].kwargs})")
    return out


def run(args: argparse.Namespace) -> int:
    from agentgym.observe.logs import setup_logging

    # Console at warning unless asked: the progress lines below are what a user reads.
    setup_logging("eval", None, args.log_level if args.log_level != "info" else "warning")
    flags = [f'actor.engine="{args.engine}"'] if args.engine else []
    if args.url:
        flags += [f'actor.remote.url="{args.url}"', f'actor.remote.model="{args.served_model}"']
    trained_path = trained_config(args.model)
    if args.config is None and trained_path is not None:
        args.config = trained_path  # play as the run played: its token budgets, env options, engine
        print(f"eval: settings from {trained_path} (flags and -o override them)", file=sys.stderr, flush=True)
    cfg = resolve_config(args, flags)
    k = args.k
    tasks = args.tasks if args.tasks is not None else cfg.eval.tasks
    temperature = args.temperature if args.temperature is not None else cfg.rollout.temperature
    problems = [
        m
        for ok, m in (
            (k >= 1, f"-k must be >= 1, got {k}"),
            (tasks >= 1, f"--tasks must be >= 1, got {tasks}"),
            (temperature >= 0, f"--temperature must be >= 0, got {temperature}"),
            (args.concurrency >= 1, f"--concurrency must be >= 1, got {args.concurrency}"),
        )
        if not ok
    ]
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 2
    from agentgym.config.model_path import ModelNotFound
    from agentgym.envpool.registry import UnknownEnvError, env_target

    envs = args.env or [e.name for e in cfg.env.specs]
    try:
        for env in envs:
            env_target(env, "--env")
        model = resolve_model(args.model)
    except (UnknownEnvError, ModelNotFound) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    step = checkpoint_step(model)
    # the limit at the checkpoint's step, else the last stage's (the longest among the envs)
    turn_limit = args.turn_limit or max(turn_limit_at(cfg, e, step) for e in envs)
    if trained_path is not None:
        from agentgym.config import ConfigError, load_config

        try:
            trained = load_config(trained_path)
        except ConfigError:
            trained = None  # a run of an older version: nothing to compare with
        for diff in trained_differences(cfg, trained, envs, temperature, turn_limit, step) if trained else []:
            print(f"eval: warning: {diff}: the model was trained otherwise ({trained_path})", file=sys.stderr)
    report = asyncio.run(_run(cfg, model, envs, args, tasks, k, temperature, turn_limit))
    report["model"] = str(model)
    print(table(report))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        print(f"report: {args.out}")
    return 0


async def _run(
    cfg, model: Path, envs: list[str], args: argparse.Namespace, tasks: int, k: int, temperature: float, turn_limit: int
) -> dict:
    from agentgym.actors.engines.builders import load_tokenizer, make_engine

    seed = args.seed if args.seed is not None else cfg.run.seed
    print(f"eval: starting the {cfg.actor.engine} engine on {model}", file=sys.stderr, flush=True)
    tokenizer = await asyncio.to_thread(load_tokenizer, model)
    engine = make_engine(cfg, model)
    await engine.start()
    print(f"eval: engine ready; {len(envs)} env(s) x {tasks} tasks x k={k}", file=sys.stderr, flush=True)
    try:
        return await evaluate(
            engine,
            tokenizer,
            cfg,
            envs,
            split=args.split or cfg.eval.split,
            tasks=tasks,
            k=k,
            temperature=temperature,
            seed=seed,
            turn_limit=turn_limit,
            concurrency=args.concurrency,
            critic=args.critic,
        )
    finally:
        await engine.close()


async def evaluate(
    engine: Any,
    tokenizer: Any,
    cfg: Any,
    envs: Sequence[str],
    *,
    split: Literal["test", "dev"],
    tasks: int,
    k: int,
    temperature: float,
    seed: int,
    turn_limit: int,
    concurrency: int = 8,
    progress: bool = True,
    critic: bool = False,
) -> dict[str, Any]:
    """Play ``tasks`` tasks of ``split`` of every env ``k`` times each; the report ``agentgym eval``
    prints. ``cfg`` supplies the env options and the rollout's token budgets. ``critic``: play
    with the config's ``[critic]`` (kind, when, rounds) on every episode, held-out ones included;
    without it the agent plays alone, whatever ``critic.enabled`` says."""
    from agentgym.actors.play.critic import shared_critic
    from agentgym.actors.play.rollout import play_episode
    from agentgym.envpool.pool import EnvPool
    from agentgym.learner.control.actor_control import critic_spec, rollout_spec
    from agentgym.protocol import Ticket
    from agentgym.protocol.arrays import I32, unpack

    spec = msgspec.structs.replace(rollout_spec(cfg), temperature=temperature, critic=None)
    judge = None
    if critic:
        cs = msgspec.structs.replace(critic_spec(cfg), at_eval=True)
        spec = msgspec.structs.replace(spec, critic=cs)
        judge = await shared_critic(cs, engine, tokenizer, seed)
    if temperature == 0:
        spec = msgspec.structs.replace(spec, top_p=1.0)
    kwargs = {e.name: dict(e.kwargs) for e in cfg.env.specs}
    total = len(envs) * tasks * k
    done = 0
    t0 = time.monotonic()
    gate = asyncio.Semaphore(concurrency)
    results: dict[str, list[list[bool]]] = {e: [[False] * k for _ in range(tasks)] for e in envs}
    failures: dict[str, int] = dict.fromkeys(envs, 0)
    episodes: list[dict[str, Any]] = []

    async def one(pool: EnvPool, env: str, task: int, sample: int) -> None:
        nonlocal done
        async with gate:
            ticket = Ticket(group_id=f"eval:{env}:{task}", env=env, task_id=task, min_version=0, split=split)
            ep = await play_episode(
                engine,
                tokenizer,
                pool,
                ticket,
                sample,
                spec,
                turn_limit,
                seed=episode_seed(seed, env, task, sample),
                critic=judge,
            )
        results[env][task][sample] = bool(ep.success)
        failures[env] += ep.finish == "env_failure"
        episodes.append(
            {
                "env": env,
                "task": task,
                "sample": sample,
                "success": bool(ep.success),
                "reward": float(ep.reward),
                "finish": ep.finish,
                "critiques": int(unpack(ep.critiques, I32).size // 2),
            }
        )
        done += 1
        if progress and (done == total or done % max(1, total // 20) == 0):
            rate = done / max(time.monotonic() - t0, 1e-9)
            print(f"eval: {done}/{total} episodes, {(total - done) / rate:.0f}s left", file=sys.stderr, flush=True)

    for env in envs:
        pool = EnvPool(
            env, kwargs.get(env, {}), max(1, min(concurrency, tasks * k)), step_timeout_s=cfg.actor.step_timeout_s
        )
        async with pool:
            await asyncio.gather(*(one(pool, env, t, s) for t in range(tasks) for s in range(k)))
    per_env = summarize(results, k)
    for env, row in per_env.items():
        row["env_failures"] = failures[env]
    episodes.sort(key=lambda e: (e["env"], e["task"], e["sample"]))
    return {
        "split": split,
        "tasks": tasks,
        "k": k,
        "temperature": temperature,
        "seed": seed,
        "turn_limit": turn_limit,
        "envs": per_env,
        "episodes": episodes,
        "critic": f"{spec.critic.kind} {spec.critic.when}" if spec.critic else None,
        "seconds": round(time.monotonic() - t0, 2),
    }


def table(report: dict[str, Any]) -> str:
    """The per-env numbers as a fixed-width text table."""
    k = report["k"]
    head = f"{'env':<20} {'tasks':>6} {'samples':>8} {f'avg@{k}':>8} {f'pass@{k}':>8} {'env_fail':>8}"
    rows = [head, "-" * len(head)]
    for env, r in report["envs"].items():
        rows.append(
            f"{env:<20} {r['tasks']:>6} {r['samples']:>8} {r[f'avg@{k}']:>8.3f} "
            f"{r[f'pass@{k}']:>8.3f} {r['env_failures']:>8}"
        )
    if report.get("critic"):
        n = sum(e.get("critiques", 0) for e in report["episodes"])
        rows.append(f"with the critic ({report['critic']}): {n} critiques over {len(report['episodes'])} episodes")
    return "\n".join(rows)
