"""Env pool throughput: guess_number steps/s in-process vs through worker subprocesses.

    python bench/envpool_bench.py [--seconds 3] [--loop uvloop|asyncio]

Every configuration plays episodes of guess_number (reset, then actions drawn from a fixed
sequence until done or 6 steps) for about ``--seconds`` seconds and counts step calls; the
time includes the resets. "raw" calls the env in this process; "pool cN" runs N concurrent
episodes on a pool of N workers, each step a request/reply round trip over the worker's pipes.
RSS is each live worker's resident memory (``/proc/PID/status``) after the run; workers are
recycled every ``--recycle-after`` episodes (default 1000, the pool's), which the table counts.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

ACTIONS = ["4", "x", "6", "2", "7", "1", "3", "5", "8"]


def raw(seconds: float) -> tuple[int, float]:
    from agentgym.envpool.envs.guess_number import GuessNumber

    env, steps, task = GuessNumber(), 0, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.reset(task)
        for i in range(6):
            steps += 1
            if env.step(ACTIONS[(task + i) % len(ACTIONS)]).done:
                break
        task += 1
    return steps, time.perf_counter() - t0


def rss_kib(pid: int) -> int | None:
    """Resident memory of ``pid`` (None if it is gone: recycled workers exit)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return None
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), None)


async def pooled(concurrency: int, seconds: float, recycle_after: int) -> tuple[int, float, float, list[int], int]:
    from agentgym.envpool.pool import EnvPool

    t_start = time.perf_counter()
    pool = EnvPool("guess_number", {}, concurrency, recycle_after=recycle_after)
    await pool.start()
    start_s = time.perf_counter() - t_start
    pids: set[int] = set()
    steps = 0
    try:
        t0 = time.perf_counter()

        async def player(k: int) -> None:
            nonlocal steps
            task = k
            while time.perf_counter() - t0 < seconds:
                async with pool.episode(task) as ep:
                    await ep.reset()
                    if ep.worker_pid is not None:
                        pids.add(ep.worker_pid)
                    for i in range(6):
                        steps += 1
                        if (await ep.step(ACTIONS[(task + i) % len(ACTIONS)])).done:
                            break
                task += concurrency

        await asyncio.gather(*(player(k) for k in range(concurrency)))
        elapsed = time.perf_counter() - t0
        rss = [kib for kib in map(rss_kib, sorted(pids)) if kib is not None]
        recycled = pool.stats()["recycled"]
    finally:
        await pool.close()
    return steps, elapsed, start_s, rss, recycled


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=3.0, help="duration of each configuration")
    p.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--recycle-after", type=int, default=1000, help="the pool's recycle_after")
    args = p.parse_args()

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings only
    run = asyncio.run
    if args.loop == "uvloop":
        import uvloop

        run = uvloop.run

    rows = []
    steps, elapsed = raw(args.seconds)
    rows.append(("raw (in-process)", steps, elapsed, None, None, None))
    for c in args.concurrency:
        rows.append((f"pool c{c} ({c} workers)", *run(pooled(c, args.seconds, args.recycle_after))))

    print(f"guess_number, {args.loop}, {args.seconds:g} s per row, recycle_after={args.recycle_after}")
    print(f"{'config':<24} {'steps/s':>10} {'us/step':>9} {'start s':>8} {'RSS/worker MiB':>15} {'recycled':>9}")
    for name, steps, elapsed, start_s, rss, recycled in rows:
        rate = steps / elapsed
        start = f"{start_s:.2f}" if start_s is not None else "-"
        mem = f"{statistics.mean(rss) / 1024:.1f}" if rss else "-"
        cycled = "-" if recycled is None else str(recycled)
        print(f"{name:<24} {rate:>10,.0f} {1e6 / rate:>9.1f} {start:>8} {mem:>15} {cycled:>9}")


if __name__ == "__main__":
    main()
