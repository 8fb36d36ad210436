"""Simulated actors that play against a real learner: its control plane under hundreds of actors.

    python -m agentgym.cluster.play_fleet --learner tcp://127.0.0.1:5555 --model models/tiny --count 64 --out f.json

Each of ``--count`` identities in this process is an actor as the learner sees it: Hello with
the model's fingerprint, heartbeats at the Welcome's interval (with its capacity), tickets from
Grants played into Rollouts, Acks, WeightsReady. What is simulated is the play: an episode is
``--prompt`` random prompt tokens (loss mask 0) and one agent turn sampled by a simulated engine
(actors/engines/sim_engine.py, ``--tokens-per-s``, ``--latency``), so its tokens carry the engine's weight
version and valid logprobs, and a random 0/1 reward. Weight versions move through the engine's
real update path with an empty changed-only update (no weight bytes are fetched: the fan-out
of bytes is measured by bench/scale_out.py, this measures the control messages).

Writes counts (rollouts sent, tickets granted, acks per status, heartbeats) to ``--out`` on exit
(the learner's Shutdown, or SIGTERM, on which every identity sends Leave). Used by bench/control_plane.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import zmq.asyncio

    from agentgym.actors.engines.engine import Generation
    from agentgym.protocol import Episode


def _sim_episode(gen: Generation, prompt_len: int, vocab: int, rng: random.Random, turn_limit: int) -> Episode:
    """One simulated episode: ``prompt_len`` random prompt tokens (loss mask 0), then the engine's
    turn ``gen`` with its logprobs and weight versions, and a random 0/1 reward."""
    from agentgym.protocol import Episode

    prompt = np.array([rng.randrange(vocab) for _ in range(prompt_len)], np.int32)
    ids = np.concatenate([prompt, np.array(gen.token_ids, np.int32)])
    n, p = ids.size, prompt_len
    reward = float(rng.random() < 0.5)
    return Episode(
        token_ids=ids.tobytes(),
        logprobs=np.r_[np.zeros(p), gen.logprobs].astype(np.float32).tobytes(),
        loss_mask=np.r_[np.zeros(p), np.ones(n - p)].astype(np.uint8).tobytes(),
        versions=np.r_[np.full(p, -1), gen.versions].astype(np.int32).tobytes(),
        turn_ends=np.array([n], np.int32).tobytes(),
        turn_rewards=np.array([reward], np.float32).tobytes(),
        reward=reward,
        success=reward > 0,
        finish="done",
        turn_limit=turn_limit,
    )


async def _write_counts(counts: Counter, out: Path) -> None:
    """``counts`` to ``out`` every second, so a bench can take rates over a window."""
    while True:
        await asyncio.sleep(1.0)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(counts)))
        tmp.replace(out)


async def _sim_actor(
    i: int,
    args: argparse.Namespace,
    ctx: zmq.asyncio.Context,
    vocab: int,
    fingerprint: str,
    counts: Counter,
    stop: asyncio.Event,
) -> None:
    """Simulated actor ``i`` of the fleet: joins the learner, plays what it is granted on a SimEngine
    and counts what it sends and receives in ``counts``, until a Shutdown (or ``stop``) or a cancel."""
    from agentgym.actors.engines.engine import SamplingSpec
    from agentgym.actors.engines.sim_engine import SimEngine
    from agentgym.actors.transport import ControlLink
    from agentgym.protocol import Ack, Grant, Heartbeat, Hello, Leave, Rollout, Shutdown, WeightsReady

    actor_id = f"{args.prefix}-{i}"
    link = ControlLink(ctx, args.learner, actor_id)
    engine = SimEngine(vocab_size=vocab, tokens_per_s=args.tokens_per_s, latency_s=args.latency, seed=i)
    await engine.start()
    rng = random.Random(i)
    turn_limit = 1
    hello = Hello(
        actor_id=actor_id,
        hostname=args.prefix,
        pid=i,
        model_fingerprint=fingerprint,
        engine="sim",
        max_groups=args.max_groups,
    )
    welcome = await link.handshake(hello, args.connect_timeout)
    spec_max = min(welcome.rollout.max_tokens_per_turn, welcome.rollout.max_episode_tokens - args.prompt)
    tasks: set[asyncio.Task] = set()
    known: set[str] = set()  # tickets playing or unacknowledged: a re-sent Grant repeats them
    serial = iter(range(1 << 62))

    async def episode(ticket, k: int) -> Episode:
        gen = await engine.generate(
            f"{ticket.group_id}/{k}/{next(serial)}", [1] * args.prompt, SamplingSpec(max_tokens=max(1, spec_max))
        )
        return _sim_episode(gen, args.prompt, vocab, rng, turn_limit)

    async def play(ticket) -> None:
        eps = await asyncio.gather(*(episode(ticket, k) for k in range(welcome.rollout.group_size)))
        await link.send(
            Rollout(
                group_id=ticket.group_id,
                actor_id=actor_id,
                env=ticket.env,
                task_id=ticket.task_id,
                episodes=list(eps),
            )
        )
        counts["rollouts_sent"] += 1

    async def heartbeats() -> None:
        while True:
            await asyncio.sleep(welcome.heartbeat_interval_s)
            await link.send(
                Heartbeat(actor_id=actor_id, weight_version=engine.version, stats={"capacity": float(args.max_groups)})
            )
            counts["heartbeats_sent"] += 1

    beat = asyncio.create_task(heartbeats())
    try:
        while not stop.is_set():
            msg = await link.recv()
            counts[f"recv_{type(msg).__name__}"] += 1
            if isinstance(msg, Grant):
                counts["tickets"] += len(msg.tickets)
                for t in msg.tickets:
                    if t.group_id in known:
                        continue
                    known.add(t.group_id)
                    task = asyncio.create_task(play(t))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            elif isinstance(msg, Ack):
                counts.update(f"ack_{s}" for s in msg.statuses)
                known.difference_update(msg.group_ids)
            elif isinstance(msg, WeightsReady):
                turn_limit = msg.turn_limit
                if msg.version > engine.version:
                    await engine.update_weights({}, msg.version)  # the gate and version, no bytes
            elif isinstance(msg, Shutdown):
                stop.set()
    except asyncio.CancelledError:  # SIGTERM: leave as an actor does, so the learner re-issues at once
        try:
            await asyncio.wait_for(link.send(Leave(actor_id=actor_id, reason="SIGTERM")), 1.0)
        except (TimeoutError, OSError):
            pass
        raise
    finally:
        beat.cancel()
        for playing in tasks:
            playing.cancel()
        await engine.close()
        link.close()


async def run_fleet(args: argparse.Namespace) -> Counter:
    import zmq.asyncio

    from agentgym.config import model_fingerprint

    fingerprint = model_fingerprint(Path(args.model))
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    ctx = zmq.asyncio.Context()
    counts: Counter = Counter()
    stop = asyncio.Event()

    loop = asyncio.get_running_loop()
    writer = asyncio.create_task(_write_counts(counts, args.out))
    main = asyncio.gather(*(_sim_actor(i, args, ctx, vocab, fingerprint, counts, stop) for i in range(args.count)))
    loop.add_signal_handler(signal.SIGTERM, main.cancel)
    try:
        await main
    except asyncio.CancelledError:
        pass
    finally:
        writer.cancel()
        ctx.term()
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentgym.cluster.play_fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--learner", required=True)
    p.add_argument("--model", required=True, help="the learner's model directory (fingerprint, vocabulary)")
    p.add_argument("--count", type=int, default=8)
    p.add_argument("--prefix", default="play")
    p.add_argument("--max-groups", type=int, default=2, help="capacity each identity announces")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens per episode")
    p.add_argument("--tokens-per-s", type=float, default=200.0)
    p.add_argument("--latency", type=float, default=0.2)
    p.add_argument("--connect-timeout", type=float, default=120.0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    from agentgym.observe.logs import setup_logging

    setup_logging("play-fleet", None, "warning")
    counts = asyncio.run(run_fleet(args))
    args.out.write_text(json.dumps(dict(counts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
