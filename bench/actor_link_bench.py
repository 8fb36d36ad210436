"""The actor's control link alone: CPU per acked rollout against a raw pyzmq sender, alternated.

    python bench/actor_link_bench.py [--n 2000] [--rounds 7] [--other PATH]

One raw pyzmq ROUTER in another process acks every rollout (a pre-encoded Ack); in this
process, on uvloop, ``ControlLink`` sends ``--n`` rollouts of 8 x 1024 tokens (encoded afresh,
window of 8 in flight, as bench/layers_bench.py does), then a raw pyzmq DEALER re-sends one
pre-encoded copy the same way; ``--rounds`` times, alternated. ``--other`` names another
actors/transport.py (e.g. ``git show main:actors/transport.py > /tmp/t.py``) whose
``ControlLink`` joins the alternation, for a before/after in one run. Prints the best and
median CPU per rollout of this process for each sender: the receiver is the same for all, so
the difference is the sender's, less at the mercy of other work than a rate.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from layers_bench import make_rollout, windowed, windowed_async  # noqa: E402


def _acker(addr: str, ready) -> None:
    import zmq

    from agentgym.protocol import Ack
    from agentgym.protocol.wire import encode

    ack = encode(Ack(group_ids=["run:123"], statuses=["accepted"]))
    s = zmq.Context().socket(zmq.ROUTER)
    s.bind(addr)
    ready.set()
    while True:
        s.send_multipart([s.recv_multipart(copy=False)[0].bytes, *ack])


async def _link(cls, addr: str, r, n: int) -> float:
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    link = cls(ctx, addr, "bench-actor")
    await asyncio.sleep(0.2)  # connected
    c0 = time.process_time()
    await windowed_async(lambda _: link.send(r), link.recv, n)
    cpu = time.process_time() - c0
    link.close()
    ctx.term()
    return cpu


def _raw(addr: str, frames: list[bytes], n: int) -> float:
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(addr)
    time.sleep(0.2)
    c0 = time.process_time()
    windowed(lambda _: s.send_multipart(frames, copy=False), s.recv_multipart, n)
    cpu = time.process_time() - c0
    s.close(linger=0)
    ctx.term()
    return cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000, help="rollouts per run (default: 2000)")
    p.add_argument("--rounds", type=int, default=7, help="alternated rounds (default: 7)")
    p.add_argument("--other", type=Path, help="another actors/transport.py whose ControlLink to compare")
    p.add_argument("--port", type=int, default=47901, help="loopback port of the acking ROUTER")
    args = p.parse_args()
    import uvloop

    from agentgym.actors.transport import ControlLink
    from agentgym.protocol.wire import encode

    senders = {"this ControlLink": ControlLink}
    if args.other is not None:
        spec = importlib.util.spec_from_file_location("other_transport", args.other)
        if spec is None or spec.loader is None:
            raise SystemExit(f"actor_link_bench: --other {args.other} is not a Python file")
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        senders = {"other ControlLink": other.ControlLink, **senders}
    addr = f"tcp://127.0.0.1:{args.port}"
    ready = mp.get_context("spawn").Event()
    acker = mp.get_context("spawn").Process(target=_acker, args=(addr, ready), daemon=True)
    acker.start()
    if not ready.wait(60):
        raise SystemExit("actor_link_bench: the acking ROUTER did not start")
    r = make_rollout(1024, 8)
    frames = [bytes(f) for f in encode(r)]
    cpu: dict[str, list[float]] = {name: [] for name in [*senders, "raw pyzmq"]}
    for _ in range(args.rounds):
        for name, cls in senders.items():
            cpu[name].append(uvloop.run(_link(cls, addr, r, args.n)) / args.n * 1e6)
        cpu["raw pyzmq"].append(_raw(addr, frames, args.n) / args.n * 1e6)
    acker.kill()
    raw = sorted(cpu["raw pyzmq"])
    for name, got in cpu.items():
        got.sort()
        print(
            f"{name}: CPU per rollout best {got[0]:.1f} µs, median {got[len(got) // 2]:.1f} µs "
            f"({got[0] / raw[0]:.2f}x / {got[len(got) // 2] / raw[len(raw) // 2]:.2f}x raw)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
