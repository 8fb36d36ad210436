"""The actor's control link (actors/transport.py ``ControlLink``) on ZeroMQ's FD, real sockets.

The link drives a plain DEALER from the asyncio loop (``add_reader`` on ZeroMQ's FD). That FD
is edge-triggered and any call on the socket takes its signal; these tests hold the link to its
rules: a receive sleeps only after ``EVENTS`` said nothing waits, every call made while someone
sleeps is followed by a look at ``EVENTS`` that serves them (a send that took a message's signal
wakes the receive; a receive that took the signal of room in the send queue sends what waits),
and a send that finds the queue full (HWM) waits for room without losing or reordering anything.
The learner is a raw ROUTER in a thread; the loop is held up with a blocking wait where a test
needs a call to take a signal. Every wait has a deadlock guard; no test asserts a time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import uvloop
import zmq
import zmq.asyncio

from agentgym.actors.transport import ControlLink
from agentgym.host.netutil import free_port_pair
from agentgym.protocol import Episode, Heartbeat, Rollout, decode, encode
from agentgym.protocol.arrays import F32, I32, U8, pack

LOOPS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])


def rollout(i: int, tokens: int = 25_000) -> Rollout:
    """~325 KB encoded at the default size: a few fill ZeroMQ's queues and TCP's buffers. The
    first token id is ``i``: what arrives can be told apart from any other rollout."""
    ep = Episode(
        token_ids=pack(range(i, i + tokens), I32),
        logprobs=pack([0.0] * tokens, F32),
        loss_mask=pack([1] * tokens, U8),
        versions=pack([0] * tokens, I32),
        turn_ends=pack([tokens], I32),
        turn_rewards=pack([1.0], F32),
        reward=1.0,
        success=True,
        finish="done",
        turn_limit=2,
    )
    return Rollout(group_id=str(i), actor_id="a1", env="e", task_id=i, episodes=[ep])


def router(addr: str, rcvhwm: int = 1000, rcvbuf: int | None = None) -> tuple[zmq.Context, zmq.Socket]:
    """The learner's end. ``rcvbuf``: the kernel's receive buffer of its connections, in bytes (set
    before the bind, so each accepted connection has it): a test that needs a send to find no room
    sets it small, since TCP's autotuned buffers on loopback hold megabytes, about as many of
    ``rollout``'s messages as a test sends, and would leave no send waiting."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.RCVHWM, rcvhwm)
    if rcvbuf is not None:
        s.setsockopt(zmq.RCVBUF, rcvbuf)
    s.bind(addr)
    return ctx, s


@asynccontextmanager
async def open_link(addr: str, sndhwm: int | None = None) -> AsyncIterator[ControlLink]:
    ctx = zmq.asyncio.Context()
    link = ControlLink(ctx, addr, "a1")
    if sndhwm is not None:
        link.sock.setsockopt(zmq.SNDHWM, sndhwm)  # applies to the pipe made at connect, too
    try:
        yield link
    finally:  # LINGER: what is queued still leaves; a failed test still ends
        link.close()
        ctx.term()


@LOOPS
def test_sends_that_find_the_queue_full_wait_and_everything_arrives_once_in_order(run) -> None:
    # The learner reads nothing until a send of the actor finds no room (SNDHWM 4, RCVHWM 4,
    # rollouts bigger than TCP's buffers hold in a few), then reads everything: every rollout
    # arrives once, whole, in the order sent, and the sends after the blocked one go on in order.
    # (Whole: the link encodes into one reused buffer; one that waits in line must keep its own.)
    n = 120
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    blocked_at: list[int] = []
    start_reading = threading.Event()
    got: list[int] = []

    def learner() -> None:
        ctx, s = router(addr, rcvhwm=4, rcvbuf=1 << 16)
        assert start_reading.wait(60), "the actor's sends never waited"
        while len(got) < n and s.poll(15_000):
            peer, *frames = s.recv_multipart()
            r = decode(frames)[0]
            got.append(int(r.group_id))  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
            assert r == rollout(got[-1]), f"rollout {got[-1]} arrived with another's content"
        s.close(0)
        ctx.term()

    thread = threading.Thread(target=learner, daemon=True)
    thread.start()

    async def actor() -> None:
        async with open_link(addr, sndhwm=4) as link:
            for i in range(n):
                sending = asyncio.create_task(link.send(rollout(i)))
                await asyncio.sleep(0)  # one loop pass: a send that found room is done by now
                if not sending.done() and not blocked_at:
                    blocked_at.append(i)
                    start_reading.set()
                await asyncio.wait_for(sending, 30)  # a deadlock guard, not a timing

    run(actor())
    thread.join(30)
    assert blocked_at and blocked_at[0] < n // 2  # pushed back, long before the end
    assert got == list(range(n))


