"""``agentgym slurm``: one training run as a Slurm job, started by the job's batch step.

    sbatch -N 3 scripts/slurm/agentgym.sbatch --run-dir /shared/runs/r1 --config configs/X.toml \\
        -o learner.insecure=true

Inside the allocation (``SLURM_JOB_NODELIST``), the first node runs the learner as a job step;
every other node runs one ``agentgym-relay`` step (bound to its loopback, fed by the learner's
weights port) and one actor step of ``--actors-per-node`` actors that fetch weights from that
relay. A one-node job runs the learner and its actors on that node (no relay).

GPUs: the learner's step asks for ``launch.slurm_learner_gpus`` (default: ``learner.dp_size``
when ``learner.device = "cuda"``, else none) and each actor task for ``launch.slurm_actor_gpus``
(default: 1 when ``actor.device = "cuda"``, else none), as ``srun --gpus-per-task=N``: Slurm
binds them (``CUDA_VISIBLE_DEVICES``) and keeps steps off each other's GPUs. The job must hold
them: ``sbatch --gres=gpu:N`` (or ``--gpus-per-node``).

Addresses and ports come from Slurm: the learner's host is the first node's ``NodeAddr``
(``scontrol show node``), and the ports are ``--port`` or ``20000 + 4 * (SLURM_JOB_ID % 2000)``
(control; weights on +1, the relays on +2), so two jobs sharing a node do not collide.

Failures and signals:
  - an actor step that ends while the learner runs (``scancel JOB.STEP``, a node's actor dying)
    is started again, up to ``--max-actor-restarts`` times;
  - SIGTERM or SIGINT to the batch step (``scancel``, preemption with ``--signal=B:TERM@T``,
    ``scontrol requeue``) goes to the actors first (they hand their live episodes over, then
    leave), then to the learner (it checkpoints); the relays stop last;
  - a requeued job (``SLURM_RESTART_COUNT`` > 0) with a checkpoint in ``--run-dir`` starts its
    learner with ``--resume``: the run goes on from its newest checkpoint.

Exit code: the learner's (0 when the run finished).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from agentgym.config import Config

log = structlog.get_logger(__name__)

ACTORS_LEAVE_S = 30.0
"""After a signal, how long the actors get to hand over and exit before the learner is told."""


class NotInJob(RuntimeError):
    """Raised when the Slurm variables a job has are missing or malformed."""


@dataclass(frozen=True)
class Layout:
    """Where each process of the run goes, from the job's environment."""

    job_id: str
    nodes: list[str]
    learner_node: str
    learner_addr: str
    port: int
    restart_count: int

    @property
    def actor_nodes(self) -> list[str]:
        """Nodes that run actors: all but the learner's, or the learner's in a one-node job."""
        return self.nodes[1:] or self.nodes

    @property
    def relays(self) -> bool:
        return len(self.nodes) > 1

    @property
    def learner_url(self) -> str:
        return f"tcp://{self.learner_addr}:{self.port}"

    @property
    def relay_url(self) -> str:
        return f"tcp://127.0.0.1:{self.port + 2}"


