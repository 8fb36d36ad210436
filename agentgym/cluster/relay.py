"""``agentgym-relay``: a weight relay, so the learner's egress per update does not grow with actors.

    agentgym-relay --bind tcp://0.0.0.0:5560 --upstream tcp://LEARNER:5556 [--upstream tcp://OTHER_RELAY:5560]
    agentgym-actor ... -o actor.weights_relay=\\"tcp://127.0.0.1:5560\\"

A pull-through cache that speaks the learner's weights protocol on both sides
(protocol/messages.py: WeightRequest in, WeightChunk or WeightGone out). An actor's request for
chunk c of version v is answered from the cache, or asked of the upstream once, however many
actors want it meanwhile; the reply goes to every one of them. Upstream is the learner's
weights port or another relay, so relays form a tree (one per host, each host's relay fed by a
parent): the learner sends each chunk of each version about once per child, whatever the
number of actors (docs/adr/0018-weight-fan-out.md).

Integrity: every chunk from upstream is checked (size and crc32, protocol/weights.py) before it
is cached or forwarded; a bad one is dropped and asked for again. The cache is keyed by
(version, chunk) and forwards the upstream's frames unchanged, so an actor assembling version v
only ever receives chunks of v, and checks them again itself. Versions older than the newest
``keep`` are evicted.

Failure: an upstream that answers nothing for ``stall_s`` while requests are out is abandoned
for the next ``--upstream`` (round robin), and the outstanding requests are asked again there.

Frame caps (protocol/limits.py): requests from downstream are at most ``REQUEST_FRAME``, frames
from upstream at most ``chunk_frame(--chunk-mib)`` (the learner's ``learner.weight_chunk_mib``).
ZeroMQ drops a connection that sends a larger frame before reading it; the relay logs each
dropped connection (``relay_peer_dropped``, ``relay_upstream_dropped``, naming the cap) and
connects upstream again, to the next ``--upstream``, asking again what was outstanding.
Actors fall back to the learner themselves when their relay goes silent (actors/weight_fetch.py).
Queues: at most ``WEIGHT_REQUESTS_QUEUED`` unread requests and ``WEIGHT_REPLIES_QUEUED`` queued
replies per downstream peer (a reply past that is dropped and logged, ``relay_send_dropped``),
and ``WEIGHT_REPLIES_QUEUED`` unread chunks from upstream.

CURVE (docs/adr/0009-authentication.md): with ``--secret-key`` the relay connects upstream as a
client with that pair (its public half goes in the upstream's allow-list, like an actor's),
and with ``--authorized-keys`` it serves only clients whose public keys are in that directory,
with the same key pair as server (actors set ``actor.relay_key`` to its public half). Without
keys a non-loopback bind is refused unless ``--insecure``.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from agentgym.auth.keys import ClientKeys, apply_client
from agentgym.host.netutil import log_send_drop
from agentgym.protocol import ProtocolError, WeightChunk, WeightGone, WeightRequest, decode, encode
from agentgym.protocol.limits import (
    DEFAULT_CHUNK_MIB,
    REQUEST_FRAME,
    WEIGHT_REPLIES_QUEUED,
    WEIGHT_REQUESTS_QUEUED,
    WEIGHTS_IN_FLIGHT,
    chunk_frame,
)
from agentgym.protocol.weights import verify_chunk

if TYPE_CHECKING:
    from agentgym.auth.server import ServerKeys

log = structlog.get_logger(__name__)
Key = tuple[int, int]  # (version, chunk)


class Relay:
    """One thread, two sockets: a ROUTER for actors (or child relays), a DEALER upstream."""

    def __init__(
        self,
        bind: str,
        upstreams: list[str],
        *,
        upstream_keys: list[ClientKeys | None] | None = None,
        server_keys: ServerKeys | None = None,
        stall_s: float = 5.0,
        keep: int = 2,
        max_in_flight: int = WEIGHTS_IN_FLIGHT,
        chunk_mib: int = DEFAULT_CHUNK_MIB,
    ) -> None:
        if not upstreams:
            raise ValueError("relay: at least one --upstream address is needed")
        self.upstreams = upstreams
        self.upstream_keys = upstream_keys or [None] * len(upstreams)
        if len(self.upstream_keys) != len(upstreams):
            raise ValueError(f"relay: {len(upstreams)} upstreams but {len(self.upstream_keys)} upstream keys")
        self.stall_s, self.keep, self.max_in_flight = stall_s, keep, max_in_flight
        self.ctx = zmq.Context()
        self.auth = None
        self.down = self.ctx.socket(zmq.ROUTER)
        self.up_frame = chunk_frame(chunk_mib)
        self.down.setsockopt(zmq.MAXMSGSIZE, REQUEST_FRAME)  # only requests come in
        self.down.setsockopt(zmq.RCVHWM, WEIGHT_REQUESTS_QUEUED)
        self.down.setsockopt(zmq.SNDHWM, WEIGHT_REPLIES_QUEUED)  # per peer; past it a reply is dropped (_send)
        self.down.setsockopt(zmq.ROUTER_MANDATORY, 1)  # ... with an error to log, not silently
        self.down.setsockopt(zmq.LINGER, 0)
        if server_keys is not None:
            from agentgym.auth.server import make_server, start_authenticator

            self.auth, self.allow = start_authenticator(self.ctx, server_keys)
            make_server(self.down, server_keys)
        self.down_events = self.down.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.down.bind(bind)
        self.at = 0
        self.up = self._connect_up()
        self.cache: dict[Key, list[bytes]] = {}
        self.waiting: dict[Key, list[bytes]] = {}  # peers waiting for a chunk asked upstream
        self.asked: dict[Key, float] = {}  # asked upstream, when
        self.backlog: deque[Key] = deque()  # to ask once fewer are in flight
        self.gone: dict[int, int] = {}  # version -> the upstream's latest, for versions it no longer serves
        self.newest = -1
        self.last_heard = time.monotonic()
        self.stats = {
            "requests": 0,
            "hits": 0,
            "chunks_in": 0,
            "bytes_in": 0,
            "chunks_out": 0,
            "bytes_out": 0,
            "bad_chunks": 0,
            "bad_requests": 0,
            "upstream_switches": 0,
            "gone": 0,
            "peers_dropped": 0,
            "upstream_dropped": 0,
            "sends_dropped": 0,
        }
        self.running = True

    def _connect_up(self) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        apply_client(s, self.upstream_keys[self.at])  # CURVE: the upstream admits us like an actor
        s.setsockopt(zmq.MAXMSGSIZE, self.up_frame)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVHWM, WEIGHT_REPLIES_QUEUED)  # it asks max_in_flight at a time
        self.up_events = s.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        s.connect(self.upstreams[self.at])
        log.info("relay_upstream", upstream=self.upstreams[self.at])
        return s

    # ------------------------------------------------------------------ downstream
    def _on_request(self, peer: bytes, frames: list[bytes]) -> None:
        self.stats["requests"] += 1
        try:
            req, _ = decode(frames)
            if not isinstance(req, WeightRequest):
                raise ProtocolError(f"a relay serves WeightRequest only, got {type(req).__name__}")
        except ProtocolError as exc:
            self.stats["bad_requests"] += 1
            if self.stats["bad_requests"] <= 20:
                log.error("bad_weight_request", peer=peer.hex(), error=str(exc)[:300])
            return
        key = (req.version, req.chunk)
        if key in self.cache:
            self.stats["hits"] += 1
            self._send(peer, self.cache[key])
        elif req.version in self.gone:
            self.stats["gone"] += 1
            self._send(peer, encode(WeightGone(version=req.version, latest=self.gone[req.version])))
        else:
            waiters = self.waiting.setdefault(key, [])
            waiters.append(peer)
            if len(waiters) == 1:  # the first to want it: ask upstream once for all of them
                self.backlog.append(key)

    def _send(self, peer: bytes, frames: Sequence[bytes | memoryview]) -> None:
        try:
            self.down.send_multipart([peer, *frames], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:  # mandatory ROUTER: the peer's queue is full, or the peer is gone
            self.stats["sends_dropped"] += 1
            log_send_drop(log, "relay_send_dropped", peer, exc, self.stats["sends_dropped"], WEIGHT_REPLIES_QUEUED)
            return
        if len(frames) > 1:
            self.stats["chunks_out"] += 1
            self.stats["bytes_out"] += len(frames[-1])

    # ------------------------------------------------------------------ upstream
    def _ask(self) -> None:
        while self.backlog and len(self.asked) < self.max_in_flight:
            key = self.backlog.popleft()
            if key in self.asked or key in self.cache or key not in self.waiting:
                continue
            self.up.send_multipart(encode(WeightRequest(version=key[0], chunk=key[1])))
            self.asked[key] = time.monotonic()

    def _on_upstream(self, frames: list[bytes]) -> None:
        self.last_heard = time.monotonic()
        try:
            msg, data = decode(frames)
            if isinstance(msg, WeightChunk):
                verify_chunk(msg, data[0] if data else b"")
        except ProtocolError as exc:  # a corrupted chunk: dropped, asked again below
            self.stats["bad_chunks"] += 1
            log.error("relay_bad_chunk", upstream=self.upstreams[self.at], error=str(exc)[:300])
            self._reask_all()
            return
        if isinstance(msg, WeightChunk):
            key = (msg.version, msg.chunk)
            self.asked.pop(key, None)
            self.stats["chunks_in"] += 1
            self.stats["bytes_in"] += msg.nbytes
            self.cache[key] = frames
            if msg.version > self.newest:
                self._evict(msg.version)
            for peer in self.waiting.pop(key, []):
                self._send(peer, frames)
        elif isinstance(msg, WeightGone):
            self.gone[msg.version] = msg.latest
            self.stats["gone"] += 1
            for key in [k for k in self.waiting if k[0] == msg.version]:
                self.asked.pop(key, None)
                for peer in self.waiting.pop(key):
                    self._send(peer, encode(msg))

    def _evict(self, version: int) -> None:
        self.newest = version
        floor = version - self.keep + 1
        for key in [k for k in self.cache if k[0] < floor]:
            del self.cache[key]
        for v in [v for v in self.gone if v < floor]:
            del self.gone[v]

    def _reask_all(self) -> None:
        """Everything outstanding goes back to the front of the backlog (after a bad chunk or
        on a new upstream)."""
        self.backlog.extendleft(sorted(self.asked, reverse=True))
        self.asked.clear()

    def _check_stall(self) -> None:
        now = time.monotonic()
        if not self.asked or now - self.last_heard < self.stall_s or now - min(self.asked.values()) < self.stall_s:
            return
        old = self._switch_up()
        log.warning("relay_upstream_stalled", upstream=old, next=self.upstreams[self.at], outstanding=len(self.asked))
        self._reask_all()
        self.last_heard = now

    def _switch_up(self) -> str:
        """Connect to the next upstream (round robin); returns the one left."""
        old = self.upstreams[self.at]
        self._close_up()
        self.at = (self.at + 1) % len(self.upstreams)
        self.up = self._connect_up()
        self.stats["upstream_switches"] += 1
        return old

    def _close_up(self) -> None:
        self.up.disable_monitor()
        self.up_events.close(linger=0)
        self.up.close(linger=0)

    def _check_drops(self, events: dict) -> None:
        """Log connections ZeroMQ dropped: a frame over the socket's cap (refused unread) or a peer
        gone. Upstream, ZeroMQ does not connect again after a refused frame: the relay does."""
        while self.down_events in events:
            try:
                ev = recv_monitor_message(self.down_events, zmq.NOBLOCK)
            except zmq.Again:
                break
            self.stats["peers_dropped"] += 1
            log.info(
                "relay_peer_dropped",
                peer=ev["endpoint"].decode(errors="replace"),
                frame_cap_bytes=REQUEST_FRAME,
                why="a frame over frame_cap_bytes (refused unread), or the peer left",
            )
        dropped = False
        while self.up_events in events:
            try:
                recv_monitor_message(self.up_events, zmq.NOBLOCK)
            except zmq.Again:
                break
            dropped = True
        if dropped:
            self.stats["upstream_dropped"] += 1
            old = self._switch_up()
            log.warning(
                "relay_upstream_dropped",
                upstream=old,
                next=self.upstreams[self.at],
                frame_cap_bytes=self.up_frame,
                outstanding=len(self.asked),
                why="a frame over frame_cap_bytes (refused unread; "
                "--chunk-mib below the learner's learner.weight_chunk_mib?), or the upstream went away",
            )
            self._reask_all()
            self.last_heard = time.monotonic()

    # ------------------------------------------------------------------ loop
    def run(self, stats_path: Path | None = None, stats_every_s: float = 10.0) -> None:
        next_log = time.monotonic() + stats_every_s
        try:
            while self.running:
                poller = zmq.Poller()  # the upstream socket changes on a switch
                poller.register(self.down, zmq.POLLIN)
                poller.register(self.up, zmq.POLLIN)
                poller.register(self.down_events, zmq.POLLIN)
                poller.register(self.up_events, zmq.POLLIN)
                events = dict(poller.poll(200))
                self._check_drops(events)
                if self.up in events:
                    for _ in range(256):
                        try:
                            self._on_upstream(self.up.recv_multipart(zmq.NOBLOCK))
                        except zmq.Again:
                            break
                if self.down in events:
                    for _ in range(1024):
                        try:
                            peer, *frames = self.down.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._on_request(peer, frames)
                self._ask()
                self._check_stall()
                if time.monotonic() >= next_log:
                    next_log += stats_every_s
                    log.debug("relay_stats", cached=len(self.cache), newest=self.newest, **self.stats)
                    if stats_path is not None:
                        self._write_stats(stats_path)
        finally:
            log.info("relay_stopped", **self.stats)
            if stats_path is not None:
                self._write_stats(stats_path)
            self.close()

    def _write_stats(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**self.stats, "newest": self.newest, "cached": len(self.cache)}))
        tmp.replace(path)  # readers see a whole file

    def close(self) -> None:
        self.down.disable_monitor()
        self.down_events.close(linger=0)
        self.down.close(linger=0)
        self._close_up()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()


def run_relay(relay: Relay, stats_path: Path | None = None, stats_every_s: float = 10.0) -> int:
    """Serve until SIGINT or SIGTERM; returns the exit code. The command (``agentgym-relay``,
    agentgym/cli/relay.py) parses its flags, builds the ``Relay`` and calls this."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: setattr(relay, "running", False))
    relay.run(stats_path, stats_every_s)
    return 0


if __name__ == "__main__":  # ``python -m agentgym.cluster.relay``: the same command, kept for its many users
    from agentgym.cli.relay import main

    sys.exit(main())