@LOOPS
def test_a_burst_whose_signal_a_send_takes_while_the_loop_is_busy_is_all_read(run) -> None:
    # The link's receive sleeps on the FD; the loop is then held up (a coroutine blocking) while
    # the learner sends a burst and stops; the busy coroutine then sends (as the heartbeat loop
    # does), which processes ZeroMQ's pending commands and takes the burst's signal. The learner
    # sends nothing more until every message is acked, so only the link's rules (a send that
    # finds a message waiting wakes the sleeping receive; it reads until EVENTS says empty) get
    # the burst read: without them this hangs until the deadlock guard.
    n = 200
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    loop_busy, burst_sent = threading.Event(), threading.Event()
    acks: list[int] = []

    def learner() -> None:
        ctx, s = router(addr)
        assert s.poll(10_000)
        peer, *_ = s.recv_multipart()  # the actor is connected and known
        assert loop_busy.wait(10)
        for i in range(n):
            s.send_multipart([peer, *encode(Heartbeat(weight_version=i))])
        burst_sent.set()
        while len(acks) < n and s.poll(15_000):
            _, *frames = s.recv_multipart()
            msg = decode(frames)[0]
            if msg.actor_id == "ack":  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
                acks.append(msg.weight_version)  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
        s.close(0)
        ctx.term()

    thread = threading.Thread(target=learner, daemon=True)
    thread.start()
    got: list[int] = []

    async def actor() -> None:
        async with open_link(addr) as link:
            await link.send(Heartbeat(actor_id="a1", weight_version=-1))

            async def receive() -> None:
                while len(got) < n:
                    msg = await link.recv()
                    got.append(msg.weight_version)  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
                    await link.send(Heartbeat(actor_id="ack", weight_version=msg.weight_version))  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent

            receiving = asyncio.create_task(receive())
            await asyncio.sleep(0.2)  # the receive is asleep on the FD by now
            loop_busy.set()
            assert burst_sent.wait(10)  # the loop held up: nothing reads while the burst lands
            time.sleep(0.3)  # let ZeroMQ's I/O thread queue it (its signal pending on the FD)
            await link.send(Heartbeat(actor_id="a1", weight_version=1000))  # processes the pending commands
            await asyncio.wait_for(receiving, 20)  # a deadlock guard, not a timing

    run(actor())
    thread.join(20)
    assert got == list(range(n))
    assert acks == list(range(n))


