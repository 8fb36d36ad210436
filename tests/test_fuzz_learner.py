"""A live learner process under fire: while an honest scripted actor trains it, hostile peers send
thousands of frames (truncated, oversized, random, wrong protocol version, unknown kinds, valid
headers with garbage bodies, messages of the wrong direction, replayed Acks and Grants,
rollouts for other actors' tickets and for tickets nobody issued, out-of-vocabulary ids, a
flood from an actor that never said Hello). The learner uses CURVE keys and all of them hold
admitted keys (a buggy or compromised actor); a stranger's key gets nothing. The learner keeps
training to the end, its memory stays bounded, and every bad frame is counted where it belongs.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import numpy as np
import psutil
import pytest
import zmq
import zmq.auth
from learner_fixtures import GOOD, PROMPTS, episode, make_cfg

from agentgym.auth.keys import ClientKeys, apply_client, write_keys
from agentgym.config import Config, model_fingerprint, to_toml
from agentgym.host.netutil import free_port_pair
from agentgym.protocol import Ack, Grant, Heartbeat, Hello, Leave, Reject, Rollout, Ticket, WeightsReady, decode, encode
from agentgym.protocol.wire import MAGIC, PROTOCOL_VERSION

REPO = Path(__file__).resolve().parents[1]
GROUP, BATCH, STEPS = 2, 2, 6
MiB = 1024 * 1024


class Peer:
    """A DEALER with a routing id that reads whatever comes back."""

    def __init__(self, ctx: zmq.Context, addr: str, name: str, keys: ClientKeys) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.ROUTING_ID, name.encode())
        apply_client(self.sock, keys)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 100_000)
        self.sock.connect(addr)
        self.got: list[object] = []

    def send(self, frames: list) -> None:
        self.sock.send_multipart(frames)

    def read(self, wait_ms: int = 0) -> None:
        while self.sock.poll(wait_ms):
            wait_ms = 0
            self.got.append(decode(self.sock.recv_multipart())[0])


def group(t: object, actor: str, version: int, token: int = GOOD) -> Rollout:
    eps = [episode(PROMPTS[i % 2], [[token]], [float(i % 2)], version=version, behav=[-0.7]) for i in range(GROUP)]
    return Rollout(group_id=t.group_id, actor_id=actor, env=t.env, task_id=t.task_id, episodes=eps)  # type: ignore[attr-defined]  # a Ticket


@pytest.fixture(scope="module")
def model_dir(fallback_model: Path) -> Path:
    return fallback_model  # tests/conftest.py


def test_live_learner_keeps_training_under_hostile_frames_and_counts_every_one(model_dir: Path, tmp_path: Path) -> None:
    port = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    cfg: Config = make_cfg(
        model_dir,
        f"run.max_steps={STEPS}",
        f'learner.bind="{addr}"',
        f"learner.batch_groups={BATCH}",
        f"rollout.group_size={GROUP}",
        "learner.actor_timeout_s=600",
        "learner.log_episodes=0",
    )
    (tmp_path / "config.toml").write_text(to_toml(cfg))
    run_dir = tmp_path / "run"
    log = (tmp_path / "learner.log").open("wb")
    # With CURVE keys, as across hosts: the honest and the hostile actors hold admitted keys (a
    # buggy or compromised actor is admitted too); a stranger's key is refused before any frame.
    k = tmp_path / "keys"
    write_keys(k, ["honest", "evil", "ghost"])
    zmq.auth.create_certificates(tmp_path, "stranger")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgym.learner.main",
            "--log-level",
            "warning",
            "--config",
            str(tmp_path / "config.toml"),
            "--run-dir",
            str(run_dir),
            "--secret-key",
            str(k / "learner.key_secret"),
            "--authorized-keys",
            str(k / "authorized"),
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    ctx = zmq.Context()
    fp = model_fingerprint(cfg.model.path)
    honest, evil, ghost = (
        Peer(ctx, addr, name, ClientKeys.load(k / "actors" / f"{name}.key_secret", k / "learner.key"))  # type: ignore[arg-type]  # the keys exist: made above
        for name in ("honest", "evil", "ghost")
    )
    stranger = Peer(ctx, addr, "stranger", ClientKeys.load(tmp_path / "stranger.key_secret", k / "learner.key"))  # type: ignore[arg-type]  # the keys exist: made above
    rng = np.random.default_rng(0)
    sent = {"bad": 0, "version": 0, "unexpected_kind": 0, "actor_id_not_sender": 0, "unknown_actor": 0, "replays": 0}
    invalid_sent = {"not_this_actors_ticket": 0, "unknown_ticket": 0, "token_out_of_vocab": 0, "too_many_tokens": 0}
    rss: list[int] = []
    st = {"version": 0}
    tickets: list = []
    evil_tickets: list = []
    played: list[Rollout] = []
    acked: set[str] = set()
    honest_acks: list[Ack] = []
    forged = iter(range(10**9))
    hdr = MAGIC + bytes((PROTOCOL_VERSION, Hello.KIND))

    def hello(name: str) -> list:
        return encode(
            Hello(actor_id=name, hostname="h", pid=os.getpid(), model_fingerprint=fp, engine="script", max_groups=1)
        )

    def pump(wait_ms: int = 100) -> None:
        """Read what the learner sent to honest and evil."""
        honest.read(wait_ms)
        evil.read()
        ghost.read()
        for m in honest.got:
            if isinstance(m, Grant):
                tickets.extend(m.tickets)
            elif isinstance(m, WeightsReady):
                st["version"] = max(st["version"], m.version)
            elif isinstance(m, Ack):
                acked.update(m.group_ids)
                honest_acks.append(m)
        honest.got.clear()
        evil_tickets.extend(t for m in evil.got if isinstance(m, Grant) for t in m.tickets)
        evil.got = [m for m in evil.got if not isinstance(m, Grant)]

    def answer() -> None:
        while tickets:
            played.append(group(tickets.pop(0), "honest", st["version"]))
            honest.send(encode(played[-1]))

    def evil_ack(group_id: str) -> bool:
        return any(isinstance(m, Ack) and group_id in m.group_ids for m in evil.got)

    def burst() -> None:
        """About 100 hostile frames of every kind from the three hostile peers."""
        junk = [
            [b"x"],
            [hdr],
            [rng.bytes(50)],
            [b"AG", b"body"],
            [MAGIC + bytes((PROTOCOL_VERSION, 200)), b"\x80"],
            [hdr, rng.bytes(200)],
            [MAGIC + bytes((PROTOCOL_VERSION, Rollout.KIND)), b"\x81\xa8group_id\xc4\x03abc"],
            [
                hdr,
                encode(Hello(actor_id="evil", hostname="h", pid=1, model_fingerprint=fp, engine="x", max_groups=1))[1],
                b"extra",
            ],
            [hdr, b"\x81\xa8actor_id\xa2\xff\xfe"],  # a string that is not UTF-8
        ] * 5 + [[hdr, rng.bytes(int(rng.integers(1, 900_000)))], [hdr, b"\x00" * (MiB + 10)]]
        for f in junk:
            evil.send(f)
        sent["bad"] += len(junk)
        for _ in range(5):
            evil.send([MAGIC + bytes((PROTOCOL_VERSION + 1, Hello.KIND)), b"\x80"])  # answered with a Reject
            sent["version"] += 1
        for m in [*honest_acks[-5:], Grant(tickets=[]), Reject(field="x", reason="y")]:  # replayed / wrong way
            evil.send(encode(m))
            sent["unexpected_kind"] += 1
        if played:  # impostor: messages naming the honest actor, from evil's socket
            for m in (
                played[-1],
                Heartbeat(actor_id="honest"),
                Leave(actor_id="honest", reason="bye"),
                Hello(actor_id="honest", hostname="h", pid=1, model_fingerprint=fp, engine="x", max_groups=9),
            ):
                evil.send(encode(m))
                sent["actor_id_not_sender"] += 1
        for _ in range(20):  # an actor that never said hello
            ghost.send(encode(Heartbeat(actor_id="ghost", weight_version=1)))
            sent["unknown_actor"] += 1
        for r in [r for r in played[-3:] if r.group_id in acked]:  # replays of answered groups
            evil.send(encode(msgspec.structs.replace(r, actor_id="evil")))
            sent["replays"] += 1
        for _ in range(5):  # tickets nobody issued
            fake = Ticket(group_id=f"forged-{next(forged)}", env="guess_number", task_id=1)
            evil.send(encode(group(fake, "evil", st["version"])))
            invalid_sent["unknown_ticket"] += 1
        if tickets:  # one of honest's open tickets, answered by evil first (honest waits for that)
            t = tickets[0]
            evil.send(encode(group(t, "evil", st["version"])))
            invalid_sent["not_this_actors_ticket"] += 1
            while not evil_ack(t.group_id):
                pump(20)
        while evil_tickets:  # evil's own tickets, with ids past the vocabulary or too long
            r = group(evil_tickets.pop(0), "evil", st["version"], token=10_000)
            if rng.random() < 0.5:
                r.episodes[0] = episode([1] * 70_000, [[GOOD]], [1.0], version=st["version"], behav=[-0.1])
                invalid_sent["too_many_tokens"] += 1
            else:
                invalid_sent["token_out_of_vocab"] += 1
            evil.send(encode(r))

    try:
        honest.send(hello("honest"))
        evil.send(hello("evil"))
        with contextlib.suppress(zmq.Again):  # nothing to queue it for: its handshake fails
            stranger.sock.send_multipart(hello("stranger"), zmq.NOBLOCK)
        ps = psutil.Process(proc.pid)
        deadline = time.monotonic() + 400
        # Phase 1: train under fire.
        n = 0
        while st["version"] < STEPS - 2:
            assert proc.poll() is None, (
                f"the learner exited under fire:\n{(tmp_path / 'learner.log').read_text()[-3000:]}"
            )
            assert time.monotonic() < deadline, "training did not progress under fire"
            pump()
            if st["version"] >= 1:  # the learner is up and training: fire
                burst()
                rss.append(ps.memory_info().rss)
                n += 1
            if n % 3 == 0 and len(played) < BATCH * (st["version"] + 1):
                answer()  # honest feeds one step at a time, every 3rd burst: the fire spans the steps
        # Phase 2: a barrier per hostile peer, so that every frame sent has been read.
        evil.send(encode(group(Ticket(group_id="last", env="guess_number", task_id=1), "evil", 0)))
        invalid_sent["unknown_ticket"] += 1
        while not evil_ack("last") or sum(isinstance(m, Heartbeat) for m in ghost.got) < sent["unknown_actor"]:
            assert proc.poll() is None and time.monotonic() < deadline
            pump(20)
            answer()
        # Phase 3: the honest actor finishes the run.
        while proc.poll() is None:
            assert time.monotonic() < deadline + 200, "the learner did not finish"
            pump(100)
            answer()
    finally:
        stranger.read()
        for p in (honest, evil, ghost, stranger):
            p.sock.close(0)
        ctx.term()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.close()
    assert proc.returncode == 0, (tmp_path / "learner.log").read_text()[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "run finished" and summary["step"] == STEPS
    assert summary["auth_refused"] >= 1 and stranger.got == []  # the stranger: no Welcome, no Grant, nothing
    bursts = len(rss)
    assert bursts >= 3, bursts  # the fire lasted several training steps
    total = sum(sent.values()) + sum(invalid_sent.values())
    print(
        f"hostile frames sent: {total} {sent} {invalid_sent}; learner RSS MiB first/max {rss[0] // MiB}/{max(rss) // MiB}"
    )
    assert total >= 1000, total
    # replayed rollouts are duplicates, never trained twice; a stolen ticket is invalid, or a
    # duplicate when honest's own answer happened to be read first
    stolen_late = summary["groups"]["duplicate"] - sent["replays"]
    assert 0 <= stolen_late < invalid_sent["not_this_actors_ticket"]
    invalid_sent["not_this_actors_ticket"] -= stolen_late
    # every bad frame, counted where it belongs
    assert summary["bad_messages"] == sent["bad"] + sent["version"]
    assert sum(isinstance(m, Reject) and m.field == "protocol_version" for m in evil.got) == sent["version"]
    assert summary["dropped_messages"] == {
        k: sent[k] for k in ("unexpected_kind", "actor_id_not_sender", "unknown_actor")
    }
    assert sum(isinstance(m, Heartbeat) and m.weight_version == -1 for m in ghost.got) == sent["unknown_actor"]
    assert summary["invalid_reasons"] == {k: v for k, v in invalid_sent.items() if v}
    assert summary["groups"]["invalid"] == sum(invalid_sent.values())
    assert summary["groups"]["accepted"] >= STEPS * BATCH
    # memory: what the learner holds after the first bursts is what it holds after the last ones
    first = max(rss[: max(1, bursts // 3)])
    assert max(rss) - first < 150 * MiB, [r // MiB for r in rss]
