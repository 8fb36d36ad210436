"""The learner's control socket on the trio thread (learner/transport.py ``Inbox``), real sockets.

ZeroMQ's FD is edge-triggered and any call on the socket takes its signal; these tests hold
the inbox to its two rules (read until ``zmq.EVENTS`` says empty before sleeping; a send that
finds a message waiting wakes the sleeping reader), to ZeroMQ's backpressure when the learner
does not read, and to trio checkpoints while it reads back to back. Actors are real sockets in
threads; every wait has a deadlock guard, and no test asserts a time.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import trio
import zmq
import zmq.asyncio

from agentgym.actors.transport import ControlLink
from agentgym.host.netutil import free_port_pair
from agentgym.learner.transport import open_hub
from agentgym.protocol import Heartbeat, decode, encode


def test_a_learner_that_does_not_read_pushes_back_on_the_actor_and_loses_nothing() -> None:
    # The inbox has no queue of its own: messages the learner has not read wait in ZeroMQ, at
    # most inbox_size per actor, then in TCP and the actor's send queue, and then the actor's
    # sends wait. A real actor thread sends far more than those buffers hold while trio reads
    # nothing; it must be pushed back before it has sent them all, and once trio reads, every
    # message arrives, in order.
    from agentgym.protocol import Episode, Rollout
    from agentgym.protocol.arrays import F32, I32, U8, pack

    n, t = 400, 25_000  # 400 rollouts of ~325 KB: more than the HWMs and loopback TCP buffers hold
    ep = Episode(
        token_ids=pack(range(t), I32),
        logprobs=pack([0.0] * t, F32),
        loss_mask=pack([1] * t, U8),
        versions=pack([0] * t, I32),
        turn_ends=pack([t], I32),
        turn_rewards=pack([1.0], F32),
        reward=1.0,
        success=True,
        finish="done",
        turn_limit=2,
    )
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
                    got.append(int(msg.group_id))  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
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
    ep = Episode(
        token_ids=pack(range(64), I32),
        logprobs=pack([0.0] * 64, F32),
        loss_mask=pack([1] * 64, U8),
        versions=pack([0] * 64, I32),
        turn_ends=pack([64], I32),
        turn_rewards=pack([1.0], F32),
        reward=1.0,
        success=True,
        finish="done",
        turn_limit=2,
    )
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
            acked += (await asyncio.wait_for(link.recv(), 10)).group_ids  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
        link.close()
        ctx.term()
        return acked

    acked = asyncio.run(actor())
    thread.join(10)
    assert got == [f"g{i}" for i in range(n)]
    assert acked == [f"g{i}" for i in range(n)]


def test_acks_to_a_burst_are_coalesced_in_order_and_never_overtaken_by_another_message() -> None:
    # hub.ack (what the learner's control loop uses) holds a peer's acks until the inbox has read
    # the burst, then sends them as one Ack; a message of another kind to the same peer sends the
    # pending acks first. A real actor link sends 200 rollouts without waiting; after every 25th
    # the learner also sends a Heartbeat whose weight_version says how many it had acked by then.
    from agentgym.protocol import Ack, Episode, Rollout
    from agentgym.protocol.arrays import F32, I32, U8, pack

    n = 200
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    ep = Episode(
        token_ids=pack(range(64), I32),
        logprobs=pack([0.0] * 64, F32),
        loss_mask=pack([1] * 64, U8),
        versions=pack([0] * 64, I32),
        turn_ends=pack([64], I32),
        turn_rewards=pack([1.0], F32),
        reward=1.0,
        success=True,
        finish="done",
        turn_limit=2,
    )
    ready = threading.Event()

    async def learner() -> None:
        async with open_hub(addr) as hub:
            ready.set()
            got = 0
            async for peer, msg in hub.inbox:
                got += 1
                hub.ack(peer, msg.group_id, "accepted")  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
                if got % 25 == 0:
                    hub.send(peer, Heartbeat(weight_version=got))
                if got == n:
                    await trio.sleep(0.3)  # let the last ack leave
                    return

    thread = threading.Thread(target=trio.run, args=(learner,), daemon=True)
    thread.start()
    assert ready.wait(10)

    async def actor() -> list[object]:
        ctx = zmq.asyncio.Context()
        link = ControlLink(ctx, addr, "a1")
        for i in range(n):
            await link.send(Rollout(group_id=f"g{i}", actor_id="a1", env="e", task_id=i, episodes=[ep]))
        received: list[object] = []
        acked = 0
        while acked < n:
            msg = await asyncio.wait_for(link.recv(), 10)
            received.append(msg)
            acked += len(msg.group_ids) if isinstance(msg, Ack) else 0
        link.close()
        ctx.term()
        return received

    received = asyncio.run(actor())
    thread.join(10)
    acks = [m for m in received if isinstance(m, Ack)]
    assert [g for a in acks for g in a.group_ids] == [f"g{i}" for i in range(n)]
    assert all(st == "accepted" for a in acks for st in a.statuses)
    assert len(acks) < n  # coalesced: fewer messages than rollouts
    assert max(len(a.group_ids) for a in acks) <= 64  # Inbox.ACKS_PER_MESSAGE
    acked_before = 0
    for m in received:  # each heartbeat comes after the acks of every rollout read before it
        if isinstance(m, Ack):
            acked_before += len(m.group_ids)
        else:
            assert isinstance(m, Heartbeat) and acked_before >= m.weight_version, (acked_before, m)


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
            assert first.weight_version == -1  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
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
                    got.append(msg.weight_version)  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
                    hub.send(p, Ack(group_ids=[str(msg.weight_version)], statuses=["accepted"]))  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
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


def _wait_until_free(port: int, deadline_s: float = 10.0) -> None:
    """Until a listening socket can take ``port`` (as ZeroMQ binds it: SO_REUSEADDR)."""
    end = time.monotonic() + deadline_s
    while True:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
                s.listen()
                return
            except OSError:
                if time.monotonic() > end:
                    raise
        time.sleep(0.05)


def test_a_port_in_use_is_named_and_nothing_stays_bound() -> None:
    # The control socket is bound on the trio thread and the weights socket in its thread: a
    # failure of either is an OSError naming the address, and the other socket is released.
    port = free_port_pair()
    ctx = zmq.Context()
    squatter = ctx.socket(zmq.ROUTER)

    async def open_and_close() -> None:
        async with open_hub(f"tcp://127.0.0.1:{port}"):
            pass

    for taken, words in ((port + 1, "weights port"), (port, "cannot bind")):
        squatter.bind(f"tcp://127.0.0.1:{taken}")
        with pytest.raises(OSError, match=f"{words}.*127.0.0.1:{taken}"):
            trio.run(open_and_close)
        squatter.unbind(f"tcp://127.0.0.1:{taken}")
        _wait_until_free(taken)  # unbind is asynchronous in ZeroMQ (its I/O thread closes the port)
    trio.run(open_and_close)  # both ports free again: nothing of the failed tries holds them
    squatter.close(0)
    ctx.term()
