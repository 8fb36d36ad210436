"""The learner's ZeroMQ hub (control on trio, weights in a thread) against the actor's asyncio client, real sockets.

The hub runs under trio in a background thread; the client side runs asyncio in the test's
thread, as the two run in different processes in production.
"""

from __future__ import annotations

import asyncio
import queue
import threading

import numpy as np
import pytest
import trio
import zmq
import zmq.asyncio

from agentgym.actors.transport import ActorRejected, ControlLink, LearnerUnreachable
from agentgym.actors.weight_fetch import fetch_weights
from agentgym.host.netutil import free_port_pair
from agentgym.learner.transport import WeightSnapshot, open_hub
from agentgym.protocol import Heartbeat, Hello, Reject, RolloutSpec, WeightsReady, Welcome, encode
from agentgym.protocol.weights import RawTensor, make_chunks


class HubThread:
    """Runs open_hub under trio in a thread; commands go in through a queue."""

    def __init__(self, bind: str, max_msg_bytes: int | None = None) -> None:
        self.bind = bind
        self.max_msg_bytes = max_msg_bytes
        self.received: queue.Queue = queue.Queue()
        self.commands: queue.Queue = queue.Queue()
        self.ready = threading.Event()
        self.hub = None
        self.thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    async def _main(self) -> None:
        async with open_hub(self.bind, self.max_msg_bytes) as hub, trio.open_nursery() as n:
            self.hub = hub
            self.ready.set()

            async def pump() -> None:
                async for item in hub.inbox:
                    self.received.put(item)

            n.start_soon(pump)
            while True:
                try:
                    cmd = self.commands.get_nowait()
                except queue.Empty:
                    await trio.sleep(0.01)
                    continue
                if cmd is None:
                    n.cancel_scope.cancel()
                    return
                cmd(hub)

    def __enter__(self) -> HubThread:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.commands.put(None)
        self.thread.join(10)
        assert not self.thread.is_alive()


def hello(actor_id: str = "a1") -> Hello:
    return Hello(actor_id=actor_id, hostname="h", pid=1, model_fingerprint="fp", engine="vllm", max_groups=2)


def welcome(port: int) -> Welcome:
    spec = RolloutSpec(group_size=2, max_tokens_per_turn=4, max_episode_tokens=64, temperature=1.0, top_p=1.0)
    return Welcome(
        run_id="r",
        actor_index=0,
        weights_port=port + 1,
        model_path="/m",
        model_fingerprint="fp",
        mode="async",
        heartbeat_interval_s=1,
        actor_timeout_s=10,
        rollout=spec,
    )


def test_handshake_messages_and_malformed_frames_over_real_sockets() -> None:
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    with HubThread(addr) as ht:

        async def client() -> None:
            ctx = zmq.asyncio.Context()
            link = ControlLink(ctx, addr, "a1")
            # garbage first: the hub logs and counts it, and keeps serving
            await link.send_frames([b"not", b"agentgym"])
            task = asyncio.create_task(link.handshake(hello(), timeout_s=10))
            peer, msg = await asyncio.to_thread(ht.received.get, True, 10)
            assert peer == b"a1" and msg == hello()
            ht.commands.put(lambda hub: hub.send(peer, welcome(port)))
            assert await task == welcome(port)
            await link.send(Heartbeat(actor_id="a1", weight_version=3))
            _, hb = await asyncio.to_thread(ht.received.get, True, 10)
            assert hb.weight_version == 3
            link.close()
            ctx.term()

        asyncio.run(client())
        assert ht.hub.bad_messages == 1


def test_reject_raises_a_clear_error() -> None:
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    with HubThread(addr) as ht:

        async def client() -> None:
            ctx = zmq.asyncio.Context()
            link = ControlLink(ctx, addr, "a2")
            task = asyncio.create_task(link.handshake(hello("a2"), timeout_s=10))
            peer, _ = await asyncio.to_thread(ht.received.get, True, 10)
            ht.commands.put(lambda hub: hub.send(peer, Reject(field="model", reason="fingerprint abc != def")))
            with pytest.raises(ActorRejected, match=r"rejected this actor \(model\): fingerprint abc != def"):
                await task
            link.close()
            ctx.term()

        asyncio.run(client())


def test_a_hello_under_an_id_the_hub_still_holds_gets_through_once_the_old_connection_ends() -> None:
    # ZeroMQ's ROUTER never reads a connection that came under a routing id it still held, not
    # even after the old one ends (libzmq without ROUTER_HANDOVER). An actor restarted under its
    # id before the hub let its old connection go would wait out connect_timeout_s: the handshake
    # connects again after unanswered Hellos instead, and is welcomed.
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    with HubThread(addr) as ht:
        ctx = zmq.Context()
        old = ctx.socket(zmq.DEALER)
        old.setsockopt(zmq.ROUTING_ID, b"a4")
        old.connect(addr)
        old.send_multipart(encode(Heartbeat(actor_id="a4")))
        assert ht.received.get(True, 10)[0] == b"a4"  # the hub holds a4's old connection

        async def client() -> None:
            actx = zmq.asyncio.Context()
            link = ControlLink(actx, addr, "a4")
            task = asyncio.create_task(link.handshake(hello("a4"), timeout_s=60))
            await asyncio.sleep(1.0)  # its first Hello is on a connection the hub will never read
            old.close(linger=0)
            peer, msg = await asyncio.to_thread(ht.received.get, True, 30)
            assert peer == b"a4" and msg == hello("a4")
            ht.commands.put(lambda hub: hub.send(peer, welcome(port)))
            assert await asyncio.wait_for(task, 30) == welcome(port)
            link.close()
            actx.term()

        asyncio.run(client())
        ctx.term()


