"""CURVE authentication on the learner's two ports, real sockets: a peer without a key, or with a
key the learner does not list, gets no Welcome, no weight chunk and cannot submit anything (the
learner never sees its frames); a listed peer works as before; an open non-loopback bind is
refused; ``agentgym keys`` writes files ZeroMQ loads; a Hello of another protocol version is
answered with a Reject naming both versions.
"""

from __future__ import annotations

import asyncio
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import trio
import zmq
import zmq.asyncio
import zmq.auth

from agentgym.actors.transport import ActorRejected, ControlLink
from agentgym.actors.weight_fetch import fetch_weights
from agentgym.auth.keys import ClientKeys, apply_client, write_keys
from agentgym.auth.server import InsecureBind, ServerKeys, is_loopback
from agentgym.host.netutil import free_port_pair, zmtp_mechanism
from agentgym.learner.transport import WeightSnapshot, open_hub
from agentgym.protocol import Heartbeat, Hello, Reject, WeightsReady, decode, encode
from agentgym.protocol.weights import RawTensor, make_chunks
from agentgym.protocol.wire import MAGIC, PROTOCOL_VERSION

REPO = Path(__file__).resolve().parents[1]


class KeyedHub:
    """open_hub (with keys) under trio in a thread; what reaches the learner lands in ``received``."""

    def __init__(self, bind: str, keys: ServerKeys | None) -> None:
        self.bind, self.keys = bind, keys
        self.received: queue.Queue = queue.Queue()
        self.commands: queue.Queue = queue.Queue()
        self.ready = threading.Event()
        self.hub = None
        self.thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    async def _main(self) -> None:
        async with open_hub(self.bind, keys=self.keys) as hub, trio.open_nursery() as n:
            self.hub = hub
            self.ready.set()

            async def pump() -> None:
                async for item in hub.inbox:
                    self.received.put(item)

            n.start_soon(pump)
            while True:
                try:
                    cmd = self.commands.get_nowait()
                except queue.Empty:
                    await trio.sleep(0.01)
                    continue
                if cmd is None:
                    n.cancel_scope.cancel()
                    return
                cmd(hub)

    def __enter__(self) -> KeyedHub:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.commands.put(None)
        self.thread.join(10)
        assert not self.thread.is_alive()


def hello(actor_id: str) -> Hello:
    return Hello(actor_id=actor_id, hostname="h", pid=1, model_fingerprint="fp", engine="x", max_groups=1)


@pytest.fixture(scope="module")
def keydir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    write_keys(d, ["known"])
    # a pair the learner never listed, and a second learner pair (an impostor learner)
    zmq.auth.create_certificates(d, "stranger")
    zmq.auth.create_certificates(d, "impostor")
    return d


def server_keys(d: Path) -> ServerKeys:
    keys = ServerKeys.load(d / "learner.key_secret", d / "authorized")
    assert keys is not None
    return keys


def snapshot() -> WeightSnapshot:
    tensors = [RawTensor("w", "float32", (64, 64), np.arange(64 * 64, dtype=np.float32).tobytes())]
    return WeightSnapshot.build(1, make_chunks(1, tensors, 4096))


def test_only_allow_listed_actors_get_a_welcome_weights_or_a_hearing(keydir: Path) -> None:
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    known = ClientKeys.load(keydir / "actors" / "known.key_secret", keydir / "learner.key")
    stranger = ClientKeys.load(keydir / "stranger.key_secret", keydir / "learner.key")
    with KeyedHub(addr, server_keys(keydir)) as kh:
        snap = snapshot()
        kh.commands.put(lambda hub: hub.publish_weights(snap))
        ready = WeightsReady(version=1, step=1, turn_limit=3, num_chunks=len(snap.frames), total_bytes=snap.total_bytes)

        async def refused(keys: ClientKeys | None, actor_id: str, why: str) -> None:
            ctx = zmq.asyncio.Context()
            link = ControlLink(ctx, addr, actor_id, keys)
            try:
                with pytest.raises(ActorRejected, match=why):  # told why at once, not after a timeout
                    await link.handshake(hello(actor_id), timeout_s=30)
                for _ in range(20):  # and anything else it tries to send is never delivered either
                    try:
                        link.sock.send_multipart(encode(Heartbeat(actor_id=actor_id, weight_version=7)), zmq.NOBLOCK)
                    except zmq.Again:
                        pass  # nothing to deliver to: the learner never completed its handshake
                with pytest.raises(TimeoutError):
                    await fetch_weights(ctx, f"tcp://127.0.0.1:{port + 1}", ready, timeout_s=1.0, keys=keys)
            finally:  # a failed check must not leave an open context for the GC to hang on later
                link.close()
                ctx.destroy(linger=0)

        # A keyless actor is told why, even when resets hide the learner's greeting from ZeroMQ
        # three times in a row on a loaded machine (actors/transport.py, VAGUE_FAILURES_DEFINITE).
        asyncio.run(refused(None, "plain", "requires CURVE keys and this actor has none"))
        asyncio.run(refused(stranger, "stranger", "refused this actor's CURVE key"))
        assert kh.received.empty(), kh.received.get()  # the learner never saw a frame of theirs
        assert kh.hub.weight_chunks_served == 0
        assert kh.hub.allow.refused >= 1  # the stranger's key was asked about and refused

        async def admitted() -> None:
            ctx = zmq.asyncio.Context()
            link = ControlLink(ctx, addr, "known", known)
            task = asyncio.create_task(link.handshake(hello("known"), timeout_s=10))
            peer, msg = await asyncio.to_thread(kh.received.get, True, 10)
            assert peer == b"known" and msg == hello("known")
            kh.commands.put(lambda hub: hub.send(peer, Reject(field="test", reason="seen")))
            with pytest.raises(ActorRejected, match="seen"):  # the learner's answer reaches it
                await task
            version, tensors = await fetch_weights(ctx, f"tcp://127.0.0.1:{port + 1}", ready, keys=known)
            assert version == 1 and b"".join(t.data for t in tensors) == np.arange(64 * 64, dtype=np.float32).tobytes()
            link.close()
            ctx.term()

        asyncio.run(admitted())
        assert kh.hub.weight_chunks_served == len(snap.frames)


