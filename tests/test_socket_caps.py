"""The caps of the sockets beside the actor's control and weights links (those are
test_actor_frame_caps.py's), each sent a frame over its cap by a real peer; the process stays up,
logs why, and serves the next honest request:

- a weight relay (``agentgym-relay``, a real process): a request frame over ``REQUEST_FRAME`` from
  an actor, and a frame over ``chunk_frame(--chunk-mib)`` from its upstream (the test plays the
  learner's weights port with a ROUTER). The relay logs ``relay_peer_dropped`` and
  ``relay_upstream_dropped`` with the cap, connects upstream again, asks again, and delivers the
  honest chunk.
- the actor's agent endpoint (HTTP): a request body over ``agent_request_bytes`` of the run's
  ``max_episode_tokens`` is answered 413 and logged (``agent_request_refused``); the endpoint
  answers the next request.
- the env server (``agentgym serve-env``, HTTP): a body over ``MAX_BODY`` is answered 413 unread
  and logged (``env_request_refused``), a negative Content-Length 400; the server serves on.

And the queues of the weights ports, flooded by a peer that asks and never reads: the learner's
and a relay's queue at most ``WEIGHT_REPLIES_QUEUED`` replies for it, drop the rest with a line
(``weight_reply_dropped``, ``relay_send_dropped``, reason ``queue_full``), and serve an honest
peer meanwhile, whole.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import structlog
import zmq
import zmq.asyncio
from transformers import AutoTokenizer

from agentgym.actors.engines.engine import SamplingSpec
from agentgym.actors.engines.sim_engine import SimEngine
from agentgym.actors.play.agent_endpoint import AgentEndpoint
from agentgym.actors.play.agent_trace import AgentTrace
from agentgym.envpool.server import MAX_BODY, EnvServer
from agentgym.host.netutil import free_port_pair
from agentgym.learner.transport import WeightSnapshot
from agentgym.observe.logs import read_events
from agentgym.protocol import WeightChunk, WeightRequest, decode, encode
from agentgym.protocol.limits import (
    REQUEST_FRAME,
    WEIGHT_REPLIES_QUEUED,
    MiB,
    agent_request_bytes,
    chunk_frame,
)
from agentgym.protocol.weights import RawTensor, make_chunks


def _recv(sock: zmq.Socket, timeout_s: float = 30) -> list[bytes]:
    assert sock.poll(int(timeout_s * 1000)), "nothing arrived"
    return sock.recv_multipart()


def _never_reads(ctx: zmq.Context, addr: str) -> zmq.Socket:
    """A DEALER that asks and never reads: one message in ZeroMQ's queue, 4 KiB in the kernel's."""
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVHWM, 1)
    s.setsockopt(zmq.RCVBUF, 4096)
    s.connect(addr)
    return s


FLOOD = 4000
"""Requests of the flood: their replies (16 KiB and more each) far outgrow the kernel's buffers
and the queue, so that most are dropped."""


def _wait_event(path: Path, name: str, relay: subprocess.Popen, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while not (events := read_events(path, name)):
        assert relay.poll() is None, f"the relay exited ({relay.returncode})"
        assert time.monotonic() < deadline, f"no {name} logged"
        time.sleep(0.05)
    return events[0]


def test_a_relay_refuses_oversized_frames_both_ways_and_serves_on(tmp_path: Path) -> None:
    up_port, relay_port = free_port_pair(), free_port_pair()
    ctx = zmq.Context()
    upstream = ctx.socket(zmq.ROUTER)  # the learner's weights port, played by the test
    upstream.setsockopt(zmq.LINGER, 0)
    upstream.bind(f"tcp://127.0.0.1:{up_port}")
    log = tmp_path / "relay.jsonl"
    relay = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgym.cluster.relay",
            "--bind",
            f"tcp://127.0.0.1:{relay_port}",
            "--upstream",
            f"tcp://127.0.0.1:{up_port}",
            "--chunk-mib",
            "1",
            "--stall",
            "60",
            "--log-json",
            str(log),
        ]
    )
    actor = ctx.socket(zmq.DEALER)
    actor.setsockopt(zmq.LINGER, 0)
    try:
        actor.connect(f"tcp://127.0.0.1:{relay_port}")
        # Downstream: a "request" of 8 KiB, over REQUEST_FRAME, from a peer of its own.
        rogue = ctx.socket(zmq.DEALER)
        rogue.setsockopt(zmq.LINGER, 0)
        rogue.connect(f"tcp://127.0.0.1:{relay_port}")
        rogue.send_multipart([b"x" * 16, b"y" * (2 * REQUEST_FRAME)])
        dropped = _wait_event(log, "relay_peer_dropped", relay)
        assert dropped["frame_cap_bytes"] == REQUEST_FRAME, dropped
        rogue.close()

        # Upstream: the relay asks for a chunk; the answer is a frame over chunk_frame(1).
        actor.send_multipart(encode(WeightRequest(version=1, chunk=0)))
        peer, *frames = _recv(upstream)
        assert isinstance(decode(frames)[0], WeightRequest)
        upstream.send_multipart([peer, b"h" * 16, b"z" * (chunk_frame(1) + MiB)])
        dropped = _wait_event(log, "relay_upstream_dropped", relay)
        assert dropped["frame_cap_bytes"] == chunk_frame(1), dropped

        # Connected again, the relay asks again; the honest chunk reaches the actor.
        peer, *frames = _recv(upstream)
        req, _ = decode(frames)
        assert isinstance(req, WeightRequest) and (req.version, req.chunk) == (1, 0), req
        w = np.arange(1000, dtype=np.float32)
        snap = WeightSnapshot.build(1, make_chunks(1, [RawTensor("w", "float32", w.shape, w.tobytes())], MiB))
        upstream.send_multipart([peer, *snap.frames[0]])
        msg, data = decode(_recv(actor))
        assert isinstance(msg, WeightChunk) and np.array_equal(np.frombuffer(bytes(data[0]), np.float32), w)

        # A flood from a peer that never reads: the cached chunk, asked FLOOD times.
        flooder = _never_reads(ctx, f"tcp://127.0.0.1:{relay_port}")
        for _ in range(FLOOD):
            flooder.send_multipart(encode(WeightRequest(version=1, chunk=0)))
        dropped = _wait_event(log, "relay_send_dropped", relay)
        assert dropped["reason"] == "queue_full" and dropped["queued_cap"] == WEIGHT_REPLIES_QUEUED, dropped
        actor.send_multipart(encode(WeightRequest(version=1, chunk=0)))  # the honest actor is served on
        msg, data = decode(_recv(actor))
        assert isinstance(msg, WeightChunk) and np.array_equal(np.frombuffer(bytes(data[0]), np.float32), w)
        flooder.close()
        assert relay.poll() is None, "the relay exited"
    finally:
        relay.terminate()
        relay.wait(timeout=30)
        actor.close()
        upstream.close()
        ctx.term()
    stats = read_events(log, "relay_stopped")[0]
    assert stats["upstream_dropped"] == 1 and stats["peers_dropped"] >= 1, stats
    # The flood's replies past the queue were dropped, the rest (and the honest actor's) served.
    assert 0 < stats["sends_dropped"] < stats["hits"] <= FLOOD + 1, stats


def test_the_agent_endpoint_refuses_a_body_over_the_rollout_limits(fallback_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(fallback_model)
    cap = agent_request_bytes(max_episode_tokens=256)

    async def main() -> tuple[int, dict, int]:
        endpoint = AgentEndpoint(SimEngine(vocab_size=64), tokenizer, max_request_bytes=cap)
        await endpoint.start()
        try:
            s = endpoint.open(AgentTrace(tokenizer, 256), SamplingSpec(max_tokens=4), turn_limit=4, max_tokens=4)
            big = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "a" * (cap + 1)}]})
            async with aiohttp.ClientSession() as http:
                async with http.post(
                    f"{endpoint.url}/c/{s.key}/v1/chat/completions",
                    data=big,
                    headers={"Content-Type": "application/json"},
                ) as r:
                    refused, body = r.status, await r.json()
                async with http.get(f"{endpoint.url}/v1/models") as r:
                    after = r.status
            return refused, body, after
        finally:
            await endpoint.close()

    with structlog.testing.capture_logs() as logs:
        refused, body, after = asyncio.run(main())
    assert refused == 413 and body["error"]["code"] == "request_too_large", body
    assert after == 200
    refusals = [e for e in logs if e["event"] == "agent_request_refused"]
    assert refusals and refusals[0]["frame_cap_bytes"] == cap, logs


def _raw_post(url: str, head: str, body: bytes = b"") -> tuple[int, dict]:
    """A POST whose headers are written as given (a client library would fix them)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"POST /create HTTP/1.1\r\nHost: {host}\r\n{head}\r\n\r\n".encode() + body)
        resp = http.client.HTTPResponse(s)
        resp.begin()
        return resp.status, json.loads(resp.read())


def test_the_env_server_refuses_a_body_over_its_cap_unread_and_serves_on() -> None:
    with EnvServer("guess_number", {"high": 8}, size=1) as server, structlog.testing.capture_logs() as logs:
        # Announced over the cap: refused before a byte of the body is read (none is sent).
        status, body = _raw_post(server.url, f"Content-Type: application/json\r\nContent-Length: {MAX_BODY + 1}")
        assert status == 413 and f"the limit is {MAX_BODY}" in body["error"], body
        # A negative length would read until the client closes: refused.
        status, body = _raw_post(server.url, "Content-Length: -1")
        assert status == 400 and "Content-Length" in body["error"], body
        status, body = _raw_post(server.url, "Content-Type: application/json\r\nContent-Length: 2", b"{}")
        assert status == 200 and isinstance(body["id"], int), body
    refused = [e for e in logs if e["event"] == "env_request_refused"]
    assert len(refused) == 1 and refused[0]["frame_cap_bytes"] == MAX_BODY, logs
    assert refused[0]["content_length"] == MAX_BODY + 1
