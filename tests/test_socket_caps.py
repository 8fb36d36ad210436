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
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import structlog
import zmq
from transformers import AutoTokenizer

from agentgym.actors.engines.engine import SamplingSpec
from agentgym.actors.engines.sim_engine import SimEngine
from agentgym.actors.play.agent_endpoint import AgentEndpoint
from agentgym.actors.play.agent_trace import AgentTrace
from agentgym.host.netutil import free_port_pair
from agentgym.learner.transport import WeightSnapshot
from agentgym.observe.logs import read_events
from agentgym.protocol import WeightChunk, WeightRequest, decode, encode
from agentgym.protocol.limits import REQUEST_FRAME, MiB, agent_request_bytes, chunk_frame
from agentgym.protocol.weights import RawTensor, make_chunks


def _recv(sock: zmq.Socket, timeout_s: float = 30) -> list[bytes]:
    assert sock.poll(int(timeout_s * 1000)), "nothing arrived"
    return sock.recv_multipart()


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
        assert relay.poll() is None, "the relay exited"
    finally:
        relay.terminate()
        relay.wait(timeout=30)
        actor.close()
        upstream.close()
        ctx.term()
    stats = read_events(log, "relay_stopped")[0]
    assert stats["upstream_dropped"] == 1 and stats["peers_dropped"] >= 1, stats


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
