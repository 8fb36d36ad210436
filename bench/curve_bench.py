"""What CURVE (authentication + encryption) costs on the two real paths, as ratios to plain TCP.

    python bench/curve_bench.py [--weights-mib 256] [--rollouts 1500] [--repeats 3] [--out DIR]

- weights: the learner's Hub serves a snapshot of ``--weights-mib`` MiB (64 MiB chunks, as
  ``learner.weight_chunk_mib``) and the actor's ``fetch_weights`` pulls it, crc-checked: MB/s.
- rollouts: the actor's ControlLink sends Rollouts (8 episodes x 1024 tokens, as a default
  group) with 16 in flight; a trio task on the learner side takes each from the hub's inbox and
  answers an Ack, as the control loop does: rollouts/s, counted when the Ack is back.

Each measurement alternates plain and CURVE ``--repeats`` times on tcp loopback in one run and
reports the medians and their ratio. Loopback leaves out the network: on a real link CURVE's
share of the time is smaller still when the link, not the CPU, is the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import trio
import zmq.asyncio

from agentgym.actors.transport import ControlLink
from agentgym.actors.weight_fetch import fetch_weights
from agentgym.auth.keys import ClientKeys, write_keys
from agentgym.auth.server import ServerKeys
from agentgym.host.netutil import free_port_pair
from agentgym.learner.transport import WeightSnapshot, open_hub
from agentgym.protocol import Ack, Episode, Rollout, WeightsReady, encode
from agentgym.protocol.arrays import F32, I32, U8, pack
from agentgym.protocol.weights import RawTensor, make_chunks

MiB = 1024 * 1024


class HubThread:
    """open_hub under trio in a thread; acks every Rollout it receives."""

    def __init__(self, bind: str, keys: ServerKeys | None, snap: WeightSnapshot) -> None:
        self.bind, self.keys, self.snap = bind, keys, snap
        self.ready, self.stop = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self.errors: queue.Queue = queue.Queue()

    async def _main(self) -> None:
        async with open_hub(self.bind, keys=self.keys) as hub, trio.open_nursery() as n:
            hub.publish_weights(self.snap)
            self.ready.set()

            async def ack() -> None:
                async for peer, msg in hub.inbox:
                    if isinstance(msg, Rollout):
                        hub.send(peer, Ack(group_ids=[msg.group_id], statuses=["accepted"]))

            n.start_soon(ack)
            while not self.stop.is_set():
                await trio.sleep(0.05)
            n.cancel_scope.cancel()

    def __enter__(self) -> HubThread:
        self.thread.start()
        assert self.ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def rollout(i: int, rng: np.random.Generator) -> Rollout:
    n = 1024
    ep = Episode(
        token_ids=pack(rng.integers(0, 32000, n), I32),
        logprobs=pack(-rng.random(n), F32),
        loss_mask=pack(np.r_[np.zeros(n // 2), np.ones(n // 2)], U8),
        versions=pack(np.r_[-np.ones(n // 2), np.zeros(n // 2)], I32),
        turn_ends=pack([n], I32),
        turn_rewards=pack([1.0], F32),
        reward=1.0,
        success=True,
        finish="done",
        turn_limit=6,
    )
    return Rollout(group_id=f"g{i}", actor_id="bench", env="guess_number", task_id=i, episodes=[ep] * 8)


async def weights_once(port: int, ready: WeightsReady, keys: ClientKeys | None) -> float:
    ctx = zmq.asyncio.Context()
    t0 = time.perf_counter()
    _, tensors = await fetch_weights(ctx, f"tcp://127.0.0.1:{port + 1}", ready, keys=keys, timeout_s=600)
    dt = time.perf_counter() - t0
    ctx.term()
    return sum(len(t.data) for t in tensors) / dt / 1e6


async def rollouts_once(port: int, n: int, keys: ClientKeys | None, msgs: list[Rollout]) -> float:
    ctx = zmq.asyncio.Context()
    link = ControlLink(ctx, f"tcp://127.0.0.1:{port}", "bench", keys)
    window, sent, acked = 16, 0, 0
    t0 = time.perf_counter()
    while acked < n:
        while sent < n and sent - acked < window:
            await link.send(msgs[sent % len(msgs)])
            sent += 1
        msg = await asyncio.wait_for(link.recv(), 60)
        acked += isinstance(msg, Ack)
    dt = time.perf_counter() - t0
    link.close()
    ctx.term()
    return n / dt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights-mib", type=int, default=256)
    p.add_argument("--rollouts", type=int, default=1500)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, help="write curve_bench.json here")
    a = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="curve-bench-"))
    write_keys(tmp, ["bench"])
    skeys = ServerKeys.load(tmp / "learner.key_secret", tmp / "authorized")
    ckeys = ClientKeys.load(tmp / "actors" / "bench.key_secret", tmp / "learner.key")
    rng = np.random.default_rng(0)
    n_floats = a.weights_mib * MiB // 4
    tensors = [
        RawTensor(f"w{i}", "float32", (n_floats // 8,), rng.random(n_floats // 8, dtype=np.float32).tobytes())
        for i in range(8)
    ]
    snap = WeightSnapshot.build(1, make_chunks(1, tensors, 64 * MiB))
    ready = WeightsReady(version=1, step=1, turn_limit=6, num_chunks=len(snap.frames), total_bytes=snap.total_bytes)
    msgs = [rollout(i, rng) for i in range(64)]
    rollout_kib = len(encode(msgs[0])[1]) / 1024

    results: dict[str, dict[str, list[float]]] = {
        "plain": {"weights_mb_s": [], "rollouts_s": []},
        "curve": {"weights_mb_s": [], "rollouts_s": []},
    }
    for rep in range(a.repeats):
        for mode in ("plain", "curve"):
            port = free_port_pair()
            with HubThread(f"tcp://127.0.0.1:{port}", skeys if mode == "curve" else None, snap):
                ck = ckeys if mode == "curve" else None
                w = asyncio.run(weights_once(port, ready, ck))
                r = asyncio.run(rollouts_once(port, a.rollouts, ck, msgs))
            results[mode]["weights_mb_s"].append(w)
            results[mode]["rollouts_s"].append(r)
            print(f"repeat {rep} {mode:5s}: weights {w:8.1f} MB/s   rollouts {r:8.1f} /s", flush=True)
    med = {m: {k: statistics.median(v) for k, v in d.items()} for m, d in results.items()}
    ratio = {k: med["curve"][k] / med["plain"][k] for k in med["plain"]}
    print("\n| path (tcp loopback) | plain | CURVE | CURVE / plain |\n|---|---|---|---|")
    print(
        f"| weight fetch, {a.weights_mib} MiB | {med['plain']['weights_mb_s']:.0f} MB/s | {med['curve']['weights_mb_s']:.0f} MB/s | {ratio['weights_mb_s']:.2f} |"
    )
    print(
        f"| rollouts ({rollout_kib:.0f} KiB each, acked) | {med['plain']['rollouts_s']:.0f} /s | {med['curve']['rollouts_s']:.0f} /s | {ratio['rollouts_s']:.2f} |"
    )
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "curve_bench.json").write_text(
            json.dumps(
                {
                    "runs": results,
                    "median": med,
                    "ratio": ratio,
                    "weights_mib": a.weights_mib,
                    "rollout_kib": rollout_kib,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
