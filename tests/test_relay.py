"""Weight relays across hosts (agentgym/cluster/relay.py), with a relay killed mid-transfer.

Three network-namespace hosts (tests/netns.py), real processes throughout:
  learner: the learner's weight side (``agentgym.cluster.fleet source``: the learner's own Hub)
  h1:      relay r1 (upstream: the learner) and 2 simulated actors fetching from r1
  h2:      relay r2 (upstream: r1, then the learner) and 2 simulated actors fetching from r2
so r1 -> r2 is a two-level tree and the learner sends each version once. h1's loopback is rate
limited (tc tbf), so r1's transfer to its actors takes seconds, and r1 is SIGKILLed while it is
serving version 2 to them.

Asserted: version 1 left the learner exactly once for 4 actors; r1's actors noticed its silence
mid-version and finished version 2 from the learner, keeping the chunks already verified; r2
moved to its next upstream; every actor ended up serving every version with the learner's
bytes (the source checks each actor's crc32 digest); and versions 2 and 3 cost the learner
fewer copies than actors. Never a timing. Skipped where namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netns import Cluster, netns_unavailable

from agentgym.observe.logs import read_events

NO_NETNS = netns_unavailable()
ROOT = Path(__file__).resolve().parents[1]
CHUNKS = 64  # 8 MiB in 128 KiB chunks


def wait(ok, seconds: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + seconds
    while not ok():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n" + (p.read_text()[-2000:] if p.exists() else "(none)") for p in logs)
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.05)


@pytest.mark.skipif(NO_NETNS is not None, reason=f"no network namespaces: {NO_NETNS}")
@pytest.mark.timeout(600)
def test_relay_tree_survives_a_relay_killed_mid_transfer(tmp_path: Path) -> None:
    py = sys.executable
    with Cluster(["learner", "h1", "h2"]) as net:
        L, H1 = net.addr("learner"), net.addr("h1")
        # Relay -> local actor traffic on h1 goes over its loopback: slow it, so a kill lands mid-version.
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                net.ns("h1"),
                "tc",
                "qdisc",
                "add",
                "dev",
                "lo",
                "root",
                "tbf",
                "rate",
                "24mbit",
                "burst",
                "256kb",
                "latency",
                "2s",
            ],
            check=True,
        )
        logs = {n: tmp_path / f"{n}.log" for n in ("source", "r1", "r2", "f1", "f2")}
        js = {n: tmp_path / f"{n}.jsonl" for n in logs}
        out = tmp_path / "result.json"
        source = net.spawn(
            "learner",
            [
                py,
                "-m",
                "agentgym.cluster.fleet",
                "--log-json",
                str(js["source"]),
                "source",
                "--bind",
                f"tcp://{L}:5555",
                "--actors",
                "4",
                "--versions",
                "3",
                "--mib",
                "8",
                "--chunk-kib",
                "128",
                "--gap",
                "1",
                "--timeout",
                "240",
                "--out",
                str(out),
            ],
            ROOT,
            logs["source"],
        )
        r1_stats = tmp_path / "r1.json"
        r1 = net.spawn(
            "h1",
            [
                py,
                "-m",
                "agentgym.cluster.relay",
                "--bind",
                f"tcp://{H1}:5560",
                "--insecure",
                "--upstream",
                f"tcp://{L}:5556",
                "--stats",
                str(r1_stats),
                "--stats-every",
                "0.05",
                "--log-json",
                str(js["r1"]),
            ],
            ROOT,
            logs["r1"],
        )
        net.spawn(
            "h2",
            [
                py,
                "-m",
                "agentgym.cluster.relay",
                "--bind",
                "tcp://127.0.0.1:5560",
                "--upstream",
                f"tcp://{H1}:5560",
                "--upstream",
                f"tcp://{L}:5556",
                "--stall",
                "1.5",
                "--log-json",
                str(js["r2"]),
            ],
            ROOT,
            logs["r2"],
        )
        fleets = [
            net.spawn(
                host,
                [
                    py,
                    "-m",
                    "agentgym.cluster.fleet",
                    "--log-json",
                    str(js[f]),
                    "actors",
                    "--learner",
                    f"tcp://{L}:5555",
                    "--count",
                    "2",
                    "--prefix",
                    host,
                    "--relay",
                    relay,
                    "--stall",
                    "4",
                ],
                ROOT,
                logs[f],
            )
            for host, f, relay in (("h1", "f1", f"tcp://{H1}:5560"), ("h2", "f2", "tcp://127.0.0.1:5560"))
        ]
        all_logs = list(logs.values())

        def r1_out() -> dict:
            try:
                return json.loads(r1_stats.read_text())
            except (OSError, ValueError):
                return {}

        # Version 1 goes through the tree whole: r1 serves its 2 actors and r2, CHUNKS each; then
        # r2 (fast link) and r1's actors (slow loopback) get version 2 chunks from it.
        wait(
            lambda: r1_out().get("newest") == 2 and r1_out().get("chunks_out", 0) >= 3 * CHUNKS + 32,
            120,
            "r1 to serve part of version 2",
            all_logs,
        )
        os.killpg(r1.pid, signal.SIGKILL)  # `ip netns exec` execs the relay: its own process group
        killed_at = r1_out()
        wait(lambda: source.poll() is not None, 300, "the source to see every version served", all_logs)
        assert source.returncode == 0, logs["source"].read_text()[-3000:]
        for f in fleets:
            assert f.wait(timeout=60) == 0

    result = json.loads(out.read_text())["versions"]
    assert [r["version"] for r in result] == [1, 2, 3] and all(r["actors"] == 4 for r in result)
    v1, v2, v3 = result
    assert v1["egress_chunks"] == CHUNKS  # once for 4 actors on 2 hosts
    assert killed_at["chunks_out"] < 3 * CHUNKS + 2 * CHUNKS  # r1 died before serving all of v2 to its actors
    # r1's actors fell back to the learner in the middle of version 2, keeping what they had.
    stalls = [e for e in read_events(js["f1"], "weights_source_stalled") if e["version"] == 2]
    assert len(stalls) == 2, read_events(js["f1"], "weights_source_stalled")
    assert all(e["chunks_done"] < e["chunks"] == CHUNKS for e in stalls), stalls
    assert max(e["chunks_done"] for e in stalls) > 0, stalls  # mid-transfer: verified chunks kept
    # r2 moved to the learner when r1 went away (at version 2 or 3, whichever it still needed): on
    # the dropped connection (relay_upstream_dropped, ZeroMQ's monitor) or, where no drop is seen,
    # on the silence (relay_upstream_stalled).
    moved = [
        e
        for e in read_events(js["r2"], "relay_upstream_stalled") + read_events(js["r2"], "relay_upstream_dropped")
        if e["upstream"].endswith(":5560")
    ]
    assert moved, logs["r2"].read_text()[-2000:]
    # The learner sent fewer copies than actors even with a relay dead: r2 still fans out on h2.
    assert v2["egress_chunks"] < 4 * CHUNKS and v3["egress_chunks"] <= 3 * CHUNKS


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_curve_relay_admits_only_its_allow_list_and_the_others_fall_back(tmp_path: Path) -> None:
    """The learner and the relay both with CURVE keys (ADR 0009): the relay connects upstream
    with its own pair (in the learner's allow-list) and serves only keys in its own directory.
    An admitted actor gets a version through the relay alone; an actor the relay refuses stalls
    there and gets the same bytes from the learner; a keyless non-loopback relay will not start."""
    import asyncio
    import shutil
    import threading
    import zlib

    import trio
    import zmq.asyncio

    from agentgym.actors.weight_fetch import fetch_weights
    from agentgym.auth.keys import ClientKeys, load_keypair, load_public, write_keys
    from agentgym.auth.server import ServerKeys
    from agentgym.cluster.fleet import make_version
    from agentgym.learner.transport import WeightSnapshot, open_hub
    from agentgym.protocol import WeightsReady
    from agentgym.protocol.weights import RawTensor, make_chunks

    keys = tmp_path / "keys"
    write_keys(keys, ["relay", "actor-0", "actor-1"])
    relay_allow = tmp_path / "relay-allow"
    relay_allow.mkdir()
    shutil.copy(keys / "authorized" / "actor-0.key", relay_allow)  # actor-1 is the learner's, not the relay's

    raw = make_version(1, 1.0)
    chunks = make_chunks(1, [RawTensor(n, "bfloat16", (len(d) // 2,), d) for n, d in raw], 128 * 1024)
    ready = WeightsReady(
        version=1, step=1, turn_limit=1, num_chunks=len(chunks), total_bytes=sum(len(d) for _, d in chunks)
    )
    control = _free_port()
    while _free_port() == control + 1:  # the weights port is control + 1: it must be free too
        control = _free_port()
    learner_addr = f"tcp://127.0.0.1:{control + 1}"
    hub_box: dict = {}
    started, done = threading.Event(), threading.Event()

    async def learner() -> None:
        async with open_hub(
            f"tcp://127.0.0.1:{control}", keys=ServerKeys.load(keys / "learner.key_secret", keys / "authorized")
        ) as hub:
            hub.publish_weights(WeightSnapshot.build(1, chunks))
            hub_box["hub"] = hub
            started.set()
            while not done.is_set():
                await trio.sleep(0.05)

    t = threading.Thread(target=trio.run, args=(learner,), daemon=True)
    t.start()
    assert started.wait(30)
    hub = hub_box["hub"]
    relay_port = _free_port()
    relay_addr = f"tcp://127.0.0.1:{relay_port}"
    relay = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgym.cluster.relay",
            "--bind",
            relay_addr,
            "--upstream",
            learner_addr,
            "--upstream-key",
            str(keys / "learner.key"),
            "--secret-key",
            str(keys / "actors" / "relay.key_secret"),
            "--authorized-keys",
            str(relay_allow),
            "--log-json",
            str(tmp_path / "relay.jsonl"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    # Serving once it has connected upstream (it binds first): on a loaded machine its start-up
    # outlasts the fetches' 3 s stall, and actor-0 would go to the learner before it is there.
    deadline = time.monotonic() + 120
    while not read_events(tmp_path / "relay.jsonl", "relay_upstream"):
        assert relay.poll() is None and time.monotonic() < deadline, "the relay did not start"
        time.sleep(0.1)
    relay_pub = load_public(keys / "authorized" / "relay.key")
    learner_pub = load_public(keys / "learner.key")

    def client(name: str, server: bytes) -> ClientKeys:
        pub, sec = load_keypair(keys / "actors" / f"{name}.key_secret")
        return ClientKeys(pub, sec, server)

    async def fetch(name: str) -> dict[str, int]:
        ctx = zmq.asyncio.Context()
        try:
            _, got = await fetch_weights(
                ctx,
                [relay_addr, learner_addr],
                ready,
                keys=[client(name, relay_pub), client(name, learner_pub)],
                stall_s=3.0,
                timeout_s=60,
            )
        finally:
            ctx.term()
        return {t.name: zlib.crc32(t.data) for t in got}

    want = {n: zlib.crc32(d) for n, d in raw}
    try:
        assert asyncio.run(fetch("actor-0")) == want
        assert hub.weight_chunks_served == len(chunks)  # all of it through the relay, once
        assert asyncio.run(fetch("actor-1")) == want
        assert hub.weight_chunks_served == 2 * len(chunks)  # refused by the relay: straight from the learner
        assert read_events(tmp_path / "relay.jsonl", "peer_refused_unknown_key")
        open_bind = subprocess.run(
            [sys.executable, "-m", "agentgym.cluster.relay", "--bind", "tcp://0.0.0.0:1", "--upstream", learner_addr],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert open_bind.returncode == 2 and "--insecure" in open_bind.stderr
    finally:
        relay.terminate()
        relay.wait(timeout=30)
        done.set()
        t.join(10)


def test_an_actor_fetches_from_its_relay_first_and_the_learner_last(tmp_path: Path) -> None:
    """actor.weights_relay puts the relay before the learner's weights port; actor.relay_key
    needs the actor's own key pair (the relay admits actors by it)."""
    from agentgym.actors.runtime import Actor
    from agentgym.auth.keys import KeyFileError, write_keys
    from agentgym.config import Config

    plain = Actor(Config.model_validate({"actor": {"learner": "tcp://10.0.0.1:7000"}}))
    assert plain.weights.sources(7001) == (["tcp://10.0.0.1:7001"], [None])
    relayed = Actor(
        Config.model_validate({"actor": {"learner": "tcp://10.0.0.1:7000", "weights_relay": "tcp://127.0.0.1:5560"}})
    )
    assert relayed.weights.sources(7001) == (["tcp://127.0.0.1:5560", "tcp://10.0.0.1:7001"], [None, None])
    write_keys(tmp_path, ["relay", "a"])
    with pytest.raises(KeyFileError, match="actor.relay_key needs actor.secret_key"):
        Actor(Config.model_validate({"actor": {"relay_key": str(tmp_path / "authorized" / "relay.key")}}))
    keyed = Actor(
        Config.model_validate(
            {
                "actor": {
                    "learner": "tcp://10.0.0.1:7000",
                    "weights_relay": "tcp://127.0.0.1:5560",
                    "relay_key": str(tmp_path / "authorized" / "relay.key"),
                    "secret_key": str(tmp_path / "actors" / "a.key_secret"),
                    "learner_key": str(tmp_path / "learner.key"),
                }
            }
        )
    )
    _, (relay_keys, learner_keys) = keyed.weights.sources(7001)
    assert relay_keys.server != learner_keys.server and relay_keys.public == learner_keys.public
    for a in (plain, relayed, keyed):
        a.link.close()
        a.ctx.term()