@LOOPS
def test_a_send_waiting_for_room_whose_signal_a_receive_takes_goes_out(run) -> None:
    # A send waits for room (the learner reads nothing yet); the loop is then held up while the
    # learner reads what is queued (room again: ZeroMQ signals the FD) and answers; the busy
    # coroutine then receives that answer, which takes the signal of the room too. Only the
    # rule that a receive serves waiting sends gets the rest sent: the learner waits for all n.
    n = 40
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    blocked, loop_busy, drained = threading.Event(), threading.Event(), threading.Event()
    got: list[int] = []

    def learner() -> None:
        ctx, s = router(addr, rcvhwm=4, rcvbuf=1 << 16)
        assert blocked.wait(30) and loop_busy.wait(10)
        peer = None
        while s.poll(500):  # all that is queued, until the actor's queue has room again
            peer, *frames = s.recv_multipart()
            got.append(int(decode(frames)[0].group_id))  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
        s.send_multipart([peer, *encode(Heartbeat(weight_version=7))])
        drained.set()
        while len(got) < n and s.poll(15_000):
            _, *frames = s.recv_multipart()
            got.append(int(decode(frames)[0].group_id))  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
        s.close(0)
        ctx.term()

    thread = threading.Thread(target=learner, daemon=True)
    thread.start()

    async def actor() -> None:
        async with open_link(addr, sndhwm=4) as link:

            async def send_all() -> None:
                for i in range(n):
                    one = asyncio.create_task(link.send(rollout(i)))
                    await asyncio.sleep(0)  # one loop pass: a send that found room is done by now
                    if not one.done():
                        blocked.set()  # it waits for room: the FD is all that can wake it
                    await one

            sending = asyncio.create_task(send_all())
            while not blocked.is_set():
                assert not sending.done(), "all sends found room: the test needs one that waits"
                await asyncio.sleep(0.01)
            loop_busy.set()
            assert drained.wait(30)  # the loop held up while the learner frees room and answers
            time.sleep(0.3)  # let ZeroMQ's I/O thread pass on the room and the answer
            assert (await link.recv()).weight_version == 7  # type: ignore[attr-defined]  # the decoded message is of the kind the test sent
            await asyncio.wait_for(sending, 20)  # a deadlock guard, not a timing

    run(actor())
    thread.join(30)
    assert got == list(range(n))


@LOOPS
def test_sends_that_wait_in_line_together_each_arrive_whole(run) -> None:
    # The link encodes each message into one reused buffer, which ZeroMQ copies when it takes the
    # message; a message that has to wait (no learner yet) keeps that buffer and the next send
    # encodes into a new one. Several sends wait in line at once here, small ones (copied by
    # ZeroMQ) and one over COPY_BELOW (sent without a copy); each must arrive with its own content.
    # With a queue of one, room comes and goes while the line is sent: the look at EVENTS after
    # the sends can find room whose signal a send took, and must send on (it once served only
    # receives, and ~1 run in 20 waited forever with room and a message left in line).
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    sizes = [1_000, 2_000, 300_000, 500]  # tokens; 300k: ~3.9 MB encoded, above COPY_BELOW

    async def actor() -> list[Rollout]:
        async with open_link(addr, sndhwm=1) as link:  # ZeroMQ queues one for the learner to come
            sends = [asyncio.create_task(link.send(rollout(i, tokens))) for i, tokens in enumerate(sizes)]
            await asyncio.sleep(0.2)
            assert sum(not s.done() for s in sends) >= 3, "the test needs sends waiting in line"
            ctx, s = router(addr)  # the learner comes up only now
            try:
                await asyncio.wait_for(asyncio.gather(*sends), 30)  # a deadlock guard, not a timing
                got = []
                while len(got) < len(sizes) and s.poll(15_000):
                    got.append(decode(s.recv_multipart()[1:])[0])
                return got  # type: ignore[return-value]  # a list of versions, not Message
            finally:
                s.close(0)
                ctx.term()

    got = run(actor())
    assert [int(r.group_id) for r in got] == list(range(len(sizes)))
    for i, r in enumerate(got):
        assert r == rollout(i, sizes[i]), f"rollout {i} arrived with another's content"


def test_a_link_never_closed_does_not_hang_its_context() -> None:
    # An actor object dropped without close() (a failed start, a test) leaves its link's sockets
    # open; destroying the asyncio context it was made on must close them, not wait forever in
    # term() for sockets it does not know about. The DEALER and its handshake monitor are plain
    # sockets, so this checks they are still made, and tracked, by the caller's context.
    port = free_port_pair()
    ctx = zmq.asyncio.Context()
    link = ControlLink(ctx, f"tcp://127.0.0.1:{port}", "a1")
    assert link.sock in ctx._sockets and link._monitor in ctx._sockets  # noqa: SLF001
    done = threading.Event()

    def destroy() -> None:
        ctx.destroy(linger=0)
        done.set()

    t = threading.Thread(target=destroy, daemon=True)
    t.start()
    assert done.wait(20), "the context's destroy() waited for the link's sockets"
    assert link.sock.closed