def _scontrol(*args: str) -> str:
    out = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise NotInJob(f"scontrol {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def node_addr(node: str) -> str:
    """The node's ``NodeAddr`` as Slurm knows it (its hostname unless the site set another)."""
    for field in _scontrol("show", "node", "--oneliner", node).split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return node


def layout_from_env(env: dict[str, str] | os._Environ[str], port: int | None = None) -> Layout:
    """The run's layout from the batch step's environment; a missing variable raises NotInJob."""
    job_id = env.get("SLURM_JOB_ID", "")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    if not job_id.isdigit() or not nodelist:
        raise NotInJob(
            "agentgym slurm: SLURM_JOB_ID and SLURM_JOB_NODELIST are not set; run it inside a job "
            "(sbatch scripts/slurm/agentgym.sbatch ...)"
        )
    nodes = _scontrol("show", "hostnames", nodelist).split()
    if not nodes:
        raise NotInJob(f"agentgym slurm: SLURM_JOB_NODELIST={nodelist!r} names no node")
    restarts = env.get("SLURM_RESTART_COUNT", "0")
    base = port if port is not None else 20000 + 4 * (int(job_id) % 2000)
    return Layout(
        job_id,
        nodes,
        nodes[0],
        node_addr(nodes[0]),
        base,
        int(restarts) if restarts.isdigit() else 0,
    )


def step_gpus(cfg: Config) -> tuple[int, int]:
    """(GPUs for the learner's step, GPUs per actor task) from the config (``launch.slurm_*_gpus``,
    else from the devices): none for a CPU run."""
    la, lc, ac = cfg.launch, cfg.learner, cfg.actor
    learner = la.slurm_learner_gpus if la.slurm_learner_gpus is not None else (lc.dp_size if lc.device == "cuda" else 0)
    actor = la.slurm_actor_gpus if la.slurm_actor_gpus is not None else (1 if ac.device == "cuda" else 0)
    return learner, actor


def has_checkpoint(run_dir: Path) -> bool:
    return any(run_dir.glob("checkpoints/step_*/trainer/state.pt"))


class Job:
    """The batch step's children: one ``srun`` per learner, relay and per-node actor step."""

    def __init__(
        self,
        lay: Layout,
        run_dir: Path,
        common: list[str],
        actors_per_node: int,
        resume: bool,
        max_actor_restarts: int,
        gpus: tuple[int, int] = (0, 0),
        chunk_mib: int = 16,
    ) -> None:
        self.lay, self.run_dir, self.common = lay, run_dir, common
        self.chunk_mib = chunk_mib
        """learner.weight_chunk_mib: the relays' cap on frames from the learner."""
        self.learner_gpus, self.actor_gpus = gpus
        self.actors_per_node, self.resume, self.max_actor_restarts = (
            actors_per_node,
            resume,
            max_actor_restarts,
        )
        self.py = sys.executable  # the same interpreter on every node: a shared filesystem
        self.learner: subprocess.Popen | None = None
        self.relays: subprocess.Popen | None = None
        self.actors: dict[str, subprocess.Popen] = {}
        self.restarts = 0
        self.stopping = False
        self.signalled: int | None = None
        """The signal the batch step got (the main loop acts on it: a handler must not block)."""
        self.signalled_at: float | None = None
        """When the first signal came (``time.monotonic``): it shortens the wait of ``stop_rest``."""

    @staticmethod
    def srun_argv(
        name: str, nodes: list[str], ntasks_per_node: int, argv: list[str], gpus_per_task: int = 0
    ) -> list[str]:
        """The ``srun`` command line of one step."""
        # --overlap: the steps share the nodes' CPUs (an actor next to its node's relay);
        # --kill-on-bad-exit=0: one task that fails does not end its step's other tasks;
        # --gpus-per-task: Slurm binds that many of the job's GPUs to each task (none: no GPU flag).
        gpus = [f"--gpus-per-task={gpus_per_task}"] if gpus_per_task else []
        return [
            "srun",
            f"--job-name={name}",
            f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes) * ntasks_per_node}",
            f"--nodelist={','.join(nodes)}",
            *gpus,
            "--overlap",
            "--kill-on-bad-exit=0",
            *argv,
        ]

    def srun(
        self, name: str, nodes: list[str], ntasks_per_node: int, argv: list[str], gpus_per_task: int = 0
    ) -> subprocess.Popen:
        cmd = self.srun_argv(name, nodes, ntasks_per_node, argv, gpus_per_task)
        log.info(
            "step_starting",
            step=name,
            nodes=",".join(nodes),
            tasks=len(nodes) * ntasks_per_node,
            gpus_per_task=gpus_per_task,
        )
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL)

    def start_learner(self) -> None:
        lay = self.lay
        where = ["--resume", str(self.run_dir)] if self.resume else ["--run-dir", str(self.run_dir)]
        log.info(
            "learner_starting",
            node=lay.learner_node,
            address=lay.learner_url,
            resume=self.resume,
            restart_count=lay.restart_count,
        )
        self.learner = self.srun(
            "agentgym-learner",
            [lay.learner_node],
            1,
            [self.py, "-m", "agentgym.learner.main", *self.common, *where, "--bind", lay.learner_url],
            self.learner_gpus,
        )

    def start_relays(self) -> None:
        if not self.lay.relays:
            return
        upstream = f"tcp://{self.lay.learner_addr}:{self.lay.port + 1}"
        self.relays = self.srun(
            "agentgym-relay",
            self.lay.actor_nodes,
            1,
            [
                self.py,
                "-m",
                "agentgym.cluster.relay",
                "--bind",
                self.lay.relay_url,
                "--upstream",
                upstream,
                "--chunk-mib",
                str(self.chunk_mib),
            ],
        )

    def start_actors(self, node: str) -> None:
        relay = ["--weights-relay", self.lay.relay_url] if self.lay.relays else []
        argv = [
            self.py,
            "-m",
            "agentgym.actors.main",
            *self.common,
            "--learner",
            self.lay.learner_url,
            *relay,
            "--run-dir",
            str(self.run_dir),
            "--connect-timeout",
            "600",
        ]
        # Named by node, task, job start and step: the learner's logs name the host, a restarted
        # step is a new actor (an id still held by a killed one would be refused until it times
        # out), and a requeued job's step ids, which start again, name other actors than the first
        # start's (whose RUN_DIR/actors/ID.json would otherwise be overwritten).
        script = f'exec "$@" --actor-id "slurm-$SLURMD_NODENAME-$SLURM_LOCALID-{self.lay.restart_count}.$SLURM_STEP_ID"'
        self.actors[node] = self.srun(
            f"agentgym-actors-{node}", [node], self.actors_per_node, ["sh", "-c", script, "sh", *argv], self.actor_gpus
        )

    def shut_down(self) -> None:
        """After a signal: actors first (they hand their live episodes over and leave while the
        learner still listens), then the learner (it checkpoints); srun forwards SIGTERM to its
        step's tasks."""
        for p in self.actors.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + ACTORS_LEAVE_S
        while time.monotonic() < deadline and any(p.poll() is None for p in self.actors.values()):
            time.sleep(0.2)
        if self.learner is not None and self.learner.poll() is None:
            self.learner.send_signal(signal.SIGTERM)

    def run(self) -> int:
        self.start_learner()
        self.start_relays()
        for node in self.lay.actor_nodes:
            self.start_actors(node)
        assert self.learner is not None
        while self.learner.poll() is None:
            if self.signalled is not None and not self.stopping:
                self.stopping = True
                self.shut_down()
            for node, p in list(self.actors.items()):
                if p.poll() is None or self.stopping:
                    continue
                if p.returncode == 2 or self.restarts >= self.max_actor_restarts:
                    log.error(
                        "actor_step_not_restarted",
                        node=node,
                        code=p.returncode,
                        restarts=self.restarts,
                    )
                    continue
                self.restarts += 1
                log.warning(
                    "actor_step_restarted",
                    node=node,
                    code=p.returncode,
                    restarts=self.restarts,
                )
                time.sleep(1.0)
                self.start_actors(node)
            time.sleep(0.5)
        code = self.learner.returncode
        log.info("learner_exited", code=code)
        self.stop_rest()
        return code

    def stop_rest(self) -> None:
        """The learner is gone: actors stop on its Shutdown (within ``ACTORS_EXIT_S``); then the
        relays. After a stop signal (Slurm's SIGTERM, whose KillWait is 30 s by default) the wait
        is ``SIGNAL_GRACE_S`` from the learner's exit or the signal, whichever came later, as for
        ``agentgym train``: an actor whose learner is gone has nothing left to hand over."""
        from agentgym.cli.launch import ACTORS_EXIT_S, SIGNAL_GRACE_S

        exited = time.monotonic()

        def deadline() -> float:
            if self.signalled_at is None:
                return exited + ACTORS_EXIT_S
            return min(exited + ACTORS_EXIT_S, max(exited, self.signalled_at) + SIGNAL_GRACE_S)

        # A polling wait, not Popen.wait: a signal handled meanwhile must be able to shorten it.
        while any(p.poll() is None for p in self.actors.values()) and time.monotonic() < deadline():
            time.sleep(0.1)
        rest = [p for p in [*self.actors.values(), self.relays] if p is not None and p.poll() is None]
        for p in rest:
            p.send_signal(signal.SIGTERM)
        end = time.monotonic() + (SIGNAL_GRACE_S if self.signalled_at is not None else 30.0)
        for p in rest:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("step_killed", pid=p.pid, reason="signal" if self.signalled_at is not None else "timeout")
                p.kill()
                p.wait()


