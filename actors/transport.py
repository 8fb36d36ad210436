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
from zmq.utils.monitor import parse_monitor_message

from agentgym.keys import ClientKeys, apply_client

from agentgym.protocol import (
    Hello,
    Message,
    ProtocolError,
    Reject,
    VersionMismatch,
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


def _socket(
    ctx: zmq.asyncio.Context, addr: str, identity: bytes | None = None, keys: ClientKeys | None = None,
    before_connect: Callable[[zmq.asyncio.Socket], None] | None = None,
) -> zmq.asyncio.Socket:
    s = ctx.socket(zmq.DEALER)
    if identity is not None:
        s.setsockopt(zmq.ROUTING_ID, identity)
    apply_client(s, keys)  # CURVE: talk only to the learner holding keys.server's secret
    s.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes())
    s.setsockopt(zmq.LINGER, 1000)
    s.setsockopt(zmq.RECONNECT_IVL, 200)
    s.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    if before_connect is not None:
        before_connect(s)
    s.connect(addr)
    return s


_HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                     | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)  # fmt: skip


def _handshake_problem(event: int, keys: ClientKeys | None) -> str:
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return "the learner refused this actor's CURVE key: copy its public key (NAME.key) into the learner's learner.authorized_keys directory"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and keys is None:
        return "the learner requires CURVE keys and this actor has none: set actor.secret_key and actor.learner_key (--secret-key, --learner-key)"
    if keys is not None:
        return "the CURVE handshake failed: actor.learner_key is not the public key of the learner at this address, or the learner has no keys"
    return "the connection handshake failed (is this an agentgym learner of the same release?)"


COPY_BELOW = 1024 * 1024
"""Frames smaller than this are copied into ZeroMQ's buffer when sent (see ControlLink.send)."""


