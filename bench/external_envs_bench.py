"""Throughput and memory of the envs that lean on something outside Python: sciworld (a JVM per
env), deepsearch (a BM25 index per worker) and remote (an AgentGym env server over HTTP).

    python bench/external_envs_bench.py [--seconds 20] [--concurrency 1 2] [--envs sciworld deepsearch remote]

Every row plays the env's expert for about ``--seconds`` seconds, episode after episode (sciworld:
the gold path of find-animal / use-thermometer / boil variations; deepsearch: the oracle on
questions in order; remote: deepsearch served by ``agentgym.envpool.server`` on loopback, played
by the ``remote`` env through the pool). "raw" calls the env in this process; "pool cN" runs N
concurrent episodes on N worker subprocesses. Columns: steps/s over the wall time (resets
included), mean ms per step call and s per reset as the caller sees them, seconds to start
(construct the env / start the pool), and resident memory per env (the worker plus its children:
the JVM for sciworld; for remote, the client's worker: the env itself lives on the server).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

from poolplay import play_for

SCIWORLD_TASKS = ("find-animal", "use-thermometer", "boil")


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants, MiB (0 if it is gone)."""
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def task_ids(env: str, n: int) -> list[int]:
    if env == "sciworld":
        from agentgym.envpool.envs.sciworld import task_id_of

        return [task_id_of(SCIWORLD_TASKS[i % 3], i // 3 % 14) for i in range(n)]  # train variations
    from agentgym.envpool.envs.factbook import questions

    return [i % len(questions()) for i in range(n)]


def raw(env_name: str, seconds: float) -> dict[str, Any]:
    from agentgym.envpool.registry import resolve_env

    t0 = time.perf_counter()
    env = resolve_env(env_name)()
    start_s = time.perf_counter() - t0
    steps, step_s, resets = 0, [], []
    t0 = time.perf_counter()
    for task in task_ids(env_name, 10_000):
        if time.perf_counter() - t0 > seconds:
            break
        t = time.perf_counter()
        env.reset(task)
        resets.append(time.perf_counter() - t)
        for _ in range(100):
            action = env.expert_action()
            t = time.perf_counter()
            r = env.step(action)
            step_s.append(time.perf_counter() - t)
            steps += 1
            if r.done:
                break
    elapsed = time.perf_counter() - t0
    mem = rss_mib(os.getpid())
    env.close()
    return {"steps": steps, "elapsed": elapsed, "step_s": step_s, "resets": resets, "start_s": start_s, "rss": [mem]}


async def pooled(env_name: str, kwargs: dict[str, Any], concurrency: int, seconds: float) -> dict[str, Any]:
    from agentgym.envpool.pool import EnvPool

    t0 = time.perf_counter()
    pool = EnvPool(env_name, kwargs, concurrency, reset_timeout_s=300, start_timeout_s=300)
    await pool.start()
    start_s = time.perf_counter() - t0
    tasks = task_ids("sciworld" if env_name == "sciworld" else "deepsearch", 10_000)
    try:
        run = await play_for(pool, tasks, concurrency, seconds, 100)
        rss = [rss_mib(pid) for pid in run.pids]
    finally:
        await pool.close()
    return {
        "steps": run.steps,
        "elapsed": run.elapsed,
        "step_s": run.step_s,
        "resets": run.resets,
        "start_s": start_s,
        "rss": rss,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="duration of each row")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    p.add_argument("--envs", nargs="+", default=["sciworld", "deepsearch", "remote"])
    args = p.parse_args()

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings only
    rows = []
    for env in args.envs:
        if env != "remote":
            rows.append((env, "raw (in-process)", raw(env, args.seconds)))
            for c in args.concurrency:
                rows.append((env, f"pool c{c}", asyncio.run(pooled(env, {}, c, args.seconds))))
            continue
        from agentgym.envpool.server import EnvServer

        for c in args.concurrency:
            with EnvServer("deepsearch", {}, size=c) as server:
                result = asyncio.run(pooled("remote", {"url": server.url}, c, args.seconds))
            rows.append(("remote", f"deepsearch over HTTP c{c}", result))

    print(f"{args.seconds:g} s per row, {os.cpu_count()} CPUs")
    print(f"{'env':<11} {'config':<28} {'steps/s':>8} {'ms/step':>8} {'s/reset':>8} {'start s':>8} {'MiB/env':>8}")
    for env, name, r in rows:
        rate = r["steps"] / r["elapsed"]
        ms = 1000 * statistics.mean(r["step_s"]) if r["step_s"] else float("nan")
        reset = statistics.mean(r["resets"]) if r["resets"] else float("nan")
        mem = statistics.mean(r["rss"]) if r["rss"] else float("nan")
        print(f"{env:<11} {name:<28} {rate:>8.1f} {ms:>8.2f} {reset:>8.2f} {r['start_s']:>8.2f} {mem:>8.0f}")


if __name__ == "__main__":
    main()
