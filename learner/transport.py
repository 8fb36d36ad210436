"""The learner's ZeroMQ side: one I/O thread owns every socket, bridged to trio by channels.

    async with open_hub(bind="tcp://0.0.0.0:5555") as hub:
        hub.publish_weights(snapshot)           # served from the I/O thread, no trio round trip
        async for peer, msg in hub.inbox: ...   # decoded, validated messages from actors
        hub.send(peer, Welcome(...))            # non-blocking, from the trio thread only

Why a thread (docs/adr/0003-concurrency.md): pyzmq has no trio integration and its edge-triggered
FD is easy to get subtly wrong. The I/O thread polls the control ROUTER, the weights ROUTER and
an inproc wake-up socket; inbound messages cross to trio through a bounded queue (``Inbox``: the
thread never waits for trio unless the queue is full, and then ZeroMQ's high-water marks push
back on actors);
outbound messages cross through a queue plus a wake-up frame (one per flush, however many
messages it carries). Weight chunks are served entirely in the thread from the latest immutable
snapshot.

With CURVE keys (learner/auth.py) ZeroMQ's ZAP handshake admits only allow-listed actors on both
ports: frames of any other peer never reach this module. A Hello of another protocol version is
answered here with a Reject naming both versions.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import structlog
import trio
import zmq

from agentgym.learner.auth import ServerKeys, check_bind, make_server, start_authenticator
from agentgym.protocol import (
    PROTOCOL_VERSION,
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

log = structlog.get_logger(__name__)
_ids = itertools.count()


class Inbox:
    """Decoded messages from the I/O thread to trio: a bounded thread-safe queue plus a wake-up.

    The thread puts and, only when trio may be asleep on an empty queue, schedules one wake-up
    (``run_sync_soon``: no round trip, the thread goes straight back to its sockets). A full
    queue blocks the thread, so ZeroMQ's high-water marks push back on actors. Iterate it from
    the trio thread: ``async for peer, msg in hub.inbox``.
    """

    CHECKPOINT_EVERY: int = 32
    """Items handed out between two trio checkpoints while the queue stays busy."""

    def __init__(self, token: trio.lowlevel.TrioToken, size: int) -> None:
        self._q: queue.Queue[tuple[bytes, Message]] = queue.Queue(size)
        self._token = token
        self._event = trio.Event()
        self._asleep = False  # trio found the queue empty and waits (or is about to) on _event
        self._since_checkpoint = 0
        self.closed = False

    # I/O thread
    def put(self, items: list[tuple[bytes, Message]]) -> None:
        for item in items:
            try:
                self._q.put_nowait(item)
                continue
            except queue.Full:
                # Full before the batch is in: trio may be asleep with the first items waiting
                # (the wake-up below comes only after the last); wake it before blocking.
                self._wake_trio()
            while not self.closed:
                try:
                    self._q.put(item, timeout=0.5)
                    break
                except queue.Full:
                    self._wake_trio()  # trio may be asleep on a race: make sure it drains
        self._wake_trio()

    def _wake_trio(self) -> None:
        if self._asleep:
            self._asleep = False
            try:
                self._token.run_sync_soon(self._set)
            except trio.RunFinishedError:
                self.closed = True

    def _set(self) -> None:
        self._event.set()

    # trio thread
    def __aiter__(self) -> Inbox:
        return self

    async def __anext__(self) -> tuple[bytes, Message]:
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                if self.closed:
                    raise StopAsyncIteration from None
            else:
                # A busy inbox must not starve the other tasks, but a checkpoint per message is a
                # scheduler pass per message: one every CHECKPOINT_EVERY, and always after a sleep.
                self._since_checkpoint += 1
                if self._since_checkpoint >= self.CHECKPOINT_EVERY:
                    self._since_checkpoint = 0
                    await trio.lowlevel.checkpoint()
                return item
            # Announce sleep *before* the last look: a put after that look sees _asleep and wakes us.
            self._event = trio.Event()
            self._asleep = True
            if self._q.empty() and not self.closed:
                await self._event.wait()
                self._since_checkpoint = 0
            self._asleep = False

    def close(self) -> None:
        self.closed = True
        self._event.set()


@dataclass(frozen=True)
class WeightSnapshot:
    """One weight version, its chunks pre-encoded as ZeroMQ frames."""

    version: int
    step: int
    turn_limit: int
    frames: list[list[bytes]]
    total_bytes: int

    @classmethod
    def build(cls, version: int, step: int, turn_limit: int, chunks: list[tuple[WeightChunk, bytes]]) -> WeightSnapshot:
        frames = [encode(msg, data) for msg, data in chunks]
        return cls(version, step, turn_limit, frames, sum(len(d) for _, d in chunks))  # type: ignore[arg-type]


def weights_address(control: str) -> str:
    """The weight server listens on the control port + 1."""
    head, port = control.rsplit(":", 1)
    return f"{head}:{int(port) + 1}"


class Hub:
    """Owns the learner's sockets in a thread; see the module docstring."""

    def __init__(self, bind: str, inbox_size: int = 1024, max_msg_bytes: int | None = None,
                 keys: ServerKeys | None = None) -> None:  # fmt: skip
        self.bind = bind
        self.keys = keys
        self.max_msg_bytes = max_msg_bytes or max_frame_bytes()
        self.inbox = Inbox(trio.lowlevel.current_trio_token(), inbox_size)
        self._outbox: queue.SimpleQueue[tuple[bytes, list[bytes]] | None] = queue.SimpleQueue()
        self._snapshot: WeightSnapshot | None = None
        self._ctx = zmq.Context()
        self._wake_addr = f"inproc://agentgym-hub-{next(_ids)}"
        self._wake = self._ctx.socket(zmq.PUSH)  # owned by the trio thread
        self._wake_pending = False  # a wake-up frame is on its way and the thread has not yet flushed
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.bad_messages = 0
        self.weight_chunks_served = 0
        self.weight_bytes_served = 0
        """Weight payload bytes sent (the learner's weight egress, chunk data without headers)."""
        self.version_rejects = 0
        self.allow = None
        """The CURVE allow-list (with its refusal count) when keys are configured."""

    # ---------------------------------------------------------------- trio side
    def send(self, peer: bytes, msg: Message) -> None:
        self._outbox.put((peer, encode(msg)))  # type: ignore[arg-type]
        # One wake-up frame per flush, not per message: the thread clears the flag *before* it
        # empties the outbox, so a message put after that look is either flushed by this pass or
        # finds the flag clear and sends a new frame. (Reads and writes of the flag are atomic.)
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self._wake.send(b"", zmq.NOBLOCK)
            except BaseException:
                self._wake_pending = False
                raise

    def publish_weights(self, snapshot: WeightSnapshot) -> None:
        self._snapshot = snapshot  # one reference swap: the I/O thread sees old or new, whole

    # ---------------------------------------------------------------- I/O thread
    def _make_router(self, addr: str) -> zmq.Socket:
        s = self._ctx.socket(zmq.ROUTER)
        s.setsockopt(zmq.MAXMSGSIZE, self.max_msg_bytes)  # refuse oversized frames before reading them
        s.setsockopt(zmq.LINGER, 2000)
        s.setsockopt(zmq.SNDHWM, 10_000)
        s.setsockopt(zmq.RCVHWM, 10_000)
        make_server(s, self.keys)  # CURVE: ZAP admits only allow-listed actors, before any frame
        s.bind(addr)
        return s

    def _run(self) -> None:
        try:
            control = self._make_router(self.bind)
            weights = self._make_router(weights_address(self.bind))
            wake = self._ctx.socket(zmq.PULL)
            wake.bind(self._wake_addr)
        except zmq.ZMQError as exc:
            self._error = OSError(f"learner cannot bind {self.bind} (and its weights port +1): {exc}")
            self._ready.set()
            return
        self._wake.connect(self._wake_addr)
        self._ready.set()
        poller = zmq.Poller()
        for s in (control, weights, wake):
            poller.register(s, zmq.POLLIN)
        try:
            running = True
            while running:
                events = dict(poller.poll(500))
                if wake in events or not events:  # and on a quiet pass, whatever may be waiting
                    while True:
                        try:
                            wake.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                    self._wake_pending = False  # before the flush: see send()
                    running = self._flush_outbox(control)
                if control in events:
                    self._drain_control(control)
                if weights in events:
                    self._serve_weights(weights)
        finally:
            self._flush_outbox(control)
            for s in (control, weights, wake):
                s.close()

    def _flush_outbox(self, control: zmq.Socket) -> bool:
        while True:
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                return True
            if item is None:
                return False
            peer, frames = item
            try:
                control.send_multipart([peer, *frames], zmq.NOBLOCK, copy=False)
            except zmq.Again:
                log.warning("send_dropped_hwm", peer=peer.hex())

    def _drain_control(self, control: zmq.Socket) -> None:
        # Decoded here; handed to trio in one put per drain, without waiting for trio.
        batch: list[tuple[bytes, Message]] = []
        for _ in range(256):  # bounded, so weights and the outbox get their turn
            try:
                # No copy: decode reads the body in ZeroMQ's buffer and copies out what it keeps.
                peer_frame, *frames = control.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            peer = peer_frame.bytes
            try:
                msg, _ = decode([f.buffer for f in frames])
            except VersionMismatch as exc:
                # Named, so the actor's operator sees both versions; nothing about the model.
                self.bad_messages += 1
                self.version_rejects += 1
                if self.version_rejects <= 20 or self.version_rejects % 1000 == 0:
                    log.warning("protocol_version_rejected", peer=peer.hex(), theirs=exc.theirs, ours=exc.ours)
                reason = f"actor speaks agentgym protocol version {exc.theirs}, the learner speaks {PROTOCOL_VERSION}"
                self._send_now(control, peer, encode(Reject(field="protocol_version", reason=reason)))
                continue
            except ProtocolError as exc:
                self.bad_messages += 1
                if self.bad_messages <= 20 or self.bad_messages % 1000 == 0:  # a flood is not a log flood
                    log.error("bad_message", peer=peer.hex(), error=str(exc)[:500], count=self.bad_messages)
                continue
            batch.append((peer, msg))
        if batch:
            self.inbox.put(batch)  # blocks only while the inbox is full: backpressure reaches ZeroMQ's HWM

    def _send_now(self, sock: zmq.Socket, peer: bytes, frames: list) -> None:  # type: ignore[type-arg]
        try:
            sock.send_multipart([peer, *frames], zmq.NOBLOCK)
        except zmq.Again:
            log.warning("send_dropped_hwm", peer=peer.hex())

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
                self.bad_messages += 1
                if self.bad_messages <= 20 or self.bad_messages % 1000 == 0:
                    log.error("bad_weight_request", peer=peer.hex(), error=str(exc)[:500], count=self.bad_messages)
                continue
            snap = self._snapshot
            if snap is None or req.version != snap.version or req.chunk >= len(snap.frames):
                latest = snap.version if snap else 0
                weights.send_multipart([peer, *encode(WeightGone(version=req.version, latest=latest))])
                continue
            weights.send_multipart([peer, *snap.frames[req.chunk]], copy=False)
            self.weight_chunks_served += 1
            self.weight_bytes_served += len(snap.frames[req.chunk][-1])

    def stop(self) -> None:
        self._outbox.put(None)
        try:
            self._wake.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:
            pass


