"""Throughput and memory of the ``webshop`` env (headless Chromium per env worker).

    python bench/webshop_bench.py [--seconds 30] [--concurrency 1 2] [--fresh-context]

Every row plays the scripted expert on training tasks, episode after episode, for about
``--seconds`` seconds. "raw" drives the env in this process; "pool cN" runs N concurrent
episodes on N worker subprocesses. Columns: steps/s over the wall time (resets included), mean
ms per step and s per reset as the caller sees them, seconds to start (construct the env and
launch Chromium / start the pool), CPU ms per step (resets included) summed over the env's
processes (the figure that a loaded machine distorts least), and memory per live env: PSS (proportional set size: shared
pages split between the processes that map them, so N envs cost N times this) and RSS, summed
over the worker, Playwright's Node driver and every Chromium process. The last column breaks the
PSS down by process kind for the first env.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections import Counter
from typing import Any

from poolplay import play_for


def memory(pid: int) -> tuple[float, float, dict[str, float]]:
    """(PSS MiB, RSS MiB, PSS MiB by process kind) of ``pid`` and its descendants."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0.0, {}
    pss = rss = 0.0
    kinds: Counter[str] = Counter()
    for p in procs:
        try:
            m = p.memory_full_info()
            cmd = p.cmdline()
        except psutil.Error:
            continue
        kind = next((a[len("--type=") :] for a in cmd if a.startswith("--type=")), "")
        if not kind:
            kind = "chromium" if "chrom" in p.name() else "node" if "node" in p.name() else "python"
        pss += m.pss / 2**20
        rss += m.rss / 2**20
        kinds[kind] += m.pss / 2**20
    return pss, rss, dict(kinds)


def cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by ``pid`` and its descendants, those that exited included (their
    time is added to the parent that reaped them: Chromium's renderers are reaped by its zygote)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def train_tasks() -> list[int]:
    from agentgym.envpool.envs.webshop.env import WebShop

    ids = WebShop.tasks("train")
    return [ids[(i * 97) % len(ids)] for i in range(len(ids))]  # spread over products


def raw(seconds: float) -> dict[str, Any]:
    from agentgym.envpool.envs.webshop.env import WebShop

    t0 = time.perf_counter()
    env = WebShop()
    start_s = time.perf_counter() - t0
    steps, step_s, resets, solved = 0, [], [], 0
    cpu0 = cpu_seconds(os.getpid())
    t0 = time.perf_counter()
    for task in train_tasks():
        if time.perf_counter() - t0 > seconds:
            break
        t = time.perf_counter()
        env.reset(task)
        resets.append(time.perf_counter() - t)
        for _ in range(30):
            action = env.expert_action()
            t = time.perf_counter()
            r = env.step(action)
            step_s.append(time.perf_counter() - t)
            steps += 1
            if r.done:
                solved += r.reward == 1.0
                break
    elapsed = time.perf_counter() - t0
    cpu = cpu_seconds(os.getpid()) - cpu0
    mem = [memory(os.getpid())]
    env.close()
    return {
        "steps": steps,
        "elapsed": elapsed,
        "step_s": step_s,
        "resets": resets,
        "start_s": start_s,
        "mem": mem,
        "episodes": len(resets),
        "solved": solved,
        "cpu": cpu,
    }


async def pooled(concurrency: int, seconds: float, options: dict[str, Any]) -> dict[str, Any]:
    from agentgym.envpool.pool import EnvPool

    t0 = time.perf_counter()
    pool = EnvPool("webshop", options, concurrency, reset_timeout_s=120, start_timeout_s=120)
    await pool.start()
    start_s = time.perf_counter() - t0
    workers = [w.pid for w in pool._live]
    cpu0 = sum(cpu_seconds(pid) for pid in workers)
    try:
        run = await play_for(pool, train_tasks(), concurrency, seconds, 30)
        cpu = sum(cpu_seconds(pid) for pid in workers) - cpu0  # the env side only (no restarts here)
        mem = [memory(pid) for pid in sorted(run.pids)]  # while every worker is alive
    finally:
        await pool.close()
    return {
        "steps": run.steps,
        "elapsed": run.elapsed,
        "step_s": run.step_s,
        "resets": run.resets,
        "start_s": start_s,
        "mem": mem,
        "episodes": len(run.resets),
        "solved": run.solved,
        "cpu": cpu,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="duration of each row")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    p.add_argument("--fresh-context", action="store_true", help="add a row with new_context_per_episode")
    args = p.parse_args()

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings only
    rows = [("raw (in-process)", raw(args.seconds))]
    for c in args.concurrency:
        rows.append((f"pool c{c}", asyncio.run(pooled(c, args.seconds, {}))))
    if args.fresh_context:
        rows.append(("pool c1 new ctx", asyncio.run(pooled(1, args.seconds, {"new_context_per_episode": True}))))

    print(f"{args.seconds:g} s per row, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(
        f"{'config':<18} {'steps/s':>8} {'ms/step':>8} {'s/reset':>8} {'start s':>8} {'solved':>8} "
        f"{'CPU ms/step':>11} {'PSS/env':>8} {'RSS/env':>8}  PSS MiB by process (first env)"
    )
    for name, r in rows:
        rate = r["steps"] / r["elapsed"]
        ms = 1000 * statistics.mean(r["step_s"]) if r["step_s"] else float("nan")
        reset = statistics.mean(r["resets"]) if r["resets"] else float("nan")
        pss = statistics.mean(m[0] for m in r["mem"])
        rss = statistics.mean(m[1] for m in r["mem"])
        kinds = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["mem"][0][2].items(), key=lambda kv: -kv[1]))
        solved = f"{r['solved']}/{r['episodes']}"
        cpu_ms = 1000 * r["cpu"] / max(r["steps"], 1)
        print(
            f"{name:<18} {rate:>8.2f} {ms:>8.0f} {reset:>8.2f} {r['start_s']:>8.2f} {solved:>8} {cpu_ms:>11.0f} "
            f"{pss:>8.0f} {rss:>8.0f}  {kinds}"
        )


if __name__ == "__main__":
    main()