class ControlLink:
    def __init__(self, ctx: zmq.asyncio.Context, addr: str, actor_id: str, keys: ClientKeys | None = None) -> None:
        self.addr = addr
        self.keys = keys
        self._monitor: zmq.asyncio.Socket | None = None

        def watch(s: zmq.asyncio.Socket) -> None:  # before connect: the first handshake is seen too
            self._monitor = s.get_monitor_socket(_HANDSHAKE_EVENTS)

        self.sock = _socket(ctx, addr, actor_id.encode(), keys, watch)
        self.bad_messages = 0
        self._sending = 0  # sends under way (awaiting room in the queue): see recv()

    async def _handshake_refused(self) -> str | None:
        """Why ZeroMQ's handshake with the learner failed (CURVE key refused, keys on one side
        only, wrong learner key), if it did and has not succeeded since; None otherwise."""
        problem = None
        while self._monitor is not None:
            try:
                frames = await self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            event = parse_monitor_message(frames)["event"]
            problem = None if event == zmq.EVENT_HANDSHAKE_SUCCEEDED else _handshake_problem(event, self.keys)
        return problem

    async def send(self, msg: Message) -> None:
        # Copied into ZeroMQ's buffer below COPY_BELOW: a zero-copy frame costs a wake-up of
        # pyzmq's garbage-collector thread (and its turn at the GIL) per message, more than
        # copying a rollout of a few hundred KiB; larger ones still go without a copy.
        frames = encode(msg)
        self._sending += 1
        try:
            await self.sock.send_multipart(frames, copy=len(frames[1]) < COPY_BELOW)
        finally:
            self._sending -= 1

    async def recv(self) -> Message:
        """Next valid message; malformed ones are logged and skipped, never fatal."""
        while True:
            # A message already waiting is taken without the Future and event-loop round of a
            # blocking asyncio recv (the common case: acks queue up behind rollouts in flight).
            # Not while a send waits for room: this recv could consume the edge of ZeroMQ's FD
            # that was to wake it; the blocking path below re-checks every event it waits on.
            frames = None
            if not self._sending:
                try:
                    frames = await self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    pass
            if frames is None:
                frames = await self.sock.recv_multipart()
            try:
                msg, _ = decode(frames)
                return msg
            except VersionMismatch as exc:
                # The learner's Reject of our Hello is framed in its own version: say both.
                raise ActorRejected(f"learner at {self.addr} speaks agentgym protocol version {exc.theirs}, "
                                    f"this actor {exc.ours}; run the same agentgym release on both") from None
            except ProtocolError as exc:
                self.bad_messages += 1
                log.error("bad_message_from_learner", error=str(exc))

    async def handshake(self, hello: Hello, timeout_s: float, on_other: Callable[[Message], None] | None = None) -> Welcome:
        """Send Hello (again every 2 s) until Welcome; Reject raises, silence raises after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LearnerUnreachable(
                    f"no agentgym learner answered at {self.addr} within {timeout_s:.0f} s "
                    "(is agentgym-learner running there, and is the port reachable? If the learner uses CURVE keys: "
                    + ("is this actor's public key in its learner.authorized_keys directory, and actor.learner_key "
                       "the learner's public key?)" if self.keys else "this actor has none: set actor.secret_key "
                       "and actor.learner_key)")
                )
            try:
                async with asyncio.timeout(min(2.0, left)):
                    # The send can block too: a DEALER holds messages only for a connected peer,
                    # and a learner that refuses this actor's CURVE handshake never becomes one.
                    await self.send(hello)
                    while True:
                        msg = await self.recv()
                        if isinstance(msg, Welcome):
                            return msg
                        if isinstance(msg, Reject):
                            raise ActorRejected(f"learner at {self.addr} rejected this actor ({msg.field}): {msg.reason}")
                        if on_other is not None:
                            on_other(msg)
            except TimeoutError:
                refused = await self._handshake_refused()
                if refused is not None:  # a definite answer: waiting longer will not change it
                    raise ActorRejected(f"learner at {self.addr}: {refused}") from None
                log.info("waiting_for_learner", addr=self.addr, left_s=round(left, 1))

    def close(self) -> None:
        if self._monitor is not None:
            self.sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        self.sock.close(linger=500)


def weights_addr(control_addr: str, port: int) -> str:
    return f"{control_addr.rsplit(':', 1)[0]}:{port}"


async def fetch_weights(
    ctx: zmq.asyncio.Context, addr: str | list[str], ready: WeightsReady, *, have_version: int = -1, window: int = 4,
    timeout_s: float = 120.0, keys: ClientKeys | None | list[ClientKeys | None] = None, stall_s: float = 5.0,
) -> tuple[int, list[RawTensor]]:
    """Pull ``ready.version`` (``window`` requests in flight), each chunk checked by crc32 and
    copied once, from the received frame into its tensors' buffers (protocol/weights.py).

    ``have_version`` >= 0: the caller holds that version and can load a subset of tensors;
    chunks unchanged since (``ready.chunk_versions``) are skipped and only the changed tensors
    are returned. Returns (version, tensors). If the version is superseded while fetching,
    starts over on the latest one, whole, so the result may be newer than asked for.

    ``addr`` may list sources, best first (a relay, then the learner), with ``keys`` one per
    source: a source that sends nothing for ``stall_s`` while others remain is abandoned for the
    next; the chunks already verified are kept, and the rest are asked of the next source for
    the same version (a chunk is accepted only for the version being assembled, so sources never
    mix versions). The last source gets the whole ``timeout_s``.
    """
    sources = [addr] if isinstance(addr, str) else list(addr)
    source_keys = keys if isinstance(keys, list) else [keys] * len(sources)
    if not sources or len(source_keys) != len(sources):
        raise ValueError(f"fetch_weights: {len(sources)} sources but {len(source_keys)} keys")
    at = 0
    sock = _socket(ctx, sources[at], keys=source_keys[at])
    try:
        version, num_chunks = ready.version, ready.num_chunks
        wanted = list(range(num_chunks))
        if have_version >= 0 and len(ready.chunk_versions) == num_chunks:
            wanted = [i for i, v in enumerate(ready.chunk_versions) if v > have_version]
        while True:
            asm, got, in_flight = Assembler(), set(), []
            todo = list(reversed(wanted))  # popped from the end: ascending
            deadline = time.monotonic() + timeout_s
            restart = None
            while len(got) < len(wanted) and restart is None:
                last = at == len(sources) - 1
                left = deadline - time.monotonic() if last else stall_s
                try:
                    if left <= 0:
                        raise TimeoutError
                    async with asyncio.timeout(left):  # sends too: no peer (refused by CURVE) blocks them
                        while todo and len(in_flight) < window:
                            chunk = todo.pop()
                            await sock.send_multipart(encode(WeightRequest(version=version, chunk=chunk)))
                            in_flight.append(chunk)
                        frames = await sock.recv_multipart(copy=False)  # no copy: the assembler copies once
                except TimeoutError:
                    if last:
                        raise TimeoutError(
                            f"weights v{version}: {len(got)}/{len(wanted)} chunks from {sources[at]} after {timeout_s:.0f} s"
                        ) from None
                    log.warning("weights_source_stalled", source=sources[at], next=sources[at + 1], version=version,
                                chunks_done=len(got), chunks=len(wanted), stall_s=stall_s)  # fmt: skip
                    sock.close(linger=0)
                    at += 1
                    sock = _socket(ctx, sources[at], keys=source_keys[at])
                    todo += sorted(in_flight, reverse=True)  # asked again of the next source, first
                    in_flight = []
                    deadline = time.monotonic() + timeout_s
                    continue
                msg, data = decode([f.buffer for f in frames])
                if isinstance(msg, WeightGone):
                    restart = msg.latest
                elif isinstance(msg, WeightChunk) and msg.version == version and msg.chunk not in got:
                    verify_chunk(msg, data[0])
                    asm.add(msg, data[0])
                    got.add(msg.chunk)
                    if msg.chunk in in_flight:
                        in_flight.remove(msg.chunk)
                    if msg.num_chunks != num_chunks:  # learned the size of a version we restarted on
                        num_chunks = msg.num_chunks
                        wanted = list(range(num_chunks))
                        todo = sorted(set(wanted) - got - set(in_flight), reverse=True)
            if restart is None:
                return version, asm.finish()
            log.info("weights_superseded", wanted=version, latest=restart)
            # Drain replies of the abandoned version, then ask for the new one's first chunk to learn its size.
            sock.close(linger=0)
            sock = _socket(ctx, sources[at], keys=source_keys[at])
            version, num_chunks, wanted = restart, 1, [0]
    finally:
        sock.close(linger=0)