def test_an_actor_holding_another_learner_key_does_not_talk_to_this_learner(keydir: Path) -> None:
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    wrong_server = ClientKeys.load(keydir / "actors" / "known.key_secret", keydir / "impostor.key")
    with KeyedHub(addr, server_keys(keydir)) as kh:

        async def client() -> None:
            ctx = zmq.asyncio.Context()
            link = ControlLink(ctx, addr, "known", wrong_server)
            with pytest.raises(ActorRejected, match="actor.learner_key is not the public key"):
                await link.handshake(hello("known"), timeout_s=30)
            link.close()
            ctx.term()

        asyncio.run(client())
        assert kh.received.empty()


def test_a_learners_greeting_names_its_mechanism_and_a_keyless_actor_cut_off_is_told_by_it(keydir: Path) -> None:
    """The raw read of a ZeroMQ greeting (agentgym.host.netutil.zmtp_mechanism) names a CURVE
    learner, a plain socket, and nothing for what is not ZeroMQ; a keyless actor whose handshakes
    were all cut off (no detail from ZeroMQ) is told by it that the learner needs keys."""
    addr = f"tcp://127.0.0.1:{free_port_pair()}"
    plain_ctx = zmq.Context()
    plain = plain_ctx.socket(zmq.ROUTER)
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never speaks
    try:
        plain_port = plain.bind_to_random_port("tcp://127.0.0.1")
        assert zmtp_mechanism(f"tcp://127.0.0.1:{plain_port}") == "NULL"
        assert zmtp_mechanism(f"tcp://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.3) is None
        assert zmtp_mechanism(f"tcp://127.0.0.1:{free_port_pair()}") is None  # nothing listening
        assert zmtp_mechanism("inproc://x") is None
        with KeyedHub(addr, server_keys(keydir)):
            assert zmtp_mechanism(addr) == "CURVE"

            async def cut_off_three_times() -> str | None:
                ctx = zmq.asyncio.Context()
                link = ControlLink(ctx, f"tcp://127.0.0.1:{free_port_pair()}", "plain")
                try:
                    link._vague_failures = 3  # as three resets would leave it, at an address with no learner
                    unknown = link._handshake_refused()
                    link.addr, link._vague_failures = addr, 3  # and at the keyed learner's
                    return f"{unknown}\n{link._handshake_refused()}"
                finally:
                    link.close()
                    ctx.destroy(linger=0)

            unknown, named = asyncio.run(cut_off_three_times()).split("\n")
            assert "may require CURVE keys" in unknown
            assert "requires CURVE keys and this actor has none" in named
    finally:
        silent.close()
        plain.close(linger=0)
        plain_ctx.term()


def test_a_handshake_cut_off_once_is_tried_again_and_one_cut_off_again_and_again_is_named() -> None:
    """A reset mid-greeting tells the actor nothing (ZeroMQ reports no detail and connects
    again): one is not taken for a refusal, a run of them is, with the likely causes named."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    resets: list[int] = []
    served = threading.Event()

    def cut_off() -> None:  # accepts and resets each connection before the greeting: not ZeroMQ
        listener.settimeout(0.2)
        while not served.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            resets.append(1)

    thread = threading.Thread(target=cut_off, daemon=True)
    thread.start()

    async def client() -> None:
        ctx = zmq.asyncio.Context()
        link = ControlLink(ctx, f"tcp://127.0.0.1:{port}", "plain")
        try:
            with pytest.raises(ActorRejected, match="failed again and again: the learner may require CURVE keys"):
                await link.handshake(hello("plain"), timeout_s=30)
        finally:
            link.close()
            ctx.destroy(linger=0)

    try:
        asyncio.run(client())
    finally:
        served.set()
        thread.join()
        listener.close()
    assert len(resets) >= 3  # given up only after several tries, each cut off


def test_an_actor_added_to_the_allow_list_directory_is_admitted_without_a_restart(tmp_path: Path) -> None:
    write_keys(tmp_path, ["first"])
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    with KeyedHub(addr, server_keys(tmp_path)) as kh:
        write_keys(tmp_path, ["later"])
        later = ClientKeys.load(tmp_path / "actors" / "later.key_secret", tmp_path / "learner.key")
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        apply_client(sock, later)
        sock.connect(addr)
        sock.send_multipart(encode(hello("later")))
        peer, msg = kh.received.get(timeout=10)
        assert msg == hello("later")
        sock.close(0)
        ctx.term()


def test_open_non_loopback_bind_is_refused_unless_keys_or_insecure(keydir: Path, tmp_path: Path) -> None:
    port = free_port_pair("0.0.0.0")

    async def bind(keys: ServerKeys | None, insecure: bool) -> None:
        async with open_hub(f"tcp://0.0.0.0:{port}", keys=keys, insecure=insecure):
            pass

    with pytest.raises(InsecureBind, match="--insecure"):
        trio.run(bind, None, False)
    trio.run(bind, None, True)
    trio.run(bind, server_keys(keydir), False)
    # the command refuses before loading anything heavy, with the same words
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentgym.learner.main",
            "--bind",
            f"tcp://0.0.0.0:{port}",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 2 and "no CURVE keys are configured" in proc.stderr, proc.stderr


def test_keys_command_writes_certificates_zeromq_loads(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", "keys", str(tmp_path / "k"), "--actors", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--authorized-keys" in proc.stdout and "--learner-key" in proc.stdout
    k = tmp_path / "k"
    lpub, lsec = zmq.auth.load_certificate(k / "learner.key_secret")
    assert zmq.auth.load_certificate(k / "learner.key") == (lpub, None) and lsec is not None
    for name in ("actor-0", "actor-1"):
        pub, sec = zmq.auth.load_certificate(k / "actors" / f"{name}.key_secret")
        assert sec is not None and zmq.auth.load_certificate(k / "authorized" / f"{name}.key") == (pub, None)
        assert (k / "actors" / f"{name}.key_secret").stat().st_mode & 0o077 == 0  # secret: owner only
    again = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", "keys", str(k), "--actors", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert again.returncode == 0 and zmq.auth.load_certificate(k / "learner.key") == (lpub, None)  # kept
    assert sorted(p.name for p in (k / "authorized").iterdir()) == ["actor-0.key", "actor-1.key", "actor-2.key"]


def test_hello_of_another_protocol_version_gets_a_reject_naming_both_versions() -> None:
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    with KeyedHub(addr, None) as kh:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(addr)
        frames = encode(hello("future"))
        sock.send_multipart([MAGIC + bytes((9, Hello.KIND)), frames[1]])
        assert sock.poll(10_000)
        msg, _ = decode(sock.recv_multipart())
        assert isinstance(msg, Reject) and msg.field == "protocol_version"
        assert "version 9" in msg.reason and f"speaks {PROTOCOL_VERSION}" in msg.reason and "fp" not in msg.reason
        sock.close(0)
        ctx.term()
        assert kh.received.empty() and kh.hub.bad_messages == 1

    # The actor's side: a learner framing its answers in another version is refused by name.
    router_ctx = zmq.Context()
    router = router_ctx.socket(zmq.ROUTER)
    router.bind(addr)

    async def client() -> None:
        ctx = zmq.asyncio.Context()
        link = ControlLink(ctx, addr, "a")
        task = asyncio.create_task(link.handshake(hello("a"), timeout_s=10))
        peer, *_ = await asyncio.to_thread(router.recv_multipart)
        body = encode(Reject(field="x", reason="y"))[1]
        router.send_multipart([peer, MAGIC + bytes((9, Reject.KIND)), body])
        with pytest.raises(ActorRejected, match=f"protocol version 9, this actor {PROTOCOL_VERSION}"):
            await task
        link.close()
        ctx.term()

    asyncio.run(client())
    router.close(0)
    router_ctx.term()


@pytest.mark.parametrize(
    ("bind", "loopback"),
    [
        ("tcp://127.0.0.1:5555", True),
        ("tcp://127.3.2.1:5555", True),
        ("tcp://localhost:5555", True),
        ("tcp://[::1]:5555", True),
        ("tcp://0.0.0.0:5555", False),
        ("tcp://*:5555", False),
        ("tcp://eth0:5555", False),
        ("tcp://10.0.0.7:5555", False),
        ("tcp://[::]:5555", False),
    ],
)
def test_which_binds_count_as_loopback(bind: str, loopback: bool) -> None:
    assert is_loopback(bind) is loopback
