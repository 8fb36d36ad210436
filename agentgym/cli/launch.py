"""``agentgym train``: the embedded default — one learner and N actors as local processes.

    agentgym train --config configs/quickstart.toml --actors 2

The learner and every actor are separate processes talking over real ZeroMQ sockets on
loopback, exactly as they would across hosts. The launcher only starts them, forwards
Ctrl-C and SIGTERM, and reaps them: the run ends when the learner ends. Once the learner has
exited, its actors get ``ACTORS_EXIT_S`` to stop on its Shutdown; a stop signal that comes during
that wait ends it, ``SIGNAL_GRACE_S`` later (docs/operations.md, "Stopping a run").
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import structlog

from agentgym.config import Config
from agentgym.models.base import ensure_model

log = structlog.get_logger(__name__)


ACTORS_EXIT_S = 60.0
"""Once the learner has exited: how long its actors get to stop on its Shutdown (an engine's
teardown included) before the launcher kills those still running."""

SIGNAL_GRACE_S = 5.0
"""A stop signal that comes once the learner has exited (a second Ctrl-C, the rest of a job's
SIGTERM) ends the wait for the actors: it is passed on to them, and those still running this long
after it are killed. An actor whose learner is gone has nothing left to hand over, and one that
does not stop within this is stuck (a stopped process, a hung engine)."""

LOCAL_CONNECT_S = 600.0
"""How long a local actor waits for the learner at least (``actor.connect_timeout_s`` if
longer). The launcher ends the actors when the learner exits, so a local actor has no learner
to give up on; it only waits for one that starts slowly: on a loaded machine the learner took
69 s to listen (load average 14), and both actors, at the default 60 s, gave up 2 s before."""

BIND = "VLLM_CPU_OMP_THREADS_BIND"
"""vLLM's CPU cores for its worker's threads (a GPU engine ignores it)."""


def _spawn(
    module: str, args: list[str], console: Path | None = None, nice: int = 0, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start ``python -m module``; with ``console``, its stdout and stderr go to that file; ``nice``
    is added to the child's niceness (inherited by everything it starts); ``env`` is added to the
    environment the child inherits."""
    cmd = [sys.executable, "-m", module, *args]
    preexec = (lambda: os.nice(nice)) if nice else None
    child_env = {**os.environ, **env} if env else None
    if console is None:
        return subprocess.Popen(cmd, preexec_fn=preexec, env=child_env)
    console.parent.mkdir(parents=True, exist_ok=True)
    with console.open("ab") as out:  # the child keeps its own handle
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=preexec, env=child_env)


def actor_cores(actors: int, cores: list[int]) -> list[str]:
    """Each local actor's ``VLLM_CPU_OMP_THREADS_BIND``: ``cores`` cut into ``actors`` contiguous
    slices (the first ones a core larger when they do not divide evenly); with fewer cores than
    actors, one core each, round robin."""
    if not cores:
        raise ValueError("actor_cores: no cores to share")
    if len(cores) < actors:
        return [str(cores[i % len(cores)]) for i in range(actors)]
    share, extra = divmod(len(cores), actors)
    out, start = [], 0
    for i in range(actors):
        n = share + (i < extra)
        out.append(",".join(str(c) for c in cores[start : start + n]))
        start += n
    return out


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _spawn_actors(
    cfg: Config,
    common: list[str],
    run_dir: Path,
    consoles: list[Path],
    actor_log_level: str,
    procs: list[subprocess.Popen],
) -> list[str]:
    """Start one local actor per console, each appended to ``procs``; returns the cores each one
    is bound to (empty when they are left to vLLM)."""
    actors = len(consoles)
    # Local actors connect to the address the learner binds (a wildcard host means this host).
    learner_addr = re.sub(r"//(\*|0\.0\.0\.0)(?=:)", "//127.0.0.1", cfg.learner.bind)
    # launch.actor_cores = "split": each actor's vLLM engine on cores of its own; left to vLLM,
    # every engine process binds the same cores (docs/engines.md, "Cores").
    split = cfg.launch.actor_cores == "split" and cfg.actor.engine == "vllm" and BIND not in os.environ and actors > 1
    binds = actor_cores(actors, sorted(os.sched_getaffinity(0))) if split else []
    for i in range(actors):
        procs.append(
            _spawn(
                "agentgym.actors.main",
                [
                    *common,
                    "--learner",
                    learner_addr,
                    "--run-dir",
                    str(run_dir),
                    "--log-level",
                    actor_log_level,
                    "--actor-id",
                    f"local-{i}",
                    "--connect-timeout",
                    str(max(cfg.actor.connect_timeout_s, LOCAL_CONNECT_S)),
                ],
                consoles[i],
                nice=cfg.launch.actor_nice,
                env=actor_env(cfg.actor.engine, actors, binds[i] if binds else None) or None,
            )
        )
    return binds


