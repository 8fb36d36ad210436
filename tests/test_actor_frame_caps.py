"""The actor's own sockets take frames only as large as the run's limits allow (protocol/limits.py),
with real ZeroMQ sockets: a learner-side ROUTER, and real learner hubs serving weights.

  - at the default config the control link's cap is the rollout limits' (a Grant of
    ``actor.max_groups`` tickets, each with a group's hand-over), not the wire's 1 GiB;
  - a frame over it never reaches the actor: the connection is dropped unread, the actor logs
    ``learner_connection_dropped`` naming the peer and the cap, reconnects, and the next message
    arrives;
  - a weights source that sends a chunk larger than the manifest's ``total_bytes`` allows is
    refused unread and left for the next source (``weights_source_stalled`` names it and the cap);
    the fetch completes, exact, from the honest one.
"""

from __future__ import annotations

import asyncio
import queue

import numpy as np
import structlog
import zmq
import zmq.asyncio
from test_transport import HubThread

from agentgym.actors.transport import ControlLink
from agentgym.actors.weight_fetch import fetch_weights
from agentgym.config import Config
from agentgym.host.netutil import free_port_pair
from agentgym.learner.transport import WeightSnapshot
from agentgym.protocol import Grant, Handover, Heartbeat, PartialEpisode, Ticket, WeightsReady, encode
from agentgym.protocol.arrays import F32, I32, U8, pack
from agentgym.protocol.limits import MiB, actor_control_frame, weights_frame
from agentgym.protocol.weights import RawTensor, make_chunks


def test_the_default_control_cap_is_the_rollout_limits() -> None:
    from agentgym.actors.runtime import Actor

    cfg = Config()
    actor = Actor(cfg, "a1")
    try:
        cap = actor.link.sock.getsockopt(zmq.MAXMSGSIZE)
        r = cfg.rollout
        assert (
            cap == actor_control_frame(r.group_size, r.max_episode_tokens, cfg.actor.max_groups) == actor.link.max_frame
        )
        assert cap < 128 * MiB, cap  # 8 episodes of 1,024 tokens, 16 groups: ~53 MiB, not 1 GiB
    finally:
        actor.link.close()
        actor.ctx.term()


def big_grant(tokens: int) -> Grant:
    """A Grant whose one ticket carries a hand-over of an episode of ``tokens`` tokens."""
    n = np.arange(tokens)
    p = PartialEpisode(
        token_ids=pack(n, I32),
        logprobs=pack(np.zeros(tokens), F32),
        loss_mask=pack(np.ones(tokens), U8),
        versions=pack(np.zeros(tokens), I32),
        turn_ends=pack([tokens], I32),
        turn_rewards=pack([0.0], F32),
        actions=["a"],
        observation_sha256="0" * 64,
        turn_limit=2,
    )
    h = Handover(group_id="g1", actor_id="a0", partial=[p])
    return Grant(tickets=[Ticket(group_id="g1", env="guess_number", task_id=1, handover=h)])


def test_a_frame_over_the_control_cap_is_refused_logged_and_the_link_goes_on() -> None:
    # The actor's limits: groups of 2 episodes of at most 64 tokens, 1 group at a time (~1.7 MiB).
    cap = actor_control_frame(group_size=2, max_episode_tokens=64, max_groups=1)
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    with HubThread(addr) as ht:  # the learner's real control socket

        def from_learner(msg) -> None:
            ht.commands.put(lambda hub: hub.send(b"a1", msg))

        async def heard(what: str) -> None:
            async with asyncio.timeout(20):
                while True:
                    try:
                        peer, msg = ht.received.get_nowait()
                        assert peer == b"a1", peer
                        return
                    except queue.Empty:
                        await asyncio.sleep(0.05)

        async def main() -> list[dict]:
            ctx = zmq.asyncio.Context()
            link = ControlLink(ctx, addr, "a1", max_frame=cap)
            try:
                await link.send(Heartbeat(actor_id="a1"))
                await heard("the first heartbeat")
                # A Grant within the limits arrives; one whose hand-over passes them does not.
                from_learner(big_grant(32))
                async with asyncio.timeout(20):
                    assert isinstance(await link.recv(), Grant)
                too_big = big_grant(200_000)  # 2.5 MiB: an episode far past 64 tokens
                assert len(encode(too_big)[1]) > cap
                from_learner(too_big)
                with structlog.testing.capture_logs() as logs:
                    async with asyncio.timeout(20):
                        while link.report_drops() == 0:  # the actor's heartbeat does this each tick
                            await asyncio.sleep(0.05)  # (it connects again RECONNECT_AFTER_S after the drop)
                # Connected again; the actor says Hello again (here a heartbeat does), and the
                # learner's next message arrives.
                await link.send(Heartbeat(actor_id="a1"))
                await heard("a heartbeat after the drop")
                from_learner(Heartbeat(weight_version=7))
                async with asyncio.timeout(20):
                    got = await link.recv()
                assert isinstance(got, Heartbeat) and got.weight_version == 7, got
                return logs
            finally:
                link.close()
                ctx.term()

        logs = asyncio.run(main())
    drops = [e for e in logs if e["event"] == "learner_connection_dropped"]
    assert drops and drops[0]["peer"] == addr and drops[0]["frame_cap_bytes"] == cap, logs


