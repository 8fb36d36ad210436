"""``agentgym-learner --resume RUN_DIR``: a learner process stopped after N steps and resumed for N
more takes exactly the steps of an uninterrupted learner on the same data (same losses, same
weights, bit for bit), keeps its dedupe state and its turn-limit schedule position.

The data comes from a scripted actor in this process that speaks the real protocol over ZeroMQ:
Hello, then one deterministic bandit group per granted ticket (learner_fixtures), played in
sync mode so that each batch is exactly the groups the script sent, in order.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
import zmq
from learner_fixtures import BAD, GOOD, PROMPTS, episode, make_cfg

from agentgym.config import Config, model_fingerprint, to_toml
from agentgym.host.netutil import free_port_pair
from agentgym.learner.training.checkpoint import STATE_FILE, latest_checkpoint, read_model_weights
from agentgym.learner.training.trainer import Trainer
from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model
from agentgym.observe.logs import read_metrics
from agentgym.protocol import Ack, Grant, Hello, Rollout, WeightsReady, Welcome
from agentgym.protocol.wire import decode, encode, max_frame_bytes

REPO = Path(__file__).resolve().parents[1]
GROUP_SIZE, BATCH = 4, 2
COMPARED = (
    "loss",
    "pg_loss",
    "value_loss",
    "kl_ref",
    "entropy",
    "grad_norm",
    "lr",
    "clip_frac",
    "approx_kl",
    "is_weight_mean",
    "is_weight_max",
    "explained_variance",
    "staleness_mean",
)


def group(k: int, version: int, group_id: str) -> Rollout:
    """The k-th group the script plays: a function of k and the version only (never of the ticket's
    group id or task id, which differ between a run and its resumption)."""
    prompt = PROMPTS[k % 2]
    eps = []
    for i in range(GROUP_SIZE):
        tok = GOOD if (i + k) % 3 else BAD
        # behaviour logprobs that are not the learner's: importance weights and the TIS cap do work
        eps.append(episode(prompt, [[tok]], [1.0 if tok == GOOD else 0.0], version=version, behav=[-3.0 - 0.5 * i]))
    return Rollout(group_id=group_id, actor_id="scripted", env="bandit", task_id=k, episodes=eps)


class ScriptedActor:
    """The actor side of the control protocol, without an engine or environments."""

    def __init__(self, bind: str, cfg: Config) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.ROUTING_ID, b"scripted")
        self.sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes())
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(bind)
        self.tickets: list = []
        self.weights: list[WeightsReady] = []
        self.acks: dict[str, str] = {}
        self.welcome: Welcome | None = None
        self.send(
            Hello(
                actor_id="scripted",
                hostname="test",
                pid=os.getpid(),
                model_fingerprint=model_fingerprint(cfg.model.path),
                engine="script",
                max_groups=BATCH,
            )
        )

    def send(self, msg: object) -> None:
        self.sock.send_multipart(encode(msg))  # type: ignore[arg-type]  # encode's frames, which pyzmq sends

    def pump(self, until, proc: subprocess.Popen, timeout_s: float = 300.0) -> None:
        """Read messages until ``until()`` holds; fail if the learner exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while not until():
            assert proc.poll() is None, f"the learner exited with {proc.returncode} while the script waited"
            if time.monotonic() >= deadline:
                raise AssertionError(f"the learner did not answer in time; its log and stacks:\n{_stacks(proc)}")
            if self.sock.poll(200):
                self.handle()

    def drain(self) -> None:
        """Read what has arrived (after the learner exited: its last messages are queued here)."""
        while self.sock.poll(500):
            self.handle()

    def handle(self) -> None:
        msg, _ = decode(self.sock.recv_multipart())
        if isinstance(msg, Welcome):
            self.welcome = msg
        elif isinstance(msg, Grant):
            self.tickets += msg.tickets
        elif isinstance(msg, WeightsReady):
            self.weights.append(msg)
        elif isinstance(msg, Ack):
            self.acks.update(zip(msg.group_ids, msg.statuses, strict=True))

    def play(self, first: int, n: int, proc: subprocess.Popen) -> list[Rollout]:
        """Play groups first..first+n-1 on the tickets as they are granted; each waits for its ack."""
        sent = []
        for k in range(first, first + n):
            self.pump(lambda: bool(self.tickets), proc)
            t = self.tickets.pop(0)
            r = msgspec.structs.replace(group(k, t.min_version, t.group_id), env=t.env, task_id=t.task_id)
            self.send(r)
            self.pump(lambda: r.group_id in self.acks, proc)  # noqa: B023
            assert self.acks[r.group_id] == "accepted", (k, self.acks[r.group_id])
            sent.append(r)
        return sent

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def _learner(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentgym.learner.main", "--log-level", "warning", *args],
            cwd=REPO,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    proc.log_path = log  # type: ignore[attr-defined]  # a note on the process object for the test's report
    return proc


def _stacks(proc: subprocess.Popen) -> str:
    """The tail of a live learner's log after it printed its threads' stacks (SIGUSR1)."""
    log = getattr(proc, "log_path", None)
    if log is None:
        return "(no log)"
    proc.send_signal(signal.SIGUSR1)
    time.sleep(2)
    return log.read_text()[-8000:]


def _stop(proc: subprocess.Popen, sig: int | None, log: Path) -> int:
    if sig is not None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the learner did not exit:\n{log.read_text()[-3000:]}") from None


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("resume") / "m", corpus=FALLBACK_CORPUS, seed=0)