def add_parser(sub: argparse._SubParsersAction) -> None:
    from agentgym.cli.args import add_config_args

    s = sub.add_parser(
        "slurm",
        help="run a learner, relays and actors as steps of the Slurm job it runs in",
        description=__doc__.split("\n\n")[2],
    )
    add_config_args(s)
    s.add_argument(
        "--run-dir",
        type=Path,
        required=True,
        help="run directory on a filesystem every node sees",
    )
    s.add_argument(
        "--actors-per-node",
        type=int,
        default=1,
        help="actor processes on each actor node (default: 1)",
    )
    s.add_argument(
        "--port",
        type=int,
        help="learner control port (weights +1, relays +2); default from SLURM_JOB_ID",
    )
    s.add_argument(
        "--resume",
        action="store_true",
        help="resume --run-dir even on the job's first start (a requeued job with a checkpoint resumes without it)",
    )
    s.add_argument(
        "--max-actor-restarts",
        type=int,
        default=20,
        help="actor steps started again at most (default: 20)",
    )


def run(args: argparse.Namespace) -> int:
    from agentgym.observe.logs import setup_logging

    if args.actors_per_node < 1:
        print(
            f"agentgym slurm: --actors-per-node must be >= 1, got {args.actors_per_node}",
            file=sys.stderr,
        )
        return 2
    try:
        lay = layout_from_env(os.environ, args.port)
    except NotInJob as exc:
        print(exc, file=sys.stderr)
        return 2
    run_dir = args.run_dir.resolve()
    setup_logging("slurm", run_dir / "logs" / f"slurm-{lay.job_id}.jsonl", args.log_level)
    resume = has_checkpoint(run_dir) and (args.resume or lay.restart_count > 0)
    if args.resume and not resume:
        log.error("nothing_to_resume", run_dir=str(run_dir))
        return 2
    config = ["--config", str(args.config)] if args.config else []
    common = [*config, *[a for o in args.override for a in ("-o", o)]]
    from agentgym.cli.args import resolve_config
    from agentgym.models.base import ensure_model

    cfg = resolve_config(args, [])  # a bad key or value exits 2 here, before any step
    ensure_model(cfg)  # the demo model (model.create_tiny), made once here, before any step starts
    gpus = step_gpus(cfg)
    job = Job(
        lay, run_dir, common, args.actors_per_node, resume, args.max_actor_restarts, gpus, cfg.learner.weight_chunk_mib
    )
    log.info(
        "slurm_job",
        job_id=lay.job_id,
        nodes=lay.nodes,
        learner=lay.learner_url,
        restart_count=lay.restart_count,
        learner_gpus=gpus[0],
        actor_gpus_per_task=gpus[1],
    )

    def on_signal(sig: int, _frame: object) -> None:
        log.warning("slurm_job_signalled", signal=signal.Signals(sig).name)
        job.signalled = sig
        if job.signalled_at is None:
            job.signalled_at = time.monotonic()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, on_signal)
    return job.run()
