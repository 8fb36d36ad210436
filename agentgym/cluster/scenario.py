"""A learner host and actor hosts as real processes, driven step by step: ``Scenario`` starts,
kills and restarts ``agentgym-learner`` and ``agentgym-actor`` processes on a ``Cluster`` of
network namespaces or on ``Loopback`` (agentgym/cluster/netns.py) and reads what the learner
wrote. ``agentgym chaos`` (agentgym/cli/chaos.py), the multi-host tests and the preemption bench
use it.

    sc = Scenario(Loopback(["learner", "a1"]), work, model, FAST)
    sc.start_learner(); sc.start_actor("a1"); sc.wait(lambda: sc.step() >= 2, 120, "two steps")

Actors run from another working directory with no model of their own and no config: they take
the learner's model path and everything about playing from its Welcome.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agentgym.cluster.netns import Cluster, Loopback
from agentgym.observe.logs import read_events

REPO = Path(__file__).resolve().parents[2]  # the checkout: configs/quickstart.toml
PORT = 5555

FAST = [
    "learner.heartbeat_interval_s=0.5",
    "learner.actor_timeout_s=6.0",
    "learner.checkpoint_every=4",
    "learner.checkpoint_minutes=0",
    "learner.batch_groups=4",
    "rollout.group_size=4",
    "eval.at_start=false",
    "eval.at_end=false",
    "eval.every=0",
    "learner.log_episodes=0",
]
"""Small timeouts and batches: failures are detected in seconds and steps come quickly."""


def trained_on(run_dir: Path, actor_id: str) -> bool:
    """Whether the learner of ``run_dir`` has taken a step on a group of ``actor_id``'s: its
    per-step ``logprob_agreement`` (learner/records/flight_recorder.py) names the actors it trained on."""
    return any(actor_id in e["means"] for e in read_events(run_dir / "logs" / "learner.jsonl", "logprob_agreement"))


class Scenario:
    """One learner host and actor hosts, real processes, driven step by step."""

    def __init__(
        self,
        net: Cluster,
        work: Path,
        model: Path,
        overrides: list[str],
        config: Path | None = None,
        engine: str = "hf",
    ) -> None:
        self.net, self.work, self.model, self.engine = net, work, model, engine
        self.config = config or REPO / "configs" / "quickstart.toml"
        self.overrides = overrides
        self.run_dir = work / "run"
        self.learner_home = work / "learner-home"
        self.actor_home = work / "actor-home"  # another working directory: no models/ in it
        for d in (self.learner_home, self.actor_home):
            d.mkdir(parents=True, exist_ok=True)
        self.port = PORT
        if isinstance(net, Loopback):
            from agentgym.host.netutil import free_port_pair

            self.port = free_port_pair()
        self.learner: subprocess.Popen | None = None
        self.actors: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.started = 0

    @property
    def address(self) -> str:
        return f"tcp://{self.net.addr('learner')}:{self.port}"

    def start_learner(self, resume: bool = False, extra: list[str] = []) -> None:  # noqa: B006 - never mutated
        """``extra``: more ``-o`` overrides (a resume takes the run's config.toml, then these)."""
        py = [sys.executable, "-m", "agentgym.learner.main"]
        if resume:
            argv = [*py, "--resume", str(self.run_dir), *[a for o in extra for a in ("-o", o)]]
        else:
            argv = [
                *py,
                "--config",
                str(self.config),
                "--run-dir",
                str(self.run_dir),
                "--bind",
                self.address,
                "-o",
                f'model.path="{self.model}"',
                "-o",
                "model.create_tiny=false",
                "-o",
                "learner.insecure=true",
                *[a for o in [*self.overrides, *extra] for a in ("-o", o)],
            ]
        self.learner = self.net.spawn(
            "learner", argv, self.learner_home, self.work / "consoles" / "learner.log", self.env
        )

    def start_actor(self, host: str, extra: list[str] = [], actor_id: str | None = None) -> str:  # noqa: B006
        """A new actor process on ``host`` (a new id, or ``actor_id``); returns its id. ``extra``: more
        ``-o`` overrides (never mutated)."""
        self.started += 1
        actor_id = actor_id or f"{host}-{self.started}"
        argv = [
            sys.executable,
            "-m",
            "agentgym.actors.main",
            "--learner",
            self.address,
            "--actor-id",
            actor_id,
            "--run-dir",
            str(self.actor_home / host),
            "-o",
            f'actor.engine="{self.engine}"',
            "-o",
            "actor.env_workers=4",  # 4 processes, not 16: an actor starts faster on 2 cores
            "--connect-timeout",
            "120",
            *[a for o in extra for a in ("-o", o)],
        ]
        self.actors[actor_id] = self.net.spawn(
            host, argv, self.actor_home, self.work / "consoles" / f"{actor_id}.log", self.env
        )
        return actor_id

    def kill(self, p: subprocess.Popen) -> None:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # with its engine's children
            except ProcessLookupError:
                pass
        p.wait()

    # ------------------------------------------------------------------ observing
    def step(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return 0
        lines = path.read_text().splitlines()
        for line in reversed(lines):
            try:
                return int(json.loads(line)["step"])
            except (ValueError, KeyError):
                continue
        return 0

    def events(self, name: str) -> list[dict]:
        return read_events(self.run_dir / "logs" / "learner.jsonl", name)

    def trained_on(self, actor_id: str) -> bool:
        return trained_on(self.run_dir, actor_id)

    def checkpoints(self) -> list[int]:
        return sorted(
            int(p.parent.parent.name.split("_")[1]) for p in self.run_dir.glob("checkpoints/step_*/trainer/state.pt")
        )

    def wait(self, cond: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if self.learner is not None and self.learner.poll() is not None and self.learner.returncode != 0:
                raise RuntimeError(
                    f"the learner exited with {self.learner.returncode} while waiting for {what}:\n{self.tail('learner')}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout_s:.0f} s (step {self.step()}):\n{self.tail('learner')}")
            time.sleep(0.3)

    def tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join((self.work / "consoles" / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())