def _equal_trees(a: object, b: object, where: str = "") -> None:
    """Nested dicts/lists of tensors and plain values, equal bit for bit."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _equal_trees(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _equal_trees(x, y, f"{where}/{i}")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    else:
        assert a == b, where


@pytest.mark.slow
@pytest.mark.parametrize("dp", ["one_rank", "fsdp_two_ranks"])
def test_learner_resumed_from_its_run_dir_equals_an_uninterrupted_learner(
    model_dir: Path, tmp_path: Path, dp: str
) -> None:
    # fsdp_two_ranks: the learner process and its second rank hold one shard each of the weights
    # and AdamW state; exporting, checkpointing and resuming gather and re-shard them.
    ranks = (
        ("learner.dp_size=2", 'learner.dp_mode="fsdp"', "learner.dist_timeout_s=300") if dp == "fsdp_two_ranks" else ()
    )
    port = free_port_pair()
    bind = f"tcp://127.0.0.1:{port}"
    cfg = make_cfg(
        model_dir,
        'run.mode="sync"',
        "run.max_steps=4",
        f'learner.bind="{bind}"',
        f"learner.batch_groups={BATCH}",
        f"rollout.group_size={GROUP_SIZE}",
        "learner.checkpoint_every=2",
        "learner.actor_timeout_s=600",
        "learner.algorithm=ppo",
        "learner.kl_coef=0.05",
        "learner.entropy_coef=0.01",
        "learner.minibatches=2",
        "learner.warmup_steps=1",
        "learner.lr_schedule=cosine",
        "learner.tis_cap=2.0",
        "learner.lr=3e-3",
        "schedule.turn_limits=[[0, 4], [3, 6]]",
        *ranks,
    )
    config = tmp_path / "config.toml"
    config.write_text(to_toml(cfg))
    run_dir, log = tmp_path / "run", tmp_path / "learner.log"

    # Run A: 2 steps, then SIGTERM (after the step-2 checkpoint, before anything else is trained).
    proc = _learner(["--config", str(config), "--run-dir", str(run_dir)], log)
    actor = ScriptedActor(bind, cfg)
    try:
        sent = actor.play(0, 2 * BATCH, proc)
        ckpts = run_dir / "checkpoints"
        actor.pump(lambda: latest_checkpoint(ckpts) == ckpts / "step_000002" and len(actor.weights) >= 3, proc)
        assert _stop(proc, signal.SIGTERM, log) == 130, log.read_text()[-3000:]  # interrupted
        weights_a = [(w.version, w.step, w.turn_limit) for w in actor.weights]
    finally:
        actor.close()
        if proc.poll() is None:
            proc.kill()
    assert weights_a == [(0, 0, 4), (1, 1, 4), (2, 2, 4)]
    assert len(read_metrics(run_dir / "metrics.jsonl")) == 2

    # Run B: `agentgym-learner --resume RUN_DIR` (its config.toml), 2 more steps to run.max_steps.
    proc = _learner(["--resume", str(run_dir)], log)
    actor = ScriptedActor(bind, cfg)
    try:
        actor.pump(lambda: actor.welcome is not None and bool(actor.weights), proc)
        # A group the first learner accepted comes again (an actor re-sends what it thinks unacked).
        actor.send(sent[0])
        actor.pump(lambda: sent[0].group_id in actor.acks, proc)
        assert actor.acks[sent[0].group_id] == "duplicate"
        sent += actor.play(2 * BATCH, 2 * BATCH, proc)
        assert _stop(proc, None, log) == 0, log.read_text()[-3000:]
        actor.drain()
        weights_b = [(w.version, w.step, w.turn_limit) for w in actor.weights]
    finally:
        actor.close()
        if proc.poll() is None:
            proc.kill()
    # the schedule position comes from the restored step: limit 4 before step 3, then 6
    assert weights_b == [(2, 2, 4), (3, 3, 6), (4, 4, 6)]

    # The uninterrupted learner: the same 4 batches in one Trainer (with its own second rank).
    straight = Trainer.load(cfg)
    try:
        m_straight = [straight.train_step(sent[i : i + BATCH]) for i in range(0, len(sent), BATCH)]
        straight.save(tmp_path / "straight" / "step_000004", {})
    finally:
        straight.close()
    recs = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    for rec, m in zip(recs, m_straight, strict=True):
        for k in COMPARED:
            assert rec[k] == m[k] or (np.isnan(rec[k]) and np.isnan(m[k])), (rec["step"], k, rec[k], m[k])
    final = latest_checkpoint(run_dir / "checkpoints")
    assert final is not None and final.name == "step_000004"
    # its checkpoint equals the resumed learner's: weights, value head, AdamW state, step, version
    _equal_trees(read_model_weights(final), read_model_weights(tmp_path / "straight" / "step_000004"), "weights")
    s_res, s_straight = (
        torch.load(d / STATE_FILE, weights_only=True) for d in (final, tmp_path / "straight" / "step_000004")
    )
    assert (s_res["step"], s_res["version"]) == (s_straight["step"], s_straight["version"]) == (4, 4)
    _equal_trees(s_res["value_head"], s_straight["value_head"], "value_head")
    _equal_trees(s_res["optimizer"], s_straight["optimizer"], "optimizer")