def test_no_learner_gives_a_clear_error_not_a_hang() -> None:
    port = free_port_pair()

    async def client() -> None:
        ctx = zmq.asyncio.Context()
        link = ControlLink(ctx, f"tcp://127.0.0.1:{port}", "a3")
        with pytest.raises(
            LearnerUnreachable, match=f"no agentgym learner answered at tcp://127.0.0.1:{port} within 3 s"
        ):
            await link.handshake(hello("a3"), timeout_s=3)
        link.close()
        ctx.term()

    asyncio.run(asyncio.wait_for(client(), 20))


def test_weights_are_served_in_chunks_verified_and_superseded_versions_restart() -> None:
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    rng = np.random.default_rng(1)
    arrays = {f"layer{i}.weight": rng.standard_normal((64, 33)).astype(np.float32) for i in range(10)}

    def snapshot(version: int, scale: float) -> WeightSnapshot:
        tensors = [RawTensor(k, "float32", v.shape, (v * scale).tobytes()) for k, v in arrays.items()]
        return WeightSnapshot.build(version, make_chunks(version, tensors, chunk_bytes=20_000))

    with HubThread(addr) as ht:
        s1 = snapshot(1, 1.0)
        ht.commands.put(lambda hub: hub.publish_weights(s1))

        async def client() -> None:
            ctx = zmq.asyncio.Context()
            waddr = f"tcp://127.0.0.1:{port + 1}"
            await asyncio.sleep(0.2)
            ready = WeightsReady(version=1, step=1, turn_limit=3, num_chunks=len(s1.frames), total_bytes=s1.total_bytes)
            version, tensors = await fetch_weights(ctx, waddr, ready, window=3)
            assert version == 1 and len(s1.frames) > 3
            got = {t.name: np.frombuffer(t.data, np.float32).reshape(t.shape) for t in tensors}
            assert got.keys() == arrays.keys() and all(np.array_equal(got[k], arrays[k]) for k in arrays)
            # version 1 is superseded by 2 before this actor asks: it is told, and gets 2 instead
            s2 = snapshot(2, 2.0)
            ht.commands.put(lambda hub: hub.publish_weights(s2))
            await asyncio.sleep(0.2)
            version, tensors = await fetch_weights(ctx, waddr, ready)
            assert version == 2
            got = {t.name: np.frombuffer(t.data, np.float32) for t in tensors}
            assert np.array_equal(got["layer3.weight"], (arrays["layer3.weight"] * 2).ravel())
            ctx.term()

        asyncio.run(asyncio.wait_for(client(), 30))
        assert ht.hub.weight_chunks_served >= 2 * len(s1.frames) - 1


def test_oversized_frame_is_refused_by_the_socket_and_the_hub_goes_on() -> None:
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    with HubThread(addr, max_msg_bytes=1 << 20) as ht:
        ctx = zmq.Context()
        big = ctx.socket(zmq.DEALER)
        big.connect(addr)
        big.send_multipart([b"AG\x01\x04", b"\x00" * ((1 << 20) + 1)])
        ok = ctx.socket(zmq.DEALER)
        ok.setsockopt(zmq.ROUTING_ID, b"ok")
        ok.connect(addr)
        ok.send_multipart(encode(hello("ok")))
        peer, msg = ht.received.get(timeout=10)
        assert peer == b"ok" and msg.actor_id == "ok"
        assert ht.received.empty()
        big.close(0)
        ok.close(0)
        ctx.term()


def test_the_actor_link_receives_beside_a_send_and_takes_queued_replies_in_order() -> None:
    # A receive waiting before the learner is up is woken when it answers; replies that queue up
    # afterwards are taken without a blocking receive, in order.
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"

    async def actor() -> None:
        ctx = zmq.asyncio.Context()
        link = ControlLink(ctx, addr, "a1")
        sending = asyncio.create_task(link.send(Heartbeat(actor_id="a1", weight_version=1)))
        receiving = asyncio.create_task(link.recv())
        await asyncio.sleep(0.3)
        assert not receiving.done()
        learner = zmq.Context.instance().socket(zmq.ROUTER)
        learner.bind(addr)
        peer, *frames = await asyncio.to_thread(learner.recv_multipart)
        assert peer == b"a1"
        await asyncio.wait_for(sending, 10)
        for v in range(5):
            learner.send_multipart([peer, *encode(Heartbeat(weight_version=v))])
        assert (await asyncio.wait_for(receiving, 10)).weight_version == 0  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
        await asyncio.sleep(0.2)  # the rest are waiting now: taken without a blocking receive
        assert [(await link.recv()).weight_version for _ in range(4)] == [1, 2, 3, 4]  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
        learner.close(0)
        link.close()
        ctx.term()

    asyncio.run(actor())
