"""The actor's ZeroMQ side (asyncio): a control connection and a weight fetcher.

    link = ControlLink(ctx, "tcp://learner:5555", actor_id)
    welcome = await link.handshake(hello, timeout_s=60)     # clear error, never a hang
    await link.send(rollout); msg = await link.recv()
    tensors = await fetch_weights(ctx, "tcp://learner:5556", ready_msg)

pyzmq's own asyncio sockets drive both (they work on uvloop's loop). The DEALER's routing id is
the actor id, so a reconnect keeps the learner's view of who this is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog
import zmq
import zmq.asyncio

from agentgym.protocol import (
    Hello,
    Message,
    ProtocolError,
    Reject,
    WeightChunk,
    WeightGone,
    WeightRequest,
    WeightsReady,
    Welcome,
    decode,
    encode,
    max_frame_bytes,
)
from agentgym.protocol.weights import Assembler, RawTensor, verify_chunk

log = structlog.get_logger(__name__)


class LearnerUnreachable(RuntimeError):
    """No learner answered the handshake in time."""


class ActorRejected(RuntimeError):
    """The learner refused this actor (model or protocol mismatch); retrying will not help."""


def _socket(ctx: zmq.asyncio.Context, addr: str, identity: bytes | None = None) -> zmq.asyncio.Socket:
    s = ctx.socket(zmq.DEALER)
    if identity is not None:
        s.setsockopt(zmq.ROUTING_ID, identity)
    s.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes())
    s.setsockopt(zmq.LINGER, 1000)
    s.setsockopt(zmq.RECONNECT_IVL, 200)
    s.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    s.connect(addr)
    return s


class ControlLink:
    def __init__(self, ctx: zmq.asyncio.Context, addr: str, actor_id: str) -> None:
        self.addr = addr
        self.sock = _socket(ctx, addr, actor_id.encode())
        self.bad_messages = 0

    async def send(self, msg: Message) -> None:
        await self.sock.send_multipart(encode(msg), copy=False)

    async def recv(self) -> Message:
        """Next valid message; malformed ones are logged and skipped, never fatal."""
        while True:
            frames = await self.sock.recv_multipart()
            try:
                msg, _ = decode(frames)
                return msg
            except ProtocolError as exc:
                self.bad_messages += 1
                log.error("bad_message_from_learner", error=str(exc))

    async def handshake(self, hello: Hello, timeout_s: float, on_other: Callable[[Message], None] | None = None) -> Welcome:
        """Send Hello (again every 2 s) until Welcome; Reject raises, silence raises after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            await self.send(hello)
            left = deadline - time.monotonic()
            if left <= 0:
                raise LearnerUnreachable(
                    f"no agentgym learner answered at {self.addr} within {timeout_s:.0f} s "
                    "(is agentgym-learner running there, and is the port reachable?)"
                )
            try:
                async with asyncio.timeout(min(2.0, left)):
                    while True:
                        msg = await self.recv()
                        if isinstance(msg, Welcome):
                            return msg
                        if isinstance(msg, Reject):
                            raise ActorRejected(f"learner at {self.addr} rejected this actor ({msg.field}): {msg.reason}")
                        if on_other is not None:
                            on_other(msg)
            except TimeoutError:
                log.info("waiting_for_learner", addr=self.addr, left_s=round(left, 1))

    def close(self) -> None:
        self.sock.close(linger=500)


def weights_addr(control_addr: str, port: int) -> str:
    return f"{control_addr.rsplit(':', 1)[0]}:{port}"


async def fetch_weights(
    ctx: zmq.asyncio.Context, addr: str, ready: WeightsReady, *, have_version: int = -1, window: int = 4,
    timeout_s: float = 120.0,
) -> tuple[int, list[RawTensor]]:
    """Pull ``ready.version`` (``window`` requests in flight), each chunk checked by crc32 and
    copied once, from the received frame into its tensors' buffers (protocol/weights.py).

    ``have_version`` >= 0: the caller holds that version and can load a subset of tensors;
    chunks unchanged since (``ready.chunk_versions``) are skipped and only the changed tensors
    are returned. Returns (version, tensors). If the version is superseded while fetching,
    starts over on the latest one, whole, so the result may be newer than asked for.
    """
    sock = _socket(ctx, addr)
    try:
        version, num_chunks = ready.version, ready.num_chunks
        wanted = list(range(num_chunks))
        if have_version >= 0 and len(ready.chunk_versions) == num_chunks:
            wanted = [i for i, v in enumerate(ready.chunk_versions) if v > have_version]
        while True:
            asm, done, next_req = Assembler(), 0, 0
            deadline = time.monotonic() + timeout_s
            restart = None
            while done < len(wanted) and restart is None:
                while next_req < len(wanted) and next_req - done < window:
                    await sock.send_multipart(encode(WeightRequest(version=version, chunk=wanted[next_req])))
                    next_req += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"weights v{version}: {done}/{len(wanted)} chunks from {addr} after {timeout_s:.0f} s")
                async with asyncio.timeout(left):
                    frames = await sock.recv_multipart(copy=False)  # no copy: the assembler copies once
                msg, data = decode([f.buffer for f in frames])
                if isinstance(msg, WeightGone):
                    restart = msg.latest
                elif isinstance(msg, WeightChunk) and msg.version == version:
                    verify_chunk(msg, data[0])
                    asm.add(msg, data[0])
                    done += 1
                    if msg.num_chunks != num_chunks:  # learned the size of a version we restarted on
                        num_chunks = msg.num_chunks
                        wanted = list(range(num_chunks))
            if restart is None:
                return version, asm.finish()
            log.info("weights_superseded", wanted=version, latest=restart)
            # Drain replies of the abandoned version, then ask for the new one's first chunk to learn its size.
            sock.close(linger=0)
            sock = _socket(ctx, addr)
            version, num_chunks, wanted = restart, 1, [0]
    finally:
        sock.close(linger=0)