def test_a_weights_source_sending_chunks_over_the_manifest_is_left_for_the_next() -> None:
    rng = np.random.default_rng(0)
    honest = rng.standard_normal(1000).astype(np.float32)
    huge = rng.standard_normal(600_000).astype(np.float32)  # 2.3 MiB: over the honest manifest's cap

    def snapshot(a: np.ndarray) -> WeightSnapshot:
        chunks = make_chunks(4, [RawTensor("w", "float32", a.shape, a.tobytes())], 8 * MiB)
        return WeightSnapshot.build(4, chunks)

    bad_port, good_port = free_port_pair(), free_port_pair()
    good = snapshot(honest)
    ready = WeightsReady(version=4, step=4, turn_limit=3, num_chunks=1, total_bytes=good.total_bytes, tensors=1)
    cap = weights_frame(ready.total_bytes, ready.tensors)
    with HubThread(f"tcp://127.0.0.1:{bad_port}") as bad_ht, HubThread(f"tcp://127.0.0.1:{good_port}") as good_ht:
        bad_ht.commands.put(lambda hub: hub.publish_weights(snapshot(huge)))
        good_ht.commands.put(lambda hub: hub.publish_weights(good))
        bad, honest_src = f"tcp://127.0.0.1:{bad_port + 1}", f"tcp://127.0.0.1:{good_port + 1}"

        async def client():
            ctx = zmq.asyncio.Context()
            await asyncio.sleep(0.3)
            try:
                return await fetch_weights(ctx, [bad, honest_src], ready, stall_s=2.0, timeout_s=30, max_frame=cap)
            finally:
                ctx.term()

        with structlog.testing.capture_logs() as logs:
            version, raw = asyncio.run(asyncio.wait_for(client(), 60))
    assert version == 4 and np.array_equal(np.frombuffer(raw[0].data, np.float32), honest)
    stalled = [e for e in logs if e["event"] == "weights_source_stalled"]
    assert stalled and stalled[0]["source"] == bad and stalled[0]["frame_cap_bytes"] == cap, logs
    assert len(huge) * 4 > cap > ready.total_bytes


def test_an_actor_whose_config_caps_below_the_learners_limits_connects_again_with_theirs(tmp_path) -> None:
    from agentgym.actors.runtime import Actor
    from agentgym.config import load_config
    from agentgym.protocol import Hello, RolloutSpec, Welcome

    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    (tmp_path / "config.json").write_text("{}")  # a model directory of its own: its Hello has a fingerprint
    cfg = load_config(
        None,
        [
            f'actor.learner="{addr}"',
            f'model.path="{tmp_path}"',
            "rollout.group_size=1",
            "rollout.max_episode_tokens=8",
            "actor.max_groups=1",
        ],
    )
    spec = RolloutSpec(group_size=8, max_tokens_per_turn=64, max_episode_tokens=4096, temperature=1.0, top_p=1.0)
    with HubThread(addr) as ht:
        hellos: list[Hello] = []

        def learner() -> None:  # answers every Hello with a Welcome carrying its own limits
            peer, msg = ht.received.get(timeout=20)
            assert isinstance(msg, Hello)
            hellos.append(msg)
            welcome = Welcome(
                run_id="r",
                actor_index=0,
                weights_port=port + 1,
                model_path=str(tmp_path),
                model_fingerprint=msg.model_fingerprint,
                mode="async",
                heartbeat_interval_s=1.0,
                actor_timeout_s=30.0,
                rollout=spec,
            )
            ht.commands.put(lambda hub: hub.send(peer, welcome))

        async def main() -> tuple[int, int, list[dict]]:
            actor = Actor(cfg, "a1")
            before = actor.link.max_frame
            try:
                with structlog.testing.capture_logs() as logs:
                    task = asyncio.ensure_future(actor.connect())
                    for _ in range(2):
                        await asyncio.to_thread(learner)
                    await asyncio.wait_for(task, 20)
                return before, actor.link.sock.getsockopt(zmq.MAXMSGSIZE), logs
            finally:
                actor.link.close()
                actor.ctx.term()

        before, after, logs = asyncio.run(main())
    assert before == actor_control_frame(1, 8, 1) and after == actor_control_frame(8, 4096, 1) > before
    assert [e["frame_cap_bytes"] for e in logs if e["event"] == "control_frame_cap_raised"] == [after]
    assert len(hellos) == 2 and hellos[0].session == hellos[1].session  # the same actor, said again