@asynccontextmanager
async def open_hub(
    bind: str, max_msg_bytes: int | None = None, *, keys: ServerKeys | None = None, insecure: bool = False,
    inbox_size: int = 1024,
) -> AsyncIterator[Hub]:
    """Start the I/O thread, wait until its sockets are bound, stop it on exit.

    With ``keys`` both ROUTERs are CURVE servers behind a ZAP authenticator; without them a
    non-loopback ``bind`` is refused unless ``insecure`` (learner/auth.py)."""
    check_bind(bind, keys, insecure)
    hub = Hub(bind, inbox_size=inbox_size, max_msg_bytes=max_msg_bytes, keys=keys)
    auth = None
    if keys is not None:
        auth, hub.allow = start_authenticator(hub._ctx, keys)
    thread = threading.Thread(target=hub._run, name="zmq-hub", daemon=True)
    thread.start()
    await trio.to_thread.run_sync(hub._ready.wait)
    if hub._error is not None:
        if auth is not None:
            auth.stop()
        raise hub._error
    try:
        yield hub
    finally:
        hub.stop()
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            hub.inbox.close()
            await trio.to_thread.run_sync(thread.join, 5.0)
        hub._wake.close(linger=0)
        if auth is not None:
            auth.stop()
        hub._ctx.term()
