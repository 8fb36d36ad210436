"""Throughput and memory of the game envs (babyai, textcraft, maze, wordle): raw and through the pool.

    python bench/envs_bench.py [--seconds 5] [--concurrency 1 2] [--envs babyai textcraft maze wordle]
    python bench/envs_bench.py --envs reasoning_gym textarena skyrl_gym    # the envs extra

Every row plays episodes of one env for about ``--seconds`` seconds with a fixed cycle of actions
per env (valid moves mixed with an invalid one; not the expert, whose planning would be counted
as env time), resetting on done or after 20 steps. "raw" calls the env in this process; "pool cN"
runs N concurrent episodes on a pool of N worker subprocesses. Columns: steps/s over the wall
time (resets included), mean µs per step call as the caller sees it, the pool's overhead (µs per
step through the pool with one worker ÷ raw µs per step), seconds to start (build the env / start
the pool), and memory per live env: RSS and PSS of each worker process (``/proc/PID``; PSS counts
shared pages once per sharer). The ``guess_number`` row is the baseline: a worker whose env
costs almost nothing, so a game's own memory is its worker's minus that one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from poolplay import play_for

_DATA = Path(__file__).resolve().parents[1] / "configs" / "ecosystem" / "data"
ENVS: dict[str, tuple[dict[str, Any], list[str]]] = {
    # name: (kwargs, action cycle)
    "guess_number": ({}, ["4", "x", "6", "2", "7", "1", "3", "5", "8"]),
    "babyai": (
        {"levels": "GoToLocal,PickupLoc,PutNextLocal,GoToObjMaze,Unlock"},
        ["go forward", "turn left", "go forward", "pick up", "turn right", "go forward", "toggle", "jump"],
    ),
    "textcraft": (
        {"depth": 3},
        ["get 2 oak log", "inventory", "craft 4 oak planks using 1 oak log", "get 1 iron ore", "craft it", "inventory"],
    ),
    "maze": ({"size": 6}, ["move up", "move right", "move down", "move left", "move right", "fly"]),
    "wordle": ({}, ["crane", "slate", "pious", "xyzzy", "round", "guess: mount"]),
    # Other ecosystems' packages through their adapters (the envs extra): the configs/ecosystem options.
    "reasoning_gym": (
        {
            "dataset": "basic_arithmetic",
            "max_tries": 3,
            "answer": "raw",
            "min_terms": 2,
            "max_terms": 2,
            "min_digits": 1,
            "max_digits": 1,
            "operators": ["+", "-"],
        },
        ["1", "7", "x", "3", "-2"],
    ),
    "textarena": (
        {"game": "TicTacToe-v0", "opponent": "random"},
        ["[4]", "[0]", "[8]", "[2]", "[6]", "x", "[1]", "[3]", "[5]"],
    ),
    "skyrl_gym": (
        {"env_id": "gsm8k_multi_turn", "data": str(_DATA / "skyrl_gsm8k_train.jsonl")},
        ["#### 12", "no idea", "#### 7"],
    ),
}
EPISODE_STEPS = 20


def memory_kib(pid: int) -> tuple[int, int] | None:
    """(RSS, PSS) of ``pid`` in KiB; None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None

    def field(text: str, name: str) -> int:
        return next(int(line.split()[1]) for line in text.splitlines() if line.startswith(name + ":"))

    return field(status, "VmRSS"), field(rollup, "Pss")


def tasks(name: str) -> list[int]:
    from agentgym.envpool.registry import resolve_env

    return [int(t) for t in resolve_env(name).tasks("train", **ENVS[name][0])[:100_000]]


def raw(name: str, seconds: float) -> dict[str, Any]:
    from agentgym.envpool.registry import resolve_env

    kwargs, actions = ENVS[name]
    t0 = time.perf_counter()
    env = resolve_env(name)(**kwargs)
    start_s = time.perf_counter() - t0
    steps, step_s = 0, 0.0
    t0 = time.perf_counter()
    for task in tasks(name):
        if time.perf_counter() - t0 > seconds:
            break
        env.reset(task)
        for i in range(EPISODE_STEPS):
            t = time.perf_counter()
            r = env.step(actions[(task + i) % len(actions)])
            step_s += time.perf_counter() - t
            steps += 1
            if r.done:
                break
    return {"steps": steps, "elapsed": time.perf_counter() - t0, "step_s": step_s, "start_s": start_s, "mem": []}


async def pooled(name: str, concurrency: int, seconds: float) -> dict[str, Any]:
    from agentgym.envpool.pool import EnvPool

    kwargs, actions = ENVS[name]
    t0 = time.perf_counter()
    pool = EnvPool(name, kwargs, concurrency, start_timeout_s=300)
    await pool.start()
    start_s = time.perf_counter() - t0

    async def cycle(ep: Any, task: int, i: int) -> str:
        return actions[(task + i) % len(actions)]

    try:
        run = await play_for(pool, tasks(name), concurrency, seconds, EPISODE_STEPS, cycle)
        mem = [m for m in map(memory_kib, sorted(run.pids)) if m is not None]
    finally:
        await pool.close()
    return {"steps": run.steps, "elapsed": run.elapsed, "step_s": sum(run.step_s), "start_s": start_s, "mem": mem}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each row")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    p.add_argument("--envs", nargs="+", default=list(ENVS)[:5], choices=list(ENVS))
    args = p.parse_args()

    import structlog
    import uvloop

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings only
    print(f"{args.seconds:g} s per row, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    print(
        f"{'env':<13} {'config':<17} {'steps/s':>9} {'us/step':>9} {'overhead':>9} {'start s':>8} "
        f"{'RSS MiB':>8} {'PSS MiB':>8}"
    )
    for name in args.envs:
        rows = [("raw (in-process)", raw(name, args.seconds))]
        rows += [(f"pool c{c}", uvloop.run(pooled(name, c, args.seconds))) for c in args.concurrency]
        raw_us = 1e6 * rows[0][1]["step_s"] / max(rows[0][1]["steps"], 1)
        for config, r in rows:
            us = 1e6 * r["step_s"] / max(r["steps"], 1)
            overhead = "-" if config.startswith("raw") or config != "pool c1" else f"{us / raw_us:.1f}x"
            rss = f"{statistics.mean(m[0] for m in r['mem']) / 1024:.0f}" if r["mem"] else "-"
            pss = f"{statistics.mean(m[1] for m in r['mem']) / 1024:.0f}" if r["mem"] else "-"
            print(
                f"{name:<13} {config:<17} {r['steps'] / r['elapsed']:>9,.0f} {us:>9,.0f} {overhead:>9} "
                f"{r['start_s']:>8.2f} {rss:>8} {pss:>8}",
                flush=True,
            )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