def actor_env(engine: str, actors: int, bind: str | None, cores: int | None = None) -> dict[str, str]:
    """What one local actor's environment adds: its vLLM core set (``bind``), and for an ``hf``
    engine its torch thread count. torch takes every core by default, and the learner and the
    other actors run on the same cores: an OpenMP team wider than its share spins at every barrier
    while the others hold the cores. Each hf actor takes ``cores // (actors + 1)`` threads (the
    learner counts as one more), at least 1, unless OMP_NUM_THREADS is set already."""
    env = {BIND: bind} if bind else {}
    if engine == "hf" and "OMP_NUM_THREADS" not in os.environ:
        n = len(os.sched_getaffinity(0)) if cores is None else cores
        env["OMP_NUM_THREADS"] = str(max(1, n // (actors + 1)))
    return env


def launch(
    cfg: Config,
    config_path: Path | None,
    overrides: list[str],
    run_dir: Path,
    actors: int,
    actor_log_level: str = "warning",
    resume: bool = False,
) -> int:
    """Start the learner and ``actors`` actors; return the learner's exit code. ``resume``: the
    learner continues ``run_dir`` from its newest checkpoint (``agentgym train --resume``)."""
    ensure_model(cfg)  # model.create_tiny (and model.pretrain_steps): the demo's model, made once
    common = [*(["--config", str(config_path)] if config_path else []), *[a for o in overrides for a in ("-o", o)]]
    if resume and not any(run_dir.glob("checkpoints/step_*/trainer/state.pt")):
        log.error("nothing_to_resume", run_dir=str(run_dir), checkpoints=str(run_dir / "checkpoints"))
        return 2
    learner = _spawn("agentgym.learner.main", [*common, "--resume" if resume else "--run-dir", str(run_dir)])
    procs = [learner]
    # An actor's console (its warnings, and what vLLM prints) goes to a file in the run directory,
    # so the learner's progress lines stay readable; an actor that fails has its tail shown here.
    consoles = [run_dir / "logs" / f"actor-local-{i}.console.log" for i in range(actors)]
    binds = _spawn_actors(cfg, common, run_dir, consoles, actor_log_level, procs)
    log.info(
        "launched",
        learner_pid=learner.pid,
        actor_pids=[p.pid for p in procs[1:]],
        run_dir=str(run_dir),
        actor_consoles=str(run_dir / "logs"),
        actor_cores=binds or None,
    )
    reported: set[int] = set()
    late_signal: list[float] = []  # when a stop signal came after the learner had exited

    def report_failed_actors() -> None:
        for i, p in enumerate(procs[1:]):
            if p.returncode not in (None, 0, 130) and i not in reported:
                reported.add(i)
                log.error(
                    "actor_failed",
                    actor_id=f"local-{i}",
                    code=p.returncode,
                    console=str(consoles[i]),
                    tail=_tail(consoles[i]),
                )

    def forward(sig: int, _frame: object) -> None:
        if learner.poll() is not None and not late_signal:
            late_signal.append(time.monotonic())
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while learner.poll() is None:
            for p in procs[1:]:
                p.poll()
            report_failed_actors()
            if all(p.poll() is not None for p in procs[1:]) and actors:
                # every actor died (e.g. a broken install): do not leave the learner waiting forever
                codes = [p.returncode for p in procs[1:]]
                if any(c != 0 for c in codes):
                    log.error("all_actors_exited", codes=codes)
                    learner.terminate()
                    break
            time.sleep(0.5)
        code = learner.wait()
        report_failed_actors()
        waiting = [i for i, p in enumerate(procs[1:]) if p.poll() is None]
        if waiting:
            log.info("actors_waiting", actor_ids=[f"local-{i}" for i in waiting], timeout_s=ACTORS_EXIT_S)
        deadline = time.monotonic() + ACTORS_EXIT_S
        while waiting:
            # A polling wait, not Popen.wait: a signal handled meanwhile must be able to end it.
            if late_signal:
                deadline = min(deadline, late_signal[0] + SIGNAL_GRACE_S)
            if time.monotonic() >= deadline:
                for i in waiting:
                    log.warning(
                        "actor_kill",
                        actor_id=f"local-{i}",
                        pid=procs[1 + i].pid,
                        reason="signal" if late_signal else "timeout",
                    )
                    procs[1 + i].kill()
                    procs[1 + i].wait()
                    reported.add(i)  # killed here, not failed on its own
                break
            time.sleep(0.1)
            waiting = [i for i in waiting if procs[1 + i].poll() is None]
        report_failed_actors()
        return code
    finally:
        for s, h in old.items():
            signal.signal(s, h)
