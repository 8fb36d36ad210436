"""Weight distribution at scale, simulated: a weight source and fleets of simulated actors.

    python -m agentgym.cluster.fleet source --bind tcp://10.0.0.1:5555 --actors 32 --versions 3 --mib 8 --out r.json
    python -m agentgym.cluster.fleet actors --learner tcp://10.0.0.1:5555 --count 16 [--relay tcp://127.0.0.1:5560]

The source is the learner's own I/O side (learner/transport.py ``Hub``: control ROUTER and
weight chunk server) without training: it admits ``--actors`` identities (Hello -> Welcome),
then publishes ``--versions`` weight versions of random bytes one after another. For each it
announces WeightsReady to every identity and waits until every one reports, by Heartbeat, that
it serves the version with the right bytes (the crc32 of every tensor it loaded, summed, in
``stats["digest"]``). It records the time from announcing to the last report and the bytes the
learner's weights port sent meanwhile (its egress per update), and writes them to ``--out``.

A fleet process runs ``--count`` actor identities, each with its own control connection, its
own weight fetches (actors/weight_fetch.py, the relay first and the learner as fallback when
``--relay`` is given) and its own simulated engine (actors/engines/sim_engine.py), so hundreds of
actors fit on a few cores: what is simulated is the model, not the distribution.
Used by bench/scale_out.py and tests/test_relay.py.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)
TENSORS = 8


def make_version(version: int, mib: float, seed: int = 0) -> list[tuple[str, bytes]]:
    """``TENSORS`` bfloat16 tensors of random bytes, ``mib`` MiB in all, the same for a seed."""
    rng = random.Random(seed * 100_003 + version)
    per = max(2, int(mib * 2**20 / TENSORS) // 2 * 2)
    return [(f"layer.{i}.weight", rng.randbytes(per)) for i in range(TENSORS)]


def digest(crcs: dict[str, int]) -> int:
    """What a fleet identity reports for the tensors it holds: their crc32s summed mod 2**32."""
    return sum(crcs.values()) % 2**32


# ---------------------------------------------------------------- the source (learner side, trio)
async def serve(
    bind: str,
    actors: int,
    versions: int,
    mib: float,
    chunk_kib: int,
    timeout_s: float,
    insecure: bool = True,
    gap_s: float = 0.5,
) -> dict:
    import trio

    from agentgym.learner.transport import WeightSnapshot, open_hub
    from agentgym.protocol import Heartbeat, Hello, RolloutSpec, Shutdown, WeightsReady, Welcome
    from agentgym.protocol.weights import RawTensor, crc32, make_chunks

    peers: dict[bytes, str] = {}
    serving: dict[str, tuple[int, int]] = {}  # actor id -> (version, digest) last reported
    results: list[dict] = []
    async with open_hub(bind, insecure=insecure) as hub:
        weights_port = int(bind.rsplit(":", 1)[1]) + 1

        def welcome(index: int) -> Welcome:
            spec = RolloutSpec(group_size=1, max_tokens_per_turn=16, max_episode_tokens=64, temperature=1.0, top_p=1.0)
            return Welcome(
                run_id="fleet",
                actor_index=index,
                weights_port=weights_port,
                model_path="-",
                model_fingerprint="-",
                mode="async",
                heartbeat_interval_s=5.0,
                actor_timeout_s=60.0,
                rollout=spec,
            )

        async def receive() -> None:
            async for peer, msg in hub.inbox:
                if isinstance(msg, Hello):
                    peers[peer] = msg.actor_id
                    hub.send(peer, welcome(len(peers) - 1))
                elif isinstance(msg, Heartbeat) and msg.actor_id:
                    serving[msg.actor_id] = (msg.weight_version, int(msg.stats.get("digest", -1)))

        async def until(ok, what: str) -> None:
            with trio.fail_after(timeout_s):
                while not ok():
                    await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            try:
                await until(lambda: len(peers) >= actors, f"{actors} actors to register")
            except trio.TooSlowError:
                raise TimeoutError(
                    f"fleet source: {len(peers)}/{actors} actors registered after {timeout_s:.0f} s"
                ) from None
            log.info("fleet_registered", actors=len(peers))
            for v in range(1, versions + 1):
                raw = make_version(v, mib)
                tensors = [RawTensor(n, "bfloat16", (len(d) // 2,), d) for n, d in raw]
                snap = WeightSnapshot.build(v, make_chunks(v, tensors, chunk_kib * 1024))
                want = digest({n: crc32(d) for n, d in raw})
                hub.publish_weights(snap)
                egress0, chunks0, t0 = hub.weight_bytes_served, hub.weight_chunks_served, time.monotonic()
                ready = WeightsReady(
                    version=v, step=v, turn_limit=1, num_chunks=len(snap.frames), total_bytes=snap.total_bytes
                )
                for peer in peers:
                    hub.send(peer, ready)
                done = lambda v=v, want=want: sum(s == (v, want) for s in serving.values()) >= len(peers)  # noqa: E731
                try:
                    await until(done, f"every actor on v{v}")
                except trio.TooSlowError:
                    raise TimeoutError(
                        f"fleet source: v{v} served by {sum(s == (v, want) for s in serving.values())}"
                        f"/{len(peers)} actors after {timeout_s:.0f} s"
                    ) from None
                rec = {
                    "version": v,
                    "actors": len(peers),
                    "bytes": snap.total_bytes,
                    "chunks": len(snap.frames),
                    "time_to_all_s": time.monotonic() - t0,
                    "egress_bytes": hub.weight_bytes_served - egress0,
                    "egress_chunks": hub.weight_chunks_served - chunks0,
                }
                rec["egress_copies"] = rec["egress_bytes"] / snap.total_bytes
                results.append(rec)
                log.info("fleet_version_served", **rec)
                await trio.sleep(gap_s)
            for peer in peers:
                hub.send(peer, Shutdown(reason="fleet done"))
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
    return {"versions": results, "mib": mib, "chunk_kib": chunk_kib, "actors": actors}


# ---------------------------------------------------------------- a fleet (actor side, asyncio)
async def run_fleet(
    learner: str, count: int, prefix: str, relay: str | None, stall_s: float, connect_timeout_s: float
) -> dict:
    import asyncio

    import zmq.asyncio

    from agentgym.actors.engines.sim_engine import SimEngine
    from agentgym.actors.transport import ControlLink
    from agentgym.actors.weight_fetch import fetch_weights, weights_addr
    from agentgym.protocol import Heartbeat, Hello, Shutdown, WeightsReady

    ctx = zmq.asyncio.Context()
    stats = {"updates": 0}

    async def one(i: int) -> None:
        actor_id = f"{prefix}-{i}"
        link = ControlLink(ctx, learner, actor_id)
        engine = SimEngine(seed=i)
        await engine.start()
        try:
            hello = Hello(actor_id=actor_id, hostname=prefix, pid=i, model_fingerprint="-", engine="sim", max_groups=1)
            welcome = await link.handshake(hello, connect_timeout_s)
            sources = ([relay] if relay else []) + [weights_addr(learner, welcome.weights_port)]
            while True:
                msg = await link.recv()
                if isinstance(msg, Shutdown):
                    return
                if not isinstance(msg, WeightsReady) or msg.version <= engine.version:
                    continue
                version, raw = await fetch_weights(ctx, sources, msg, keys=[None] * len(sources), stall_s=stall_s)
                # The fetched bytes as they are: a SimEngine digests bytes-like values, so torch stays out.
                await engine.update_weights({t.name: t.data for t in raw}, version)  # type: ignore[misc]  # bytes, not tensors
                stats["updates"] += 1
                await link.send(
                    Heartbeat(
                        actor_id=actor_id,
                        weight_version=engine.version,
                        stats={"digest": float(digest(engine.digests))},
                    )
                )
        finally:
            await engine.close()
            link.close()

    try:
        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        ctx.term()
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentgym.cluster.fleet", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="role", required=True)
    s = sub.add_parser("source", help="the learner's side: publish versions, time them")
    s.add_argument("--bind", required=True, help="control address tcp://HOST:PORT (weights on PORT+1)")
    s.add_argument("--actors", type=int, required=True, help="identities to wait for before the first version")
    s.add_argument("--versions", type=int, default=3)
    s.add_argument("--mib", type=float, default=8.0, help="size of each version")
    s.add_argument("--chunk-kib", type=int, default=1024)
    s.add_argument("--gap", type=float, default=0.5, help="seconds between one version served by all and the next")
    s.add_argument("--timeout", type=float, default=300.0)
    s.add_argument("--out", type=Path, required=True)
    a = sub.add_parser("actors", help="simulated actor identities")
    a.add_argument("--learner", required=True)
    a.add_argument("--count", type=int, default=1)
    a.add_argument("--prefix", default="sim")
    a.add_argument("--relay", help="fetch from this relay first, the learner as fallback")
    a.add_argument("--stall", type=float, default=3.0, help="seconds of relay silence before the learner")
    a.add_argument("--connect-timeout", type=float, default=120.0)
    p.add_argument("--log-json", type=Path)
    args = p.parse_args(argv)

    from agentgym.observe.logs import setup_logging

    setup_logging(f"fleet-{args.role}", args.log_json, "info")
    if args.role == "source":
        import trio

        out = trio.run(
            serve, args.bind, args.actors, args.versions, args.mib, args.chunk_kib, args.timeout, True, args.gap
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2))
        return 0
    import asyncio

    stats = asyncio.run(run_fleet(args.learner, args.count, args.prefix, args.relay, args.stall, args.connect_timeout))
    log.info("fleet_done", **stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
