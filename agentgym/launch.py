"""``agentgym train``: the embedded default — one learner and N actors as local processes.

    agentgym train --config configs/quickstart.toml --actors 2

The learner and every actor are separate processes talking over real ZeroMQ sockets on
loopback, exactly as they would across hosts. The launcher only starts them, forwards
Ctrl-C, and reaps them: the run ends when the learner ends.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import structlog

from agentgym.config import Config

log = structlog.get_logger(__name__)


def _spawn(module: str, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, *args])


def launch(cfg: Config, config_path: Path | None, overrides: list[str], run_dir: Path, actors: int,
           actor_log_level: str = "warning") -> int:
    """Start the learner and ``actors`` actors; return the learner's exit code."""
    if cfg.model.create_tiny and not Path(cfg.model.path, "config.json").exists():
        from agentgym.tiny_model import make_default_tiny_model

        log.info("creating_tiny_model", path=str(cfg.model.path))
        make_default_tiny_model(Path(cfg.model.path), seed=cfg.run.seed)
    common = [*(["--config", str(config_path)] if config_path else []), *[a for o in overrides for a in ("-o", o)]]
    learner = _spawn("agentgym.learner.main", [*common, "--run-dir", str(run_dir)])
    procs = [learner]
    for i in range(actors):
        procs.append(_spawn("agentgym.actors.main", [*common, "--run-dir", str(run_dir),
                                                     "--log-level", actor_log_level, "--actor-id", f"local-{i}"]))
    log.info("launched", learner_pid=learner.pid, actor_pids=[p.pid for p in procs[1:]], run_dir=str(run_dir))

    def forward(sig: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while learner.poll() is None:
            if all(p.poll() is not None for p in procs[1:]) and actors:
                # every actor died (e.g. a broken install): do not leave the learner waiting forever
                codes = [p.returncode for p in procs[1:]]
                if any(c != 0 for c in codes):
                    log.error("all_actors_exited", codes=codes)
                    learner.terminate()
                    break
            time.sleep(0.5)
        code = learner.wait()
        deadline = time.monotonic() + 60
        for p in procs[1:]:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("actor_kill", pid=p.pid)
                p.kill()
                p.wait()
        return code
    finally:
        for s, h in old.items():
            signal.signal(s, h)
