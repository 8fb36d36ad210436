"""``agentgym chaos``: a learner and actors on one machine, with random kills and link cuts.

    agentgym chaos --minutes 5 --seed 1 [--work DIR] [--loopback]

Hosts are network namespaces when this runs as root (``agentgym.cluster.netns``: a learner host and
actor hosts on a private bridge, 10.231.x.0/24), else processes on loopback where a cut link is
played by freezing the host's processes. Every ``--every`` seconds (randomised) one of these
happens: an actor's link is cut for longer than ``learner.actor_timeout_s`` and restored; an
actor is SIGKILLed and a new one started; the learner is SIGKILLed and restarted with
``--resume``. At the end the learner gets SIGTERM (it checkpoints and writes summary.json) and
the ticket accounting is printed (learner/accounting.py): every issued ticket is trained,
expired, stale, invalid, failed, untrained or in flight at the end; ``unaccounted`` must be 0.
Exit code 0 when the accounting holds, 1 when it does not.

``Scenario`` drives one such cluster; tests/test_multihost.py uses it for a fixed sequence.
Actors run from another working directory with no model of their own and no config: they take
the learner's model path and everything about playing from its Welcome.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agentgym.cluster.netns import Cluster, Loopback, netns_unavailable
from agentgym.observe.logs import read_events

REPO = Path(__file__).resolve().parents[2]
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
    per-step ``logprob_agreement`` (learner/flight_recorder.py) names the actors it trained on."""
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


def _chaos(sc: Scenario, minutes: float, seed: int, every: float, timeout_s: float) -> list[str]:
    rng = random.Random(seed)
    done: list[str] = []
    hosts = ["a1", "a2"]
    live = {h: sc.start_actor(h) for h in hosts}
    sc.start_learner()
    sc.wait(lambda: sc.step() >= 2, 300, "first steps")
    end = time.monotonic() + 60 * minutes
    while time.monotonic() < end:
        time.sleep(rng.uniform(0.5 * every, 1.5 * every))
        kind = rng.choice(["cut", "cut", "kill_actor", "kill_actor", "kill_learner"])
        if kind == "kill_learner" and not sc.checkpoints():
            kind = "cut"
        host = rng.choice(hosts)
        at = sc.step()
        if kind == "cut":
            seconds = rng.uniform(1.5, 3.0) * timeout_s
            sc.net.cut(host)
            time.sleep(seconds)
            sc.net.restore(host)
            done.append(f"step {at}: cut {host} for {seconds:.1f} s")
        elif kind == "kill_actor":
            sc.kill(sc.actors[live[host]])
            live[host] = sc.start_actor(host)
            done.append(f"step {at}: SIGKILL actor {host}, started {live[host]}")
        else:
            assert sc.learner is not None
            sc.kill(sc.learner)
            sc.start_learner(resume=True)
            done.append(f"step {at}: SIGKILL learner, resumed from step {sc.checkpoints()[-1]}")
        print(done[-1], flush=True)
        sc.wait(lambda a=at: sc.step() > a, 300, "a step after the event")  # the run goes on
    assert sc.learner is not None
    sc.learner.send_signal(signal.SIGTERM)
    sc.learner.wait(timeout=120)
    return done


def add_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "chaos",
        help="train under random kills and link cuts; print the ticket accounting",
        description=__doc__.split("\n\n")[2],
    )
    c.add_argument("--minutes", type=float, default=5.0, help="how long to inflict failures (default: 5)")
    c.add_argument("--seed", type=int, default=0, help="seed of the failure sequence")
    c.add_argument("--every", type=float, default=20.0, help="mean seconds between failures (default: 20)")
    c.add_argument("--work", type=Path, help="where the run and consoles go (default: a temporary directory, kept)")
    c.add_argument("--loopback", action="store_true", help="processes on 127.0.0.1 even when namespaces are possible")
    c.add_argument(
        "--engine", default="hf", choices=["hf", "vllm"], help="actors' engine (default: hf, starts in a second)"
    )


def run(args: argparse.Namespace) -> int:
    from agentgym.learner.accounting import format_table
    from agentgym.models.tiny import make_default_tiny_model

    work = args.work or Path(tempfile.mkdtemp(prefix="agentgym-chaos-"))
    model = work / "model" / "tiny"
    if not (model / "config.json").exists():
        make_default_tiny_model(model, seed=0)
    why = netns_unavailable() if not args.loopback else "--loopback"
    net = Loopback(["learner", "a1", "a2"]) if why else Cluster(["learner", "a1", "a2"])
    print(f"hosts: {'loopback processes (' + why + ')' if why else 'network namespaces'}; work: {work}", flush=True)
    overrides = [*FAST, "run.max_steps=100000"]
    with net:
        sc = Scenario(net, work, model.resolve(), overrides, engine=args.engine)
        events = _chaos(sc, args.minutes, args.seed, args.every, 6.0)
    summary = sc.summary()
    acc = summary["tickets"]
    print(f"\n{len(events)} failures in {args.minutes:g} min (seed {args.seed}); learner steps {summary['step']}")
    print(format_table(acc))
    ok = acc["unaccounted"] == 0 and acc["accepted_not_buffered"] == 0
    print("accounting holds" if ok else "ACCOUNTING BROKEN")
    return 0 if ok else 1
