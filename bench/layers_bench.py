"""The project's layers against their raw bounds, in one run.

    python bench/layers_bench.py [--tokens 1024] [--group 8] [--n 2000] [--window 64] [--steps 400]

1. protocol: encode + decode of a realistic Rollout (``--group`` episodes of ``--tokens`` tokens,
   arrays as packed bytes) through ``protocol.wire`` (msgspec, typed, validated) vs raw
   ``msgpack`` packb + unpackb of a plain dict holding the same bytes.
2. transport: ``--n`` such rollouts from an actor's ``ControlLink`` (asyncio DEALER on uvloop, as
   the actor runs) to a learner ``Hub`` (ROUTER read, decoded and validated on the trio thread)
   in another process, each acked from trio. The layer's raw bound is raw pyzmq between two
   processes carrying the same messages with the same codec: a blocking DEALER that encodes each
   rollout (``protocol.wire``, into one reused buffer, copied by ZeroMQ as the actor's link does)
   and sends it, a blocking ROUTER that receives it, decodes and validates it and sends an encoded
   ``Ack`` for each. What is left between the two is the transport layer itself: the event loops
   (asyncio, trio), flow control, ordering and the edge-triggered FD handling; the codec's own
   cost is row 1's. ``--window`` rollouts are in flight in all (64 by default: an agentgym actor
   never waits for acks, it streams what its tickets allow and keeps the unacknowledged rollouts
   for re-sending; 8 shows a sender that waits on acks, which the learner coalesces per burst).
   For reference, the wire's ceiling: raw pyzmq re-sending one pre-encoded copy of the frames,
   zero-copy, and a receiver that never decodes them (no message built or read at all; the
   project cannot reach it, as it must build, check and keep each rollout). Best of
   ``--transport-repeats`` for each side, alternated; CPU seconds per rollout (both processes,
   all their threads, and each process apart) are reported too, being less at the mercy of other
   work on a shared machine. Every process, raw or not, runs with the allocator settings
   agentgym's own processes use (agentgym/host/allocator.py).
3. env pool: per-step time of guess_number through a one-worker ``EnvPool`` (a request/reply
   over the worker's pipes) vs calling the env in this process; the overhead is the difference,
   compared with a typical env step (the waiting env's median, 0.3 s, and a 10 ms one).

Ratios are raw/project (1.0: no cost over the bound; the target is >= 0.8). Times under load
are noisy: every pair is measured back to back, best of ``--repeats``; on a 2-core machine the
four busy threads of a transport run (each process's Python and ZeroMQ I/O thread) make single
runs of it spread by +-15%: compare several.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import time

import numpy as np

WINDOW = 64


def windowed(send, recv, n: int, count=lambda reply: 1) -> None:
    """Send ``n`` messages with at most WINDOW unacknowledged, then wait for the rest of the acks;
    ``count(reply)``: how many messages one reply acknowledges (the learner coalesces its acks)."""
    acked = 0
    for i in range(n):
        send(i)
        while i + 1 - acked >= WINDOW:
            acked += count(recv())
    while acked < n:
        acked += count(recv())


async def windowed_async(send, recv, n: int, count=lambda reply: 1) -> None:
    """``windowed`` for coroutine ``send``/``recv`` (the project's asyncio ControlLink)."""
    acked = 0
    for i in range(n):
        await send(i)
        while i + 1 - acked >= WINDOW:
            acked += count(await recv())
    while acked < n:
        acked += count(await recv())


def make_rollout(tokens: int, group: int):
    from agentgym.protocol import Episode, Rollout
    from agentgym.protocol.arrays import F32, I32, U8, pack

    rng = np.random.default_rng(0)
    eps = []
    for _ in range(group):
        mask = (rng.random(tokens) < 0.3).astype(np.uint8)
        ends = np.sort(rng.choice(np.arange(1, tokens), 6, replace=False)).astype(np.int32)
        eps.append(
            Episode(
                token_ids=pack(rng.integers(0, 150_000, tokens), I32),
                logprobs=pack(-rng.random(tokens) * mask, F32),
                loss_mask=pack(mask, U8),
                versions=pack(np.where(mask > 0, 7, -1), I32),
                turn_ends=pack(ends, I32),
                turn_rewards=pack(np.zeros(6), F32),
                reward=1.0,
                success=True,
                finish="done",
                turn_limit=6,
            )
        )
    return Rollout(group_id="run:123", actor_id="actor-0", env="guess_number", task_id=5, episodes=eps, elapsed_s=1.5)


def best(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def bench_protocol(r, n: int, repeats: int) -> dict[str, float]:
    import msgpack
    import msgspec

    from agentgym.protocol.wire import decode, encode

    plain = msgspec.to_builtins(r)  # the same fields and bytes as a plain dict

    def project() -> None:
        for _ in range(n):
            decode(encode(r))

    def raw() -> None:
        for _ in range(n):
            msgpack.unpackb(msgpack.packb(plain))

    tp, tr = best(project, repeats), best(raw, repeats)
    size = len(encode(r)[1])
    return {"bytes": size, "project_us": tp / n * 1e6, "raw_us": tr / n * 1e6, "ratio": tr / tp}


# ---------------------------------------------------------------------- transport (two processes)
def _hub_server(addr: str, n: int, ready, cpu) -> None:
    import trio

    from agentgym.host.allocator import keep_freed_memory

    keep_freed_memory()  # as agentgym-learner does at start
    from agentgym.learner.transport import open_hub

    async def main() -> None:
        async with open_hub(addr) as hub:
            ready.set()
            got = 0
            async for peer, msg in hub.inbox:
                if got == 0:
                    c0 = time.process_time()
                got += 1
                hub.ack(peer, msg.group_id, "accepted")  # as learner/control/actor_control.py does
                if got == n:
                    hub.flush_acks()  # the inbox sends coalesced acks when asked for the next message
                    await trio.sleep(0.5)  # let ZeroMQ send the last ack
                    cpu.value = time.process_time() - c0
                    return

    trio.run(main)


def _raw_server(addr: str, n: int, ready, cpu, codec: bool) -> None:
    """Raw pyzmq ROUTER acking each message; ``codec``: decoded (validated) and acked with an
    encoded Ack, as the layer's bound; otherwise neither (the wire's ceiling)."""
    import zmq

    from agentgym.host.allocator import keep_freed_memory

    keep_freed_memory()  # the raw bound gets the same allocator as the project
    from agentgym.protocol import Ack, decode, encode

    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.bind(addr)
    ready.set()
    for i in range(n):
        frames = s.recv_multipart(copy=False)
        if i == 0:
            c0 = time.process_time()
        if codec:
            msg, _ = decode([f.buffer for f in frames[1:]])
            s.send_multipart([frames[0].bytes, *encode(Ack(group_ids=[msg.group_id], statuses=["accepted"]))])
        else:
            s.send_multipart([frames[0].bytes, b"ack"])
    time.sleep(0.5)
    cpu.value = time.process_time() - c0
    s.close(linger=1000)
    ctx.term()


def _raw_codec_server(addr: str, n: int, ready, cpu) -> None:
    _raw_server(addr, n, ready, cpu, codec=True)


def _raw_wire_server(addr: str, n: int, ready, cpu) -> None:
    _raw_server(addr, n, ready, cpu, codec=False)


def bench_transport(r, n: int, port: int, repeats: int) -> dict[str, float]:
    import uvloop
    import zmq
    import zmq.asyncio

    from agentgym.actors.transport import ControlLink
    from agentgym.protocol.wire import encode

    mpc = mp.get_context("spawn")

    def serve(target, addr: str) -> tuple[mp.Process, object]:
        ready, cpu = mpc.Event(), mpc.Value("d", float("nan"))
        p = mpc.Process(target=target, args=(addr, n, ready, cpu), daemon=True)
        p.start()
        if not ready.wait(60):
            raise SystemExit(f"layers_bench: {target.__name__} did not start")
        return p, cpu

    async def project(addr: str) -> float:
        ctx = zmq.asyncio.Context()
        link = ControlLink(ctx, addr, "bench-actor")
        await asyncio.sleep(0.3)  # connected
        t0 = time.perf_counter()
        await windowed_async(lambda _: link.send(r), link.recv, n, count=lambda ack: len(ack.group_ids))
        dt = time.perf_counter() - t0
        link.close()
        ctx.term()
        return dt

    frames = [bytes(f) for f in encode(r)]

    def raw(addr: str, codec: bool) -> float:
        from agentgym.actors.transport import COPY_BELOW
        from agentgym.protocol import decode, encode_into

        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.copy_threshold = COPY_BELOW  # copied by ZeroMQ as the actor's link does: no GC-thread wake-up per send
        s.connect(addr)
        time.sleep(0.3)
        buf = bytearray()
        t0 = time.perf_counter()
        if codec:  # encoded afresh each time, acks decoded
            windowed(lambda _: s.send_multipart(encode_into(r, buf)), lambda: decode(s.recv_multipart())[0], n)
        else:  # one encoded copy re-sent without a copy, acks not read
            windowed(lambda _: s.send_multipart(frames, copy=False), s.recv_multipart, n)
        dt = time.perf_counter() - t0
        s.close(linger=0)
        ctx.term()
        return dt

    servers = {"project": _hub_server, "raw_codec": _raw_codec_server, "raw_wire": _raw_wire_server}

    def run(side: str, addr: str) -> tuple[float, float, float, float]:
        p, server_cpu = serve(servers[side], addr)
        c0 = time.process_time()  # the client's, counted from its first send
        dt = uvloop.run(project(addr)) if side == "project" else raw(addr, side == "raw_codec")
        client_cpu = time.process_time() - c0
        p.join(10)
        return dt, client_cpu + server_cpu.value, client_cpu, server_cpu.value  # type: ignore[attr-defined]  # a multiprocessing Value's

    # per side, the best of each figure: (seconds, CPU of both, actor/client CPU, learner/server CPU)
    best: dict[str, tuple[float, ...]] = {}
    for i in range(repeats):
        for j, side in enumerate(servers):
            got = run(side, f"tcp://127.0.0.1:{port + 6 * i + 2 * j}")
            best[side] = tuple(min(a, b) for a, b in zip(best.get(side, (float("inf"),) * 4), got))
    (tp, cp, ap, lp), (tr, cr, ar, lr), (tw, cw, _, _) = best["project"], best["raw_codec"], best["raw_wire"]
    return {
        "project_per_s": n / tp,
        "raw_per_s": n / tr,
        "ratio": tr / tp,
        "project_cpu_us": cp / n * 1e6,
        "raw_cpu_us": cr / n * 1e6,
        "cpu_ratio": cr / cp,
        "project_actor_cpu_us": ap / n * 1e6,
        "project_learner_cpu_us": lp / n * 1e6,
        "raw_client_cpu_us": ar / n * 1e6,
        "raw_server_cpu_us": lr / n * 1e6,
        "wire_per_s": n / tw,
        "wire_cpu_us": cw / n * 1e6,
        "ratio_to_wire": tw / tp,
    }


# ---------------------------------------------------------------------- env pool
def bench_pool(steps: int) -> dict[str, float]:
    from agentgym.envpool.envs.guess_number import GuessNumber
    from agentgym.envpool.pool import EnvPool

    actions = ["4", "x", "6", "2", "7", "1", "3", "5", "8"]
    env = GuessNumber()
    t0 = time.perf_counter()
    done_steps, task = 0, 0
    while done_steps < steps:
        env.reset(task)
        for i in range(6):
            done_steps += 1
            if env.step(actions[(task + i) % len(actions)]).done:
                break
        task += 1
    raw_s = (time.perf_counter() - t0) / done_steps

    async def pooled() -> float:
        async with EnvPool("guess_number", {}, size=1) as pool:
            n, task = 0, 0
            t0 = time.perf_counter()
            while n < steps:
                async with pool.episode(task) as ep:
                    await ep.reset()
                    for i in range(6):
                        n += 1
                        if (await ep.step(actions[(task + i) % len(actions)])).done:
                            break
                task += 1
            return (time.perf_counter() - t0) / n

    pool_s = asyncio.run(pooled())
    over = max(pool_s - raw_s, 0.0)
    return {
        "raw_step_us": raw_s * 1e6,
        "pool_step_us": pool_s * 1e6,
        "overhead_us": over * 1e6,
        "overhead_vs_0.3s_step": over / 0.3,
        "overhead_vs_10ms_step": over / 0.01,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1024, help="tokens per episode (default: 1024)")
    p.add_argument("--group", type=int, default=8, help="episodes per rollout (default: 8)")
    p.add_argument("--n", type=int, default=2000, help="rollouts sent over the transports (default: 2000)")
    p.add_argument("--steps", type=int, default=400, help="env steps per pool measurement (default: 400)")
    p.add_argument("--repeats", type=int, default=5, help="best of this many for the codec (default: 5)")
    p.add_argument("--transport-repeats", type=int, default=3, help="best of this many for the transports (default: 3)")
    p.add_argument("--port", type=int, default=47311, help="first of the 6 x transport-repeats loopback ports used")
    p.add_argument(
        "--window",
        type=int,
        default=WINDOW,
        help=f"rollouts in flight before the sender waits for an ack (default: {WINDOW}); an agentgym "
        "actor never waits for acks, so a large window is the actor's pattern",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = p.parse_args()
    globals()["WINDOW"] = args.window
    from agentgym.host.allocator import keep_freed_memory

    keep_freed_memory()  # as agentgym-actor does at start; the raw client runs here too, so gets it as well
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings and up only
    r = make_rollout(args.tokens, args.group)
    res = {
        "protocol": bench_protocol(r, 200, args.repeats),
        "transport": bench_transport(r, args.n, args.port, args.transport_repeats),
        "env_pool": bench_pool(args.steps),
    }
    pr, tr, ev = res["protocol"], res["transport"], res["env_pool"]
    print(
        f"rollout: {args.group} episodes x {args.tokens} tokens, {pr['bytes'] / 1024:.0f} KiB encoded; "
        f"{args.window} in flight\n"
    )
    print("| layer | project | raw bound | raw/project |")
    print("|---|---|---|---|")
    print(
        f"| protocol encode+decode | {pr['project_us']:.0f} µs | {pr['raw_us']:.0f} µs (msgpack) | {pr['ratio']:.2f} |"
    )
    print(
        f"| ZeroMQ transport, acked | {tr['project_per_s']:.0f} rollouts/s | {tr['raw_per_s']:.0f} rollouts/s "
        f"(pyzmq, same codec) | {tr['ratio']:.2f} |"
    )
    print(
        f"| the same, CPU per rollout (both processes) | {tr['project_cpu_us']:.0f} µs | {tr['raw_cpu_us']:.0f} µs "
        f"| {tr['cpu_ratio']:.2f} |"
    )
    print(
        f"| of which the sender (actor) / the receiver (learner) | {tr['project_actor_cpu_us']:.0f} / "
        f"{tr['project_learner_cpu_us']:.0f} µs | {tr['raw_client_cpu_us']:.0f} / {tr['raw_server_cpu_us']:.0f} µs | |"
    )
    print(
        f"| (reference, the wire's ceiling: pyzmq re-sending one encoded buffer, never decoded) | | "
        f"{tr['wire_per_s']:.0f} rollouts/s, {tr['wire_cpu_us']:.0f} µs CPU | {tr['ratio_to_wire']:.2f} |"
    )
    print(
        f"| env pool step | {ev['pool_step_us']:.0f} µs | {ev['raw_step_us']:.1f} µs (in-process) | "
        f"overhead {ev['overhead_us']:.0f} µs = {ev['overhead_vs_0.3s_step']:.2%} of a 0.3 s step, "
        f"{ev['overhead_vs_10ms_step']:.1%} of a 10 ms step |"
    )
    if args.json:
        print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
