"""The learner process, once its config is resolved: ``run_learner_process`` starts what the
process needs (the guardian, the allocator setting, logging) and runs rank 0's service or a
data-parallel rank's worker.

    code = run_learner_process(cfg, run_dir, resume=False, log_level="info", rank_signals=None)

The command (``agentgym-learner``, agentgym/cli/learner.py) parses and checks the config, then
calls it. torch and trio are imported here only when it runs, so the command's ``--help`` and
its config errors answer at once.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentgym.config import Config
    from agentgym.learner.stopping import RankSignals


def worker_rank() -> int | None:
    """RANK when this process is a learner rank > 0 started the torchrun way, else None."""
    rank = os.environ.get("RANK", "0")
    return int(rank) if "WORLD_SIZE" in os.environ and rank.isdigit() and int(rank) > 0 else None


def run_learner_process(
    cfg: Config, run_dir: Path, *, resume: bool, log_level: str, rank_signals: RankSignals | None
) -> int:
    """Run the learner of ``cfg`` in this process until the run ends; returns the exit code.
    ``rank_signals``: a rank > 0's stop signals, held since the process started."""
    import trio

    from agentgym.host import early_signals
    from agentgym.host.allocator import keep_freed_memory
    from agentgym.host.guardian import start_guardian
    from agentgym.learner.service import run_learner
    from agentgym.observe.logs import quiet_libraries, setup_logging

    start_guardian()  # data-parallel rank processes must not outlive a killed learner
    keep_freed_memory()  # each rollout's buffers are reused, not returned to the OS and faulted back in
    quiet_libraries(log_level)
    worker = worker_rank()
    role = "learner" if worker is None else f"learner-rank{worker}"
    setup_logging(role, run_dir / "logs" / f"{role}.jsonl", log_level)
    if worker is not None:  # RANK > 0 (torchrun or by hand): a data-parallel worker of rank 0
        from agentgym.learner.training.distributed import run_worker
        from agentgym.learner.training.trainer import Trainer

        return run_worker(cfg, Trainer.build, rank_signals)
    # Held from here to the process's exit, outside the signal receiver that run_learner keeps
    # open meanwhile: a repeated or late signal must never reach the default action (death).
    early_signals.hold(signal.SIGINT)
    try:
        return trio.run(run_learner, cfg, run_dir, resume)
    finally:
        early_signals.ignore_from_now()
