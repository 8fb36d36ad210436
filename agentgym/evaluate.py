"""Evaluation metrics and the stand-alone evaluation loop behind ``agentgym eval``.

    pass_at_k(n=8, c=3, k=1)                      # unbiased estimator (Chen et al., 2021)
    summarize({"maze": [[True, False], [False, False]]}, k=2)
    report = await evaluate(engine, tokenizer, cfg, envs, split="test", tasks=16, k=4, ...)

Definitions (docs/adr/0015-evaluation.md), the same in ``agentgym eval`` and in the learner's
``eval.jsonl``: a task is played ``n`` times; ``avg@k`` is the mean success over all its samples
(the expected pass@1) and ``pass@k`` is the unbiased estimate of the chance that at least one of
``k`` samples drawn from the ``n`` succeeds, ``1 - C(n-c, k) / C(n, k)``; both are averaged over
tasks. Reproducibility: every episode gets a seed derived from (seed, env, task, sample) only, and
every turn of it ``seed + turn``; engines honour per-request seeds, so the numbers do not depend
on how requests interleave.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from collections.abc import Sequence
from math import comb
from typing import Any

import msgspec
import structlog

log = structlog.get_logger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` succeeded: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def summarize(results: dict[str, Sequence[Sequence[bool]]], k: int) -> dict[str, dict[str, float]]:
    """Per env: tasks, samples, avg@k and pass@k (k <= samples per task) from success per sample,
    ``results[env][task][sample]``. Tasks with fewer than ``k`` samples are an error, not skipped."""
    out: dict[str, dict[str, float]] = {}
    for env, tasks in sorted(results.items()):
        if not tasks:
            raise ValueError(f"summarize: env {env!r} has no tasks")
        short = [i for i, s in enumerate(tasks) if len(s) < k]
        if short:
            raise ValueError(f"summarize: env {env!r} tasks {short[:5]} have fewer than k={k} samples")
        avg = sum(sum(s) / len(s) for s in tasks) / len(tasks)
        pk = sum(pass_at_k(len(s), sum(s), k) for s in tasks) / len(tasks)
        out[env] = {"tasks": len(tasks), "samples": sum(len(s) for s in tasks), f"avg@{k}": avg, f"pass@{k}": pk}
    return out


def summarize_groups(groups: Sequence[Sequence[bool]], k: int) -> dict[str, float]:
    """avg@k and pass@k over groups (one group = one task) for the learner's ``eval.jsonl``;
    groups that lost samples to env failures (fewer than ``k``) are left out."""
    full = [g for g in groups if len(g) >= k]
    return summarize({"all": full}, k)["all"] if full else {}


def episode_seed(seed: int, env: str, task: int, sample: int) -> int:
    """A 31-bit seed from the episode's identity only (vLLM takes a signed 32-bit seed)."""
    h = hashlib.blake2b(f"{seed}:{env}:{task}:{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & 0x3FFF_FFFF  # room for + turn below 2**31


async def evaluate(
    engine: Any,
    tokenizer: Any,
    cfg: Any,
    envs: Sequence[str],
    *,
    split: str,
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
    from agentgym.actors.critic import shared_critic
    from agentgym.actors.rollout import play_episode
    from agentgym.envpool.pool import EnvPool
    from agentgym.learner.control import critic_spec, rollout_spec
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
            ep = await play_episode(engine, tokenizer, pool, ticket, sample, spec, turn_limit,
                                    seed=episode_seed(seed, env, task, sample), critic=judge)  # fmt: skip
        results[env][task][sample] = bool(ep.success)
        failures[env] += ep.finish == "env_failure"
        episodes.append({"env": env, "task": task, "sample": sample, "success": bool(ep.success),
                         "reward": float(ep.reward), "finish": ep.finish,
                         "critiques": int(unpack(ep.critiques, I32).size // 2)})  # fmt: skip
        done += 1
        if progress and (done == total or done % max(1, total // 20) == 0):
            rate = done / max(time.monotonic() - t0, 1e-9)
            print(f"eval: {done}/{total} episodes, {(total - done) / rate:.0f}s left", file=sys.stderr, flush=True)

    for env in envs:
        pool = EnvPool(env, kwargs.get(env, {}), max(1, min(concurrency, tasks * k)),
                       step_timeout_s=cfg.actor.step_timeout_s)  # fmt: skip
        async with pool:
            await asyncio.gather(*(one(pool, env, t, s) for t in range(tasks) for s in range(k)))
    per_env = summarize(results, k)
    for env, row in per_env.items():
        row["env_failures"] = failures[env]
    episodes.sort(key=lambda e: (e["env"], e["task"], e["sample"]))
    return {
        "split": split, "tasks": tasks, "k": k, "temperature": temperature, "seed": seed,
        "turn_limit": turn_limit, "envs": per_env, "episodes": episodes,
        "critic": f"{spec.critic.kind} {spec.critic.when}" if spec.critic else None,
        "seconds": round(time.monotonic() - t0, 2),
    }  # fmt: skip


def table(report: dict[str, Any]) -> str:
    """The per-env numbers as a fixed-width text table."""
    k = report["k"]
    head = f"{'env':<20} {'tasks':>6} {'samples':>8} {f'avg@{k}':>8} {f'pass@{k}':>8} {'env_fail':>8}"
    rows = [head, "-" * len(head)]
    for env, r in report["envs"].items():
        rows.append(f"{env:<20} {r['tasks']:>6} {r['samples']:>8} {r[f'avg@{k}']:>8.3f} "
                    f"{r[f'pass@{k}']:>8.3f} {r['env_failures']:>8}")  # fmt: skip
    if report.get("critic"):
        n = sum(e.get("critiques", 0) for e in report["episodes"])
        rows.append(f"with the critic ({report['critic']}): {n} critiques over {len(report['episodes'])} episodes")
    return "\n".join(rows)
