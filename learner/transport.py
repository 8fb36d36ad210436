"""The learner's ZeroMQ side: the control socket on the trio thread, weights in an I/O thread.

    async with open_hub(bind="tcp://0.0.0.0:5555") as hub:
        hub.publish_weights(snapshot)           # served from the weights thread, no trio round trip
        async for peer, msg in hub.inbox: ...   # decoded, validated messages from actors
        hub.send(peer, Welcome(...))            # non-blocking, from the trio thread only
        hub.ack(peer, group_id, "accepted")     # coalesced per peer, sent once the burst is read

Control (docs/adr/0003-concurrency.md): the control ROUTER belongs to the trio thread, with no
thread hop either way. The inbox reads it when asked for the next message and, when none is
waiting, sleeps on ZeroMQ's FD (``trio.lowlevel.wait_readable``). That FD is edge-triggered and
shared by send and receive: it signals that the socket has commands to process, and any call on
the socket (a send, a receive, a look at ``zmq.EVENTS``) processes them and takes the signal
with it. Two rules keep every message seen:
  - the inbox sleeps only right after ``EVENTS`` said no message is waiting (that look arms the
    signal for the next arrival), with no await between the look and the sleep;
  - every send looks at ``EVENTS`` afterwards and, if a message is waiting while the inbox
    sleeps, wakes it: the send may have taken that message's signal.
Backpressure is ZeroMQ's own: messages the learner has not read wait in the socket, at most
``inbox_size`` per actor (the receive high-water mark); past that, TCP and the actor's send
queue fill and the actor's sends wait. The training step runs in a worker thread
(learner/service.py), so the inbox keeps being read while it computes.

Weights: a daemon thread owns the weights ROUTER (control port + 1) and serves chunks from the
latest immutable snapshot, so weight traffic never waits on trio or on training. It queues at
most ``WEIGHT_REPLIES_QUEUED`` replies per peer (protocol/limits.py): past that a reply is
dropped and logged (``weight_reply_dropped``), so a peer that asks and never reads cannot make
the learner hold more.

Both ROUTERs are mandatory: a send ZeroMQ cannot queue (the peer's queue is full, or the peer is
gone) raises, and is counted and logged where it was sent, instead of vanishing.

With CURVE keys (agentgym/auth/server.py) ZeroMQ's ZAP handshake admits only allow-listed actors on both
ports: frames of any other peer never reach this module. A Hello of another protocol version is
answered with a Reject naming both versions.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import cast

import structlog
import trio
import zmq

from agentgym.auth.server import AllowList, ServerKeys, check_bind, make_server, start_authenticator
from agentgym.host.netutil import EVENTS, NOBLOCK, POLLIN, RCVMORE, log_send_drop
from agentgym.protocol import (
    PROTOCOL_VERSION,
    Ack,
    AckStatus,
    Message,
    ProtocolError,
    Reject,
    VersionMismatch,
    WeightChunk,
    WeightGone,
    WeightRequest,
    decode,
    encode,
    max_frame_bytes,
)
from agentgym.protocol.limits import WEIGHT_REPLIES_QUEUED, WEIGHT_REQUESTS_QUEUED

log = structlog.get_logger(__name__)
_ids = itertools.count()


class Inbox:
    """The control ROUTER, read and written on the trio thread: ``async for peer, msg in hub.inbox``.

    Yields decoded, validated messages; malformed frames are counted and logged (a flood is
    not a log flood) and a Hello of another protocol version gets a Reject. See the module
    docstring for the edge-trigger rules this class keeps.
    """

    CHECKPOINT_EVERY: int = 32
    """Messages handed out back to back, while more keep waiting, between two trio checkpoints."""
    ACKS_PER_MESSAGE: int = 64
    """Most group ids one coalesced Ack carries."""

    def __init__(self, sock: zmq.Socket, user_ids: bool = False) -> None:
        self._sock = sock
        self._user_ids = user_ids
        self.user_id = ""
        """The ZAP user id (the CURVE public key, z85) of the connection the message handed out
        last came from ('' without keys): read it right after each message (learner/control/actor_control.py)."""
        self._fd: int = cast(int, sock.getsockopt(zmq.FD))
        self._sleeping: trio.CancelScope | None = None  # set while the reader waits on the FD
        self._since_checkpoint = 0
        self._acks: dict[bytes, Ack] = {}  # per peer, not yet sent: see ack()
        self.closed = False
        self.bad_messages = 0
        self.version_rejects = 0
        self.sends_dropped = 0
        """Messages ZeroMQ refused to queue: the actor's queue was full (it does not read) or it is gone."""
        self._sndhwm = cast(int, sock.getsockopt(zmq.SNDHWM))

    def __aiter__(self) -> Inbox:
        return self

    async def __anext__(self) -> tuple[bytes, Message]:
        sock = self._sock
        while not self.closed:
            # A busy inbox must not starve the other tasks, but a checkpoint per message is a
            # scheduler pass per message. Taken before the receive: a cancel here loses nothing.
            self._since_checkpoint += 1
            if self._since_checkpoint >= self.CHECKPOINT_EVERY:
                self._since_checkpoint = 0
                self.flush_acks()
                await trio.lowlevel.checkpoint()
            # Receive first, look at EVENTS only when nothing came: a receive processes ZeroMQ's
            # pending commands only every so often or when its queue runs dry, a look at EVENTS
            # every time (a poll of the command pipe: a system call per message in a burst).
            try:
                peer, frames = self._recv()
            except zmq.Again:
                pass
            else:
                msg = self._decode(peer, frames)
                if msg is not None:
                    return peer, msg
                continue
            if cast(int, sock.getsockopt(EVENTS)) & POLLIN:
                continue  # arrived meanwhile (the look processed the commands announcing it)
            if self._acks:
                self.flush_acks()  # the burst is read: answer it, then look again (the sends used the socket)
                continue
            # EVENTS just said nothing is waiting, which arms the FD's signal for the next arrival;
            # nothing else touches the socket before the wait (one thread, no await in between).
            with trio.CancelScope() as scope:
                self._sleeping = scope
                try:
                    await trio.lowlevel.wait_readable(self._fd)
                except trio.ClosedResourceError:
                    break  # closed under the wait (open_hub's exit)
                finally:
                    self._sleeping = None
            self._since_checkpoint = 0  # woken by the FD or by a send: loop and look again
        raise StopAsyncIteration

    def _recv(self) -> tuple[bytes, list[bytes | memoryview]]:
        """One message: the peer's id, then its frames (raises zmq.Again when none is waiting).
        The id and the header are small and copied; the body and any data frame are not: decode
        reads them in ZeroMQ's buffer and copies out what it keeps. (pyzmq's recv_multipart
        makes a Frame object of every part: twice the cost per message.)"""
        sock = self._sock
        peer = sock.recv(NOBLOCK)
        frames: list[bytes | memoryview] = []
        if self._user_ids and sock.getsockopt(RCVMORE):
            # With keys, the header's Frame says which key the connection authenticated with:
            # the actor id it names must be that key's (one key, one identity).
            head = sock.recv(NOBLOCK, copy=False)
            self.user_id = cast(str, head.get("User-Id")) or ""  # pyzmq types get() as int | str
            frames.append(head.bytes)
        while sock.getsockopt(RCVMORE):  # the parts of one message arrive together: no Again here
            frames.append(sock.recv(NOBLOCK, copy=False).buffer if frames else sock.recv(NOBLOCK))
        return peer, frames

    def _decode(self, peer: bytes, frames: list[bytes | memoryview]) -> Message | None:
        try:
            msg, _ = decode(frames)
            return msg
        except VersionMismatch as exc:
            # Named, so the actor's operator sees both versions; nothing about the model.
            self.bad_messages += 1
            self.version_rejects += 1
            if self.version_rejects <= 20 or self.version_rejects % 1000 == 0:
                log.warning("protocol_version_rejected", peer=peer.hex(), theirs=exc.theirs, ours=exc.ours)
            reason = f"actor speaks agentgym protocol version {exc.theirs}, the learner speaks {PROTOCOL_VERSION}"
            self.send(peer, encode(Reject(field="protocol_version", reason=reason)))
        except ProtocolError as exc:
            self.bad_messages += 1
            if self.bad_messages <= 20 or self.bad_messages % 1000 == 0:
                log.error("bad_message", peer=peer.hex(), error=str(exc)[:500], count=self.bad_messages)
        return None

    def ack(self, peer: bytes, group_id: str, status: AckStatus) -> None:
        """Acknowledge one rollout. Acks to a peer are coalesced into one Ack message, sent when
        the inbox has read every message waiting (before it sleeps or yields to other tasks),
        before any other message to that peer (order is kept), or at ``ACKS_PER_MESSAGE`` ids: a
        burst of rollouts costs one encode, one send and one actor-side decode instead of one each."""
        pending = self._acks.get(peer)
        if pending is None:
            pending = self._acks[peer] = Ack(group_ids=[], statuses=[])
        pending.group_ids.append(group_id)
        pending.statuses.append(status)
        if len(pending.group_ids) >= self.ACKS_PER_MESSAGE:
            self._send_now(peer, encode(self._acks.pop(peer)))

    def flush_acks(self) -> None:
        """Send every coalesced Ack now."""
        acks, self._acks = self._acks, {}
        for peer, a in acks.items():
            self._send_now(peer, encode(a))

    def send(self, peer: bytes, frames: list[bytes | memoryview]) -> None:
        """Queue ``frames`` for ``peer`` without waiting (trio thread only), after its pending acks."""
        pending = self._acks.pop(peer, None)
        if pending is not None:
            self._send_now(peer, encode(pending))
        self._send_now(peer, frames)

    def _send_now(self, peer: bytes, frames: list[bytes | memoryview]) -> None:
        try:
            self._sock.send_multipart([peer, *frames], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the ROUTER is mandatory: a drop raises instead of vanishing
            self.sends_dropped += 1
            log_send_drop(log, "send_dropped", peer, exc, self.sends_dropped, queued_cap=self._sndhwm)
        # The send processed the socket's pending commands and may have taken the FD's signal
        # of a message that arrived meanwhile: if the reader sleeps on the FD, have it look again.
        if self._sleeping is not None and cast(int, self._sock.getsockopt(EVENTS)) & POLLIN:
            self._sleeping.cancel()

    def close(self) -> None:
        """End the iteration (a reader asleep on the FD wakes and stops); pending acks leave first."""
        if not self.closed:
            self.flush_acks()
        self.closed = True
        if self._sleeping is not None:
            self._sleeping.cancel()


@dataclass(frozen=True)
class WeightSnapshot:
    """One weight version, its chunks pre-encoded as ZeroMQ frames."""

    version: int
    frames: list[list[bytes | memoryview]]
    total_bytes: int

    @classmethod
    def build(cls, version: int, chunks: Sequence[tuple[WeightChunk, bytes | memoryview]]) -> WeightSnapshot:
        frames = [encode(msg, data) for msg, data in chunks]
        return cls(version, frames, sum(len(d) for _, d in chunks))


def weights_address(control: str) -> str:
    """The weight server listens on the control port + 1."""
    head, port = control.rsplit(":", 1)
    return f"{head}:{int(port) + 1}"


class Hub:
    """The control inbox on the trio thread and the weight server's thread; see the module docstring."""

    def __init__(
        self,
        bind: str,
        inbox_size: int = 1024,
        max_msg_bytes: int | None = None,
        keys: ServerKeys | None = None,
        weights_max_bytes: int | None = None,
        peer_timeout_s: float | None = None,
    ) -> None:
        self.bind = bind
        self.peer_timeout_s = peer_timeout_s
        """Control connections silent this long, ZeroMQ's own pings unanswered, are closed (below)."""
        self.keys = keys
        self.inbox_size = inbox_size
        self.max_msg_bytes = max_msg_bytes or max_frame_bytes()
        self.weights_max_bytes = weights_max_bytes or self.max_msg_bytes
        """The weights port's frame cap (learner/control/bounds.py: only WeightRequests come in there)."""
        self._ctx = zmq.Context()
        self._control: zmq.Socket | None = None
        self.inbox: Inbox  # set by open() once the control socket is bound
        self._snapshot: WeightSnapshot | None = None
        self._stop_addr = f"inproc://agentgym-hub-stop-{next(_ids)}"
        self._stop = self._ctx.socket(zmq.PUSH)  # owned by the trio thread; tells the weights thread to end
        self._stop.connect(self._stop_addr)  # inproc may connect before the thread binds
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.bad_weight_requests = 0
        self.weight_replies_dropped = 0
        """Replies the weights port refused to queue (see ``_reply``)."""
        self.weight_chunks_served = 0
        self.weight_bytes_served = 0
        """Weight payload bytes sent (the learner's weight egress, chunk data without headers)."""
        self.allow: AllowList | None = None
        """The CURVE allow-list (with its refusal count) when keys are configured."""

    @property
    def bad_messages(self) -> int:
        """Malformed frames on either port (each logged where it was read)."""
        return self.inbox.bad_messages + self.bad_weight_requests

    @property
    def version_rejects(self) -> int:
        return self.inbox.version_rejects

    # ---------------------------------------------------------------- trio thread
    def open(self) -> None:
        try:
            self._control = self._make_router(self.bind, rcvhwm=self.inbox_size, peer_timeout_s=self.peer_timeout_s)
        except zmq.ZMQError as exc:
            raise OSError(f"learner cannot bind {self.bind}: {exc}") from None
        self.inbox = Inbox(self._control, user_ids=self.keys is not None)

    def send(self, peer: bytes, msg: Message) -> None:
        self.inbox.send(peer, encode(msg))

    def ack(self, peer: bytes, group_id: str, status: AckStatus) -> None:
        self.inbox.ack(peer, group_id, status)

    def flush_acks(self) -> None:
        """Send coalesced acks now (the inbox does when asked for a message and none is waiting)."""
        self.inbox.flush_acks()

    def publish_weights(self, snapshot: WeightSnapshot) -> None:
        self._snapshot = snapshot  # one reference swap: the weights thread sees old or new, whole

    def close_control(self) -> None:
        self.inbox.close()
        if self._control is not None:
            trio.lowlevel.notify_closing(cast(int, self._control.getsockopt(zmq.FD)))
            self._control.close()  # LINGER: what was sent last (Shutdown) still leaves, until ctx.term()

    def stop(self) -> None:
        try:
            self._stop.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    # ---------------------------------------------------------------- both sockets
    def _make_router(
        self,
        addr: str,
        rcvhwm: int,
        sndhwm: int = 10_000,
        max_bytes: int | None = None,
        peer_timeout_s: float | None = None,
    ) -> zmq.Socket:
        s = self._ctx.socket(zmq.ROUTER)
        if peer_timeout_s is not None:
            # ZMTP pings, answered by the peer's ZeroMQ thread: a connection whose host died (no FIN,
            # no RST) is closed after peer_timeout_s, and with it the routing id it held, which the
            # ROUTER would otherwise keep until TCP gives up, never reading a new connection under it.
            s.setsockopt(zmq.HEARTBEAT_IVL, max(100, int(peer_timeout_s * 1000 / 4)))
            s.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(peer_timeout_s * 1000))
        s.setsockopt(zmq.MAXMSGSIZE, max_bytes or self.max_msg_bytes)  # refuse oversized frames before reading them
        s.setsockopt(zmq.LINGER, 2000)
        s.setsockopt(zmq.SNDHWM, sndhwm)
        s.setsockopt(zmq.RCVHWM, rcvhwm)
        # A send past SNDHWM, or to a peer that is gone, raises instead of vanishing: it is counted
        # and logged where it is sent (a ROUTER drops such a message silently otherwise).
        s.setsockopt(zmq.ROUTER_MANDATORY, 1)
        make_server(s, self.keys)  # CURVE: ZAP admits only allow-listed actors, before any frame
        try:
            s.bind(addr)
        except zmq.ZMQError:
            s.close(linger=0)
            raise
        return s

    # ---------------------------------------------------------------- weights thread
    def _run(self) -> None:
        try:
            weights = self._make_router(
                weights_address(self.bind),
                rcvhwm=WEIGHT_REQUESTS_QUEUED,
                sndhwm=WEIGHT_REPLIES_QUEUED,
                max_bytes=self.weights_max_bytes,
            )
        except zmq.ZMQError as exc:
            self._error = OSError(f"learner cannot bind its weights port {weights_address(self.bind)}: {exc}")
            self._ready.set()
            return
        stop = self._ctx.socket(zmq.PULL)
        stop.bind(self._stop_addr)
        self._ready.set()
        poller = zmq.Poller()
        poller.register(weights, zmq.POLLIN)
        poller.register(stop, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if stop in events:
                    return
                if weights in events:
                    self._serve_weights(weights)
        finally:
            weights.close()
            stop.close()

    def _serve_weights(self, weights: zmq.Socket) -> None:
        for _ in range(64):
            try:
                peer, *frames = weights.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                req, _ = decode(frames)
                if not isinstance(req, WeightRequest):
                    raise ProtocolError(f"weights socket expects WeightRequest, got {type(req).__name__}")
            except ProtocolError as exc:
                self.bad_weight_requests += 1
                if self.bad_weight_requests <= 20 or self.bad_weight_requests % 1000 == 0:
                    log.error(
                        "bad_weight_request", peer=peer.hex(), error=str(exc)[:500], count=self.bad_weight_requests
                    )
                continue
            snap = self._snapshot
            if snap is None or req.version != snap.version or req.chunk >= len(snap.frames):
                latest = snap.version if snap else 0
                self._reply(weights, peer, encode(WeightGone(version=req.version, latest=latest)))
                continue
            if self._reply(weights, peer, snap.frames[req.chunk]):
                self.weight_chunks_served += 1
                self.weight_bytes_served += len(snap.frames[req.chunk][-1])

    def _reply(self, weights: zmq.Socket, peer: bytes, frames: Sequence[bytes | memoryview]) -> bool:
        """Queue a reply without waiting; False (counted, logged) when ZeroMQ refuses it: the
        peer's WEIGHT_REPLIES_QUEUED replies are still unread, or the peer is gone."""
        try:
            weights.send_multipart([peer, *frames], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:
            self.weight_replies_dropped += 1
            log_send_drop(log, "weight_reply_dropped", peer, exc, self.weight_replies_dropped, WEIGHT_REPLIES_QUEUED)
            return False
        return True


@asynccontextmanager
async def open_hub(
    bind: str,
    max_msg_bytes: int | None = None,
    *,
    keys: ServerKeys | None = None,
    insecure: bool = False,
    inbox_size: int = 1024,
    weights_max_bytes: int | None = None,
    peer_timeout_s: float | None = None,
) -> AsyncIterator[Hub]:
    """Bind the control socket here and start the weights thread; close both on exit.

    ``inbox_size``: messages ZeroMQ holds per actor that the learner has not read yet, before
    that actor's sends wait. With ``keys`` both ROUTERs are CURVE servers behind a ZAP
    authenticator; without them a non-loopback ``bind`` is refused unless ``insecure``
    (agentgym/auth/server.py). ``peer_timeout_s``: control connections whose peer's ZeroMQ has
    not answered for this long are closed (learner.actor_timeout_s: an actor's host that died)."""
    check_bind(bind, keys, insecure)
    hub = Hub(
        bind,
        inbox_size=inbox_size,
        max_msg_bytes=max_msg_bytes,
        keys=keys,
        weights_max_bytes=weights_max_bytes,
        peer_timeout_s=peer_timeout_s,
    )
    auth = None
    thread: threading.Thread | None = None
    try:
        if keys is not None:
            auth, hub.allow = start_authenticator(hub._ctx, keys)
        hub.open()
        thread = threading.Thread(target=hub._run, name="zmq-weights", daemon=True)
        thread.start()
        await trio.to_thread.run_sync(hub._ready.wait)
        if hub._error is not None:
            raise hub._error
        yield hub
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            if thread is not None:
                hub.stop()
                await trio.to_thread.run_sync(thread.join, 5.0)
            if hub._control is not None:
                hub.close_control()
        hub._stop.close(linger=0)
        if auth is not None:
            auth.stop()
        hub._ctx.term()
