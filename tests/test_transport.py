"""The learner's ZeroMQ hub (control on trio, weights in a thread) against the actor's asyncio client, real sockets.

The hub runs under trio in a background thread; the client side runs asyncio in the test's
thread, as the two run in different processes in production.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time

import numpy as np
import pytest
import trio
import zmq
import zmq.asyncio

from agentgym.actors.transport import ActorRejected, ControlLink, LearnerUnreachable, fetch_weights
from agentgym.learner.transport import WeightSnapshot, open_hub
from agentgym.netutil import free_port_pair
from agentgym.protocol import Heartbeat, Hello, Reject, WeightsReady, Welcome, RolloutSpec, decode, encode
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
    return Welcome(run_id="r", actor_index=0, weights_port=port + 1, model_path="/m", model_fingerprint="fp",
                   mode="async", heartbeat_interval_s=1, actor_timeout_s=10, rollout=spec)  # fmt: skip


def test_handshake_messages_and_malformed_frames_over_real_sockets() -> None:
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    with HubThread(addr) as ht:

        async def client() -> None:
            ctx = zmq.asyncio.Context()
            link = ControlLink(ctx, addr, "a1")
            # garbage first: the hub logs and counts it, and keeps serving
            await link.sock.send_multipart([b"not", b"agentgym"])
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


def test_no_learner_gives_a_clear_error_not_a_hang() -> None:
    port = free_port_pair()

    async def client() -> None:
        ctx = zmq.asyncio.Context()
        link = ControlLink(ctx, f"tcp://127.0.0.1:{port}", "a3")
        with pytest.raises(LearnerUnreachable, match=f"no agentgym learner answered at tcp://127.0.0.1:{port} within 3 s"):
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
        return WeightSnapshot.build(version, version, 3, make_chunks(version, tensors, chunk_bytes=20_000))

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


def test_a_learner_that_does_not_read_pushes_back_on_the_actor_and_loses_nothing() -> None:
    # The inbox has no queue of its own: messages the learner has not read wait in ZeroMQ, at
    # most inbox_size per actor, then in TCP and the actor's send queue, and then the actor's
    # sends wait. A real actor thread sends far more than those buffers hold while trio reads
    # nothing; it must be pushed back before it has sent them all, and once trio reads, every
    # message arrives, in order.
    from agentgym.protocol import Episode, Rollout
    from agentgym.protocol.arrays import F32, I32, U8, pack

    n, t = 400, 25_000  # 400 rollouts of ~200 KB: more than the HWMs and loopback TCP buffers hold
    ep = Episode(token_ids=pack(range(t), I32), logprobs=pack([0.0] * t, F32), loss_mask=pack([1] * t, U8),
                 versions=pack([0] * t, I32), turn_ends=pack([t], I32), turn_rewards=pack([1.0], F32),
                 reward=1.0, success=True, finish="done", turn_limit=2)  # fmt: skip
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    pushed_back = threading.Event()
    sent_when_pushed_back: list[int] = []

    def actor() -> None:
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.ROUTING_ID, b"a1")
        s.setsockopt(zmq.SNDHWM, 8)
        s.connect(addr)
        for i in range(n):
            frames = encode(Rollout(group_id=str(i), actor_id="a1", env="e", task_id=i, episodes=[ep]))
            try:
                s.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                if not pushed_back.is_set():
                    sent_when_pushed_back.append(i)
                    pushed_back.set()
                s.send_multipart(frames)  # now wait for room, as ControlLink.send does
        s.close(linger=10_000)
        ctx.term()

    got: list[int] = []

    async def learner() -> None:
        async with open_hub(addr, inbox_size=4) as hub:
            thread = threading.Thread(target=actor, daemon=True)
            thread.start()
            assert await trio.to_thread.run_sync(pushed_back.wait, 30), "the actor was never pushed back"
            with trio.fail_after(30):  # a deadlock guard, not a timing
                async for _, msg in hub.inbox:
                    got.append(int(msg.group_id))  # type: ignore[attr-defined]
                    if len(got) == n:
                        break
            await trio.to_thread.run_sync(thread.join, 10)

    trio.run(learner)
    assert got == list(range(n))
    assert sent_when_pushed_back and sent_when_pushed_back[0] < n // 2


def test_a_burst_of_rollouts_is_all_acked_in_order_while_the_learner_falls_behind() -> None:
    # Many rollouts in flight from a real actor link into a hub whose trio side falls behind now
    # and then (inbox_size 4: ZeroMQ holds few per actor): every rollout arrives once, in order,
    # and every ack comes back once, in order (nothing dropped: the HWMs push back instead).
    from agentgym.protocol import Ack, Episode, Rollout
    from agentgym.protocol.arrays import F32, I32, U8, pack

    n, window = 300, 32
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    ep = Episode(token_ids=pack(range(64), I32), logprobs=pack([0.0] * 64, F32), loss_mask=pack([1] * 64, U8),
                 versions=pack([0] * 64, I32), turn_ends=pack([64], I32), turn_rewards=pack([1.0], F32),
                 reward=1.0, success=True, finish="done", turn_limit=2)  # fmt: skip
    got: list[str] = []
    ready = threading.Event()

    async def learner() -> None:
        async with open_hub(addr, inbox_size=4) as hub:
            ready.set()
            async for peer, msg in hub.inbox:
                got.append(msg.group_id)
                hub.send(peer, Ack(group_ids=[msg.group_id], statuses=["accepted"]))
                if len(got) % 40 == 0:
                    await trio.sleep(0.05)  # fall behind: the actor must wait, not lose anything
                if len(got) == n:
                    await trio.sleep(0.3)  # let the last acks leave
                    return

    thread = threading.Thread(target=trio.run, args=(learner,), daemon=True)
    thread.start()
    assert ready.wait(10)

    async def actor() -> list[str]:
        ctx = zmq.asyncio.Context()
        link = ControlLink(ctx, addr, "a1")
        acked: list[str] = []
        for i in range(n):
            await link.send(Rollout(group_id=f"g{i}", actor_id="a1", env="e", task_id=i, episodes=[ep]))
            while i + 1 - len(acked) >= window:
                msg = await asyncio.wait_for(link.recv(), 10)
                assert isinstance(msg, Ack) and msg.statuses == ["accepted"]
                acked += msg.group_ids
        while len(acked) < n:
            acked += (await asyncio.wait_for(link.recv(), 10)).group_ids  # type: ignore[attr-defined]
        link.close()
        ctx.term()
        return acked

    acked = asyncio.run(actor())
    thread.join(10)
    assert got == [f"g{i}" for i in range(n)]
    assert acked == [f"g{i}" for i in range(n)]


def test_a_burst_that_lands_while_trio_is_busy_and_a_send_takes_its_signal_is_all_acked() -> None:
    # ZeroMQ's FD is edge-triggered and any call on the socket takes its signal. Here the inbox
    # sleeps on the FD; trio is then held up (a task computing without awaiting) while a real
    # actor thread sends a burst and stops; the busy task then sends on the socket (as the
    # reaper's heartbeats do), which processes ZeroMQ's pending commands and takes the burst's
    # signal. The actor sends nothing more until every message is acked, so only the inbox's
    # rules (drain until EVENTS says empty; a send that finds a message waiting wakes the
    # sleeping reader) get the burst read: without them this hangs until the deadlock guard.
    from agentgym.protocol import Ack

    n = 200
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    trio_busy, burst_sent = threading.Event(), threading.Event()
    acked: list[int] = []

    def actor() -> None:
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.ROUTING_ID, b"a1")
        s.connect(addr)
        s.send_multipart(encode(Heartbeat(actor_id="a1", weight_version=-1)))  # connected and seen
        assert s.poll(10_000) and decode(s.recv_multipart())[0] == Heartbeat(weight_version=0)
        assert trio_busy.wait(10)
        for i in range(n):
            s.send_multipart(encode(Heartbeat(actor_id="a1", weight_version=i)))
        burst_sent.set()
        while len(acked) < n and s.poll(15_000):
            msg, _ = decode(s.recv_multipart())
            if isinstance(msg, Ack):
                acked.extend(int(g) for g in msg.group_ids)
        s.close(linger=0)
        ctx.term()

    got: list[int] = []

    async def learner() -> None:
        async with open_hub(addr) as hub, trio.open_nursery() as nursery:
            thread = threading.Thread(target=actor, daemon=True)
            thread.start()
            it = aiter(hub.inbox)
            peer, first = await anext(it)
            assert first.weight_version == -1  # type: ignore[attr-defined]
            hub.send(peer, Heartbeat(weight_version=0))

            async def busy_then_send() -> None:
                await trio.sleep(0.2)  # the reader is asleep on the FD by now
                trio_busy.set()
                burst_sent.wait(10)  # trio held up: nothing reads while the burst lands
                time.sleep(0.3)  # let ZeroMQ's I/O thread queue it (its signal pending on the FD)
                hub.send(peer, Heartbeat(weight_version=1))  # processes the pending commands

            nursery.start_soon(busy_then_send)
            with trio.fail_after(20):  # a deadlock guard, not a timing
                async for p, msg in it:
                    got.append(msg.weight_version)  # type: ignore[attr-defined]
                    hub.send(p, Ack(group_ids=[str(msg.weight_version)], statuses=["accepted"]))  # type: ignore[attr-defined]
                    if len(got) == n:
                        break
            await trio.to_thread.run_sync(thread.join, 20)

    trio.run(learner)
    assert got == list(range(n))
    assert acked == list(range(n))


def test_a_busy_inbox_still_lets_other_trio_tasks_run() -> None:
    # Messages handed out back to back (the consumer never awaits) still pass through trio
    # checkpoints now and then, so a task beside the consumer runs before the inbox is empty.
    # inproc: each send below is in the ROUTER's queue when it returns, so all n are waiting.
    from agentgym.learner.transport import Inbox

    n = 200
    consumed = 0
    ran_at: list[int] = []
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.bind("inproc://busy-inbox")
    dealer.connect("inproc://busy-inbox")
    for i in range(n):
        dealer.send_multipart(encode(Heartbeat(actor_id="a", weight_version=i)))

    async def main() -> None:
        nonlocal consumed
        inbox = Inbox(router)

        async def other() -> None:
            ran_at.append(consumed)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            async for _ in inbox:
                consumed += 1
                if consumed == n:
                    break

    trio.run(main)
    router.close(0)
    dealer.close(0)
    ctx.term()
    assert consumed == n
    # (at a checkpoint trio may run the consumer first, up to the next one)
    assert ran_at and ran_at[0] <= 2 * Inbox.CHECKPOINT_EVERY < n


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
        assert (await asyncio.wait_for(receiving, 10)).weight_version == 0  # type: ignore[attr-defined]
        await asyncio.sleep(0.2)  # the rest are waiting now: taken without a blocking receive
        assert [(await link.recv()).weight_version for _ in range(4)] == [1, 2, 3, 4]  # type: ignore[attr-defined]
        learner.close(0)
        link.close()
        ctx.term()

    asyncio.run(actor())
