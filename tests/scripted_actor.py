"""Scripted actors on real sockets, for tests that drive a live learner process: each says Hello,
heartbeats, and plays every ticket it is granted after ``delay_s`` (None: never, a hoarder).

    peer = ScriptedActor(ctx, addr, "fast", delay_s=0.05, fingerprint=fp)
    while learner_running:
        peer.step()                      # read what the learner sent, answer what is due, heartbeat

``LiveLearner`` runs ``agentgym.learner.main`` on a free loopback port for them to drive.
Episodes are the one-token bandit of ``learner_fixtures`` played with the newest weight version
announced, so every group is valid; ``statuses`` counts the learner's acks by status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import zmq
from learner_fixtures import GOOD, PROMPTS, episode, make_cfg

from agentgym.actors.transport import HELLOS_BEFORE_RECONNECT, RECONNECT_AFTER_S
from agentgym.auth.keys import ClientKeys, apply_client
from agentgym.config import model_fingerprint, to_toml
from agentgym.host.netutil import free_port_pair
from agentgym.protocol import (
    Ack,
    Grant,
    Heartbeat,
    Hello,
    Reject,
    Rollout,
    Ticket,
    WeightsReady,
    Welcome,
    decode,
    encode,
)

REPO = Path(__file__).resolve().parents[1]
GROUP, BATCH = 2, 2


def play(t: Ticket, actor: str, version: int, group_size: int, logprob: float = -0.7) -> Rollout:
    eps = [
        episode(PROMPTS[i % 2], [[GOOD]], [float(i % 2)], version=version, behav=[logprob]) for i in range(group_size)
    ]
    return Rollout(group_id=t.group_id, actor_id=actor, env=t.env, task_id=t.task_id, episodes=eps)


class ScriptedActor:
    def __init__(
        self,
        ctx: zmq.Context,
        addr: str,
        name: str,
        *,
        delay_s: float | None,
        fingerprint: str,
        group_size: int,
        max_groups: int = 4,
        keys: ClientKeys | None = None,
        session: str = "",
        heartbeat_s: float = 0.3,
    ) -> None:
        self.name, self.delay_s, self.group_size, self.heartbeat_s = name, delay_s, group_size, heartbeat_s
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.ROUTING_ID, name.encode())
        apply_client(self.sock, keys)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(addr)
        self.addr, self._unanswered = addr, 0
        self.hello = Hello(
            actor_id=name,
            hostname="h",
            pid=os.getpid(),
            model_fingerprint=fingerprint,
            engine="script",
            max_groups=max_groups,
            session=session or name,
        )
        self.version = 0
        self.due: list[tuple[float, Ticket]] = []
        self.granted: list[Ticket] = []
        self.sent: list[str] = []
        self.statuses: Counter[str] = Counter()
        self.acks: dict[str, str] = {}
        self.got: list[object] = []
        self.welcomed = False
        self._beat = 0.0
        self._hello = time.monotonic()
        self.send(self.hello)

    def send(self, msg: object) -> None:
        self.sock.send_multipart(encode(msg))  # type: ignore[arg-type]  # encode's frames, which pyzmq sends

    def step(self, wait_ms: int = 10) -> None:
        while self.sock.poll(wait_ms):
            wait_ms = 0
            msg = decode(self.sock.recv_multipart())[0]
            self.got.append(msg)
            if isinstance(msg, Welcome):
                self.welcomed = True
            elif isinstance(msg, Grant):
                for t in msg.tickets:
                    if all(t.group_id != d.group_id for _, d in self.due) and t.group_id not in self.acks:
                        self.granted.append(t)
                        if self.delay_s is not None:
                            self.due.append((time.monotonic() + self.delay_s, t))
            elif isinstance(msg, WeightsReady):
                self.version = max(self.version, msg.version)
            elif isinstance(msg, Ack):
                for g, s in zip(msg.group_ids, msg.statuses):
                    self.acks[g] = s
                    self.statuses[s] += 1
            elif isinstance(msg, Reject):
                self.welcomed = False
        now = time.monotonic()
        for item in [d for d in self.due if d[0] <= now]:
            self.due.remove(item)
            self.send(play(item[1], self.name, self.version, self.group_size))
            self.sent.append(item[1].group_id)
        if now - self._beat >= self.heartbeat_s:
            self._beat = now
            if not self.welcomed and now - self._hello >= 2.0 and not any(isinstance(m, Reject) for m in self.got):
                self._hello = now  # every 2 s until answered, as actors do: a connection may have lost it
                self._unanswered += 1
                if self._unanswered % HELLOS_BEFORE_RECONNECT == 0:  # as ControlLink.handshake does
                    self.sock.disconnect(self.addr)
                    time.sleep(RECONNECT_AFTER_S)
                    self.sock.connect(self.addr)
                self.send(self.hello)
            self.send(
                Heartbeat(
                    actor_id=self.name, weight_version=self.version, stats={"capacity": float(self.hello.max_groups)}
                )
            )

    def close(self) -> None:
        self.sock.close(0)


class LiveLearner:
    """``agentgym.learner.main`` in a process of its own on a free loopback port."""

    def __init__(self, model_dir: Path, tmp: Path, steps: int, *overrides: str, keys: Path | None = None) -> None:
        port = free_port_pair()
        self.addr = f"tcp://127.0.0.1:{port}"
        cfg = make_cfg(
            model_dir,
            f"run.max_steps={steps}",
            f'learner.bind="{self.addr}"',
            f"learner.batch_groups={BATCH}",
            f"rollout.group_size={GROUP}",
            "learner.actor_timeout_s=600",
            "learner.log_episodes=0",
            "learner.heartbeat_interval_s=0.2",
            *overrides,
        )
        (tmp / "config.toml").write_text(to_toml(cfg))
        self.fingerprint = model_fingerprint(cfg.model.path)
        self.run_dir, self.tmp = tmp / "run", tmp
        self.log = (tmp / "learner.log").open("wb")
        curve = (
            []
            if keys is None
            else ["--secret-key", str(keys / "learner.key_secret"), "--authorized-keys", str(keys / "authorized")]
        )
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentgym.learner.main",
                "--log-level",
                "info",
                "--config",
                str(tmp / "config.toml"),
                "--run-dir",
                str(self.run_dir),
                *curve,
            ],
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def run(self, actors: list[ScriptedActor], timeout_s: float = 240, join: dict | None = None) -> dict:
        """Drive ``actors`` until the learner exits; ``join``: {version: actor factory} started later."""
        deadline = time.monotonic() + timeout_s
        try:
            while self.proc.poll() is None:
                assert time.monotonic() < deadline, f"learner stalled:\n{self.text()[-3000:]}"
                for a in actors:
                    a.step(5)
                for v in sorted(join or {}):
                    # any actor's view: one may be reconnecting (unanswered Hellos) while another trains
                    if any(a.version >= v for a in actors):
                        actors.append(join.pop(v)())  # type: ignore[union-attr]  # the actor to join is there
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.log.close()
        assert self.proc.returncode == 0, self.text()[-3000:]
        return json.loads((self.run_dir / "summary.json").read_text())

    def __enter__(self) -> LiveLearner:
        return self

    def __exit__(self, *exc: object) -> None:
        """A test that failed before ``run`` leaves no learner behind."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def text(self) -> str:
        return (self.tmp / "learner.log").read_text(errors="replace")
