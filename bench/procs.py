"""The learner process the control-plane benchmarks start: quickstart's config over a given model,
with nothing but training (no evaluation, episode log or checkpoints), and the bench's own
overrides after those. Used by bench/control_plane.py, bench/elastic.py and bench/hoarder.py.

    learner = start_learner(model, work, "tcp://127.0.0.1:5555", ["learner.batch_groups=8"])
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TRAINING_ONLY = (
    "model.create_tiny=false",
    "eval.at_start=false",
    "eval.at_end=false",
    "eval.every=0",
    "learner.log_episodes=0",
    "learner.checkpoint_every=0",
    "learner.checkpoint_minutes=0",
    "run.max_steps=100000",
)
"""Overrides every benchmark's learner takes: a bench measures the step loop, nothing beside it."""


def learner_overrides(model: Path, extra: Sequence[str] = ()) -> list[str]:
    """The learner's overrides: ``model`` as its model, TRAINING_ONLY, then ``extra`` (later wins)."""
    return [f'model.path="{model}"', *TRAINING_ONLY, *extra]


def start_learner(model: Path, work: Path, bind: str, extra: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """``agentgym-learner`` on quickstart's config over ``model``, bound to ``bind``, its run directory
    ``work/run`` and its console log ``work/learner.log`` (warnings and errors only)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgym.learner.main",
            "--config",
            str(ROOT / "configs/quickstart.toml"),
            "--run-dir",
            str(work / "run"),
            "--bind",
            bind,
            "--log-level",
            "warning",
            *[a for o in learner_overrides(model, extra) for a in ("-o", o)],
        ],
        cwd=ROOT,
        stdout=open(work / "learner.log", "w"),  # the child holds it until it exits
        stderr=subprocess.STDOUT,
    )
