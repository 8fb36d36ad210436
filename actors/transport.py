"""The actor's control connection to the learner (asyncio); weights come by actors/weight_fetch.py.

    link = ControlLink(ctx, "tcp://learner:5555", actor_id)
    welcome = await link.handshake(hello, timeout_s=60)     # clear error, never a hang
    await link.send(rollout); msg = await link.recv()

The control link drives a plain DEALER from the running loop (``loop.add_reader`` on ZeroMQ's FD,
which works on uvloop's loop and asyncio's own), without pyzmq's asyncio layer and its Future and
loop callback per call. The DEALER's routing id is the actor id, so a reconnect keeps the
learner's view of who this is.

ZeroMQ's FD is edge-triggered and shared by send and receive: it signals that the socket has
commands to process, and any call on the socket (a send, a receive, a look at ``zmq.EVENTS``)
processes them and takes the signal with it. The link keeps the learner's two rules
(docs/adr/0003-concurrency.md), for both directions:
  - a receive sleeps only right after ``EVENTS`` said no message is waiting, and a send that
    found the send queue full (HWM, or no learner connected yet) only right after a failed
    send and a look at ``EVENTS`` said there is still no room; no await between look and sleep;
  - after every call on the socket made while someone sleeps (a send, a receive, the FD's own
    callback), ``EVENTS`` is looked at again and whoever it can serve is served: waiting sends
    go out, in order, and sleeping receives wake.
Sends are non-blocking: one that finds no room, or others already waiting, waits in line
(no busy loop, no message lost or reordered), which is how a learner that falls behind pushes
back on the actor.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import cast

import structlog
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from agentgym.auth.keys import ClientKeys, apply_client
from agentgym.host.netutil import EVENTS, MORE, NOBLOCK, POLLIN, POLLOUT, zmtp_mechanism
from agentgym.protocol import (
    Hello,
    Message,
    ProtocolError,
    Reject,
    VersionMismatch,
    Welcome,
    decode,
    encode_into,
    max_frame_bytes,
)

log = structlog.get_logger(__name__)


class LearnerUnreachable(RuntimeError):
    """No learner answered the handshake in time."""


class ActorRejected(RuntimeError):
    """The learner refused this actor (model or protocol mismatch); retrying will not help."""


def dealer_socket(
    ctx: zmq.Context,
    addr: str,
    identity: bytes | None = None,
    keys: ClientKeys | None = None,
    before_connect: Callable[[zmq.Socket], None] | None = None,
    plain: bool = False,
    max_frame: int | None = None,
) -> zmq.Socket:
    """A DEALER to ``addr`` with the actor's settings: routing id, CURVE keys, frame limit,
    linger, reconnect back-off (``before_connect`` runs just before the connect).

    ``max_frame``: the largest frame accepted (protocol/limits.py; None: the wire's ceiling).
    ZeroMQ drops the connection on a larger one before reading it, and connects again."""
    # plain: a blocking-API socket even on an asyncio context, still made (and so tracked) by
    # ``ctx``: its destroy() closes it, and a context dropped without close never hangs in term.
    s = ctx.socket(zmq.DEALER, socket_class=zmq.Socket) if plain else ctx.socket(zmq.DEALER)
    if identity is not None:
        s.setsockopt(zmq.ROUTING_ID, identity)
    apply_client(s, keys)  # CURVE: talk only to the learner holding keys.server's secret
    s.setsockopt(zmq.MAXMSGSIZE, max_frame or max_frame_bytes())
    s.setsockopt(zmq.LINGER, 1000)
    s.setsockopt(zmq.RECONNECT_IVL, 200)
    s.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    if before_connect is not None:
        before_connect(s)
    s.connect(addr)
    return s


_HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_MONITORED = _HANDSHAKE_EVENTS | zmq.EVENT_DISCONNECTED


VAGUE_FAILURES_DEFINITE = 3
"""Handshakes failed with no detail (a connection reset mid-greeting) before the actor gives up;
one that names its cause (key refused, keys on one side only) is definite at once. A keyless actor
that gives up this way reads the learner's greeting itself first (``zmtp_mechanism``): CURVE there
makes the answer definite too."""


def _handshake_problem(event: int, keys: ClientKeys | None) -> str:
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return "the learner refused this actor's CURVE key: copy its public key (NAME.key) into the learner's learner.authorized_keys directory"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and keys is None:
        return "the learner requires CURVE keys and this actor has none: set actor.secret_key and actor.learner_key (--secret-key, --learner-key)"
    if keys is not None:
        return "the CURVE handshake failed: actor.learner_key is not the public key of the learner at this address, or the learner has no keys"
    return (
        "the connection handshake failed again and again: the learner may require CURVE keys (this actor has "
        "none: set actor.secret_key and actor.learner_key), or it is not an agentgym learner of the same release"
    )


def _send_parts(sock: zmq.Socket, frames: Sequence[bytes | bytearray], copy: bool) -> None:
    """``sock.send_multipart(frames, NOBLOCK, copy=copy)`` without its per-part Python checks
    (~1.5 µs a message). Raises zmq.Again at the first part only: ZeroMQ takes the rest of a
    message whose first part it took."""
    *parts, last = frames
    for part in parts:
        sock.send(part, MORE, copy=copy)
    sock.send(last, NOBLOCK, copy=copy)


COPY_BELOW = 1024 * 1024
"""Frames smaller than this are copied into ZeroMQ's buffer when sent (see ControlLink.send)."""

RECONNECT_AFTER_S = 1.0
"""How long after a connection dropped (or was closed) the actor connects again under the same
routing id: the learner's ROUTER must have let the old connection go first, else it takes the
new one for a duplicate and ignores its routing id (ZeroMQ's ROUTER without ROUTER_HANDOVER)."""

HELLOS_BEFORE_RECONNECT = 3
"""Hellos left unanswered (2 s each) before the handshake connects again: see RECONNECT_AFTER_S."""


class ControlLink:
    """The actor's control DEALER, driven from the running asyncio loop; see the module docstring
    for the edge-trigger rules this class keeps."""

    def __init__(
        self, ctx: zmq.Context, addr: str, actor_id: str, keys: ClientKeys | None = None, max_frame: int | None = None
    ) -> None:
        self.addr = addr
        self.keys = keys
        self.max_frame = max_frame or max_frame_bytes()
        """The largest frame this link takes from the learner (protocol/limits.py)."""
        self._monitor: zmq.Socket | None = None
        self._problem: str | None = None  # the last handshake's named failure, if it failed
        self._vague_failures = 0  # handshakes failed with no detail since the last success
        self._drops: list[str] = []  # endpoints whose connection dropped, not yet reported
        self._reconnect_at: float | None = None  # when to connect again after a drop

        def watch(s: zmq.Socket) -> None:  # before connect: the first handshake is seen too
            # get_monitor_socket would make the PAIR with the context's own (asyncio) class.
            monitor_addr = f"inproc://agentgym-link-monitor-{id(self)}"
            s.monitor(monitor_addr, _MONITORED)
            self._monitor = ctx.socket(zmq.PAIR, socket_class=zmq.Socket)
            self._monitor.connect(monitor_addr)

        # A plain socket on the caller's context (asyncio or not): no Future per call.
        self.sock: zmq.Socket = dealer_socket(
            ctx, addr, actor_id.encode(), keys, watch, plain=True, max_frame=self.max_frame
        )
        self._fd: int = cast(int, self.sock.getsockopt(zmq.FD))
        self._loop: asyncio.AbstractEventLoop | None = None  # where the FD is watched, from the first wait on
        self._readers: list[asyncio.Future[None]] = []  # receives asleep until a message waits
        self._senders: deque[tuple[Sequence[bytes | bytearray], bool, asyncio.Future[None]]] = (
            deque()
        )  # sends waiting for room, in order
        self._scratch = bytearray()  # where send() encodes; see there
        self.bad_messages = 0

    # ------------------------------------------------------------------ the FD
    def _watch(self) -> asyncio.AbstractEventLoop:
        """Watch the FD from the running loop (once; again if the link moved to another loop)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._unwatch()
            loop.add_reader(self._fd, self._serve)
            self._loop = loop
        return loop

    def _unwatch(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._loop = None

    def _serve(self) -> None:
        """Give the waiters what a fresh look at ``EVENTS`` allows. Runs when the FD signals, and
        after any call on the socket while someone waits: that call may have taken the signal."""
        while True:
            events = cast(int, self.sock.getsockopt(EVENTS))
            # The sends may have taken a signal: a message's, or that of room freed meanwhile,
            # which the look after them then finds and must act on (nothing signals it again).
            if not (self._senders and events & POLLOUT and self._flush()):
                break
        if self._readers and events & POLLIN:
            readers, self._readers = self._readers, []
            for fut in readers:
                if not fut.done():
                    fut.set_result(None)

    def _flush(self) -> bool:
        """Send what waits for room, in order, until ZeroMQ says again that there is none.
        True if the line got shorter."""
        sock, senders = self.sock, self._senders
        before, retried = len(senders), False
        while senders:
            frames, copy, fut = senders[0]
            if fut.done():  # cancelled while waiting: never sent
                senders.popleft()
                continue
            try:
                _send_parts(sock, frames, copy)
            except zmq.Again:
                # Asleep again only after a look at EVENTS found no room (it arms the signal).
                # (One retry if it did find room: the signal is armed either way, no spin.)
                if not retried and cast(int, sock.getsockopt(EVENTS)) & POLLOUT:
                    retried = True
                    continue
                break
            senders.popleft()
            fut.set_result(None)
        return len(senders) < before

    def _handshake_refused(self) -> str | None:
        """Why ZeroMQ's handshake with the learner failed (CURVE key refused, keys on one side
        only, wrong learner key), if it did and has not succeeded since; None otherwise."""
        self._read_monitor()
        if self._problem is None and self._vague_failures >= VAGUE_FAILURES_DEFINITE:
            # Resets kept ZeroMQ from reading the learner's greeting; a raw read of it names the cause.
            if self.keys is None and zmtp_mechanism(self.addr) == "CURVE":
                return _handshake_problem(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, None)
            return _handshake_problem(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, self.keys)
        return self._problem

    def _read_monitor(self) -> None:
        while self._monitor is not None:
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            ev = parse_monitor_message(frames)
            event = ev["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self._drops.append(ev["endpoint"].decode(errors="replace"))
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._problem, self._vague_failures = None, 0
            elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                # Often the peer's close racing its greeting (a reset before it was read): ZeroMQ
                # connects again, and the next try usually names the cause. Vague until repeated.
                self._vague_failures += 1
            else:
                self._problem = _handshake_problem(event, self.keys)

    def report_drops(self) -> int:
        """Log each connection to the learner that dropped since the last call, and connect
        again (the actor's heartbeat calls it, then says Hello again); returns how many.

        ZeroMQ drops a connection when a frame over ``max_frame`` arrives, before reading it (its
        size is not known then), and does not reconnect after such a protocol error: this does.
        A learner or network that went away drops it too (ZeroMQ would reconnect; a fresh
        connect does the same). Messages queued for the old connection are lost: the re-Hello
        gets the learner's tickets and weights again, and unacked rollouts are sent again."""
        self._read_monitor()
        drops, self._drops = self._drops, []
        for peer in drops:
            log.warning(
                "learner_connection_dropped",
                peer=peer,
                frame_cap_bytes=self.max_frame,
                why="a frame from the peer over frame_cap_bytes (refused unread), or the peer or network went away; reconnecting",
            )
        if drops:
            self._reconnect_at = time.monotonic() + RECONNECT_AFTER_S
        if self._reconnect_at is not None and time.monotonic() >= self._reconnect_at:
            self._reconnect_at = None
            try:
                self.sock.disconnect(self.addr)
            except zmq.ZMQError:  # already gone
                pass
            self.sock.connect(self.addr)
            if self._readers or self._senders:  # the calls may have taken a signal they wait on
                self._serve()
            return max(1, len(drops))
        return 0

    # ------------------------------------------------------------------ messages
    async def send(self, msg: Message) -> None:
        """Queue ``msg`` in ZeroMQ; waits only while its send queue is full (or no learner is
        connected yet). Sends complete in the order they were called; a cancelled one is not sent."""
        # Encoded into one reused buffer, which ZeroMQ copies during the send (below COPY_BELOW:
        # a zero-copy frame costs a wake-up of pyzmq's garbage-collector thread, and its turn at
        # the GIL, per message: more than copying a rollout of a few hundred KiB). A message that
        # goes without a copy, or waits in line, keeps the buffer, and the next one gets a new one.
        frames = encode_into(msg, self._scratch)
        copy = len(self._scratch) < COPY_BELOW
        sent = self._send_now(frames, copy)
        if not (sent and copy):
            self._scratch = bytearray()
        if not sent:
            await self._wait_in_line(frames, copy)

    def _send_now(self, frames: Sequence[bytes | bytearray], copy: bool) -> bool:
        """Send at once if none wait in line and ZeroMQ has room; False otherwise."""
        if self._senders:
            return False
        try:
            _send_parts(self.sock, frames, copy)
        except zmq.Again:
            return False
        if self._readers:  # the send may have taken the signal of a message that arrived
            self._serve()
        return True

    async def send_frames(self, frames: list[bytes], copy: bool = True) -> None:
        """Send already-encoded frames, as ``send`` does (tests use it to send malformed ones)."""
        if not self._send_now(frames, copy):
            await self._wait_in_line(frames, copy)

    async def _wait_in_line(self, frames: Sequence[bytes | bytearray], copy: bool) -> None:
        """Wait behind the sends already waiting until ZeroMQ has room, then send (see _flush)."""
        loop = self._watch()
        fut = loop.create_future()
        self._senders.append((frames, copy, fut))
        self._serve()  # arms the signal (a look at EVENTS), or sends now if room came meanwhile
        try:
            await fut
        finally:
            if not fut.done():  # cancelled: out of the line, not sent
                fut.cancel()
                for i, waiting in enumerate(self._senders):
                    if waiting[2] is fut:
                        del self._senders[i]
                        break

    async def _recv_frames(self) -> list[bytes]:
        sock = self.sock
        while True:
            events = cast(int, sock.getsockopt(EVENTS))
            if self._senders and events & POLLOUT and self._flush():  # this look may have taken their signal
                continue  # the sends may have taken a message's signal: look again
            if events & POLLIN:
                try:
                    frames = sock.recv_multipart(NOBLOCK)
                except zmq.Again:
                    continue
                if self._senders or self._readers:  # the receive may have taken a signal they wait on
                    self._serve()
                return frames
            # EVENTS just said nothing is waiting, which arms the FD's signal for the next
            # arrival; nothing touches the socket before this task is listed (no await between).
            fut = self._watch().create_future()
            self._readers.append(fut)
            try:
                await fut
            finally:
                if not fut.done():
                    fut.cancel()
                if fut in self._readers:
                    self._readers.remove(fut)

    async def recv(self) -> Message:
        """Next valid message; malformed ones are logged and skipped, never fatal."""
        while True:
            frames = await self._recv_frames()
            try:
                msg, _ = decode(frames)
                return msg
            except VersionMismatch as exc:
                # The learner's Reject of our Hello is framed in its own version: say both.
                raise ActorRejected(
                    f"learner at {self.addr} speaks agentgym protocol version {exc.theirs}, "
                    f"this actor {exc.ours}; run the same agentgym release on both"
                ) from None
            except ProtocolError as exc:
                self.bad_messages += 1
                log.error("bad_message_from_learner", error=str(exc))

    async def handshake(
        self, hello: Hello, timeout_s: float, on_other: Callable[[Message], None] | None = None
    ) -> Welcome:
        """Send Hello (again every 2 s) until Welcome; Reject raises, silence raises after timeout_s."""
        deadline, unanswered = time.monotonic() + timeout_s, 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LearnerUnreachable(
                    f"no agentgym learner answered at {self.addr} within {timeout_s:.0f} s "
                    "(is agentgym-learner running there, and is the port reachable? If the learner uses CURVE keys: "
                    + (
                        "is this actor's public key in its learner.authorized_keys directory, and actor.learner_key "
                        "the learner's public key?)"
                        if self.keys
                        else "this actor has none: set actor.secret_key and actor.learner_key)"
                    )
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
                            raise ActorRejected(
                                f"learner at {self.addr} rejected this actor ({msg.field}): {msg.reason}"
                            )
                        if on_other is not None:
                            on_other(msg)
            except TimeoutError:
                refused = self._handshake_refused()
                if refused is not None:  # a definite answer: waiting longer will not change it
                    raise ActorRejected(f"learner at {self.addr}: {refused}") from None
                log.info("waiting_for_learner", addr=self.addr, left_s=round(left, 1))
                unanswered += 1
                if unanswered % HELLOS_BEFORE_RECONNECT == 0:
                    # A ROUTER never reads a connection that came under a routing id it still held
                    # (this id's old connection, not yet ended there); a new one, made after, it reads.
                    self.sock.disconnect(self.addr)
                    await asyncio.sleep(RECONNECT_AFTER_S)
                    self.sock.connect(self.addr)

    def close(self) -> None:
        """Close the socket (waiting sends and receives are cancelled; what was sent leaves
        within the linger)."""
        self._unwatch()
        for fut in [*self._readers, *(waiting[2] for waiting in self._senders)]:
            fut.cancel()
        self._readers.clear()
        self._senders.clear()
        if self._monitor is not None:
            self.sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        self.sock.close(linger=500)
