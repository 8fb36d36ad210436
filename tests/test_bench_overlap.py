"""The results loop's overlap (bench/learn_curve.py ``train_curve(overlap=True)``, results.py
``--overlap``): the next batch is played while the trainer steps on this one, so every batch after
the first is trained one version after the weights that played it (the trainer's own staleness
metric says so), the weights change only between batches (a run repeats exactly), and without it
the loop stays synchronous (staleness 0 at every step)."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path

import pytest

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
STEPS = 3


@pytest.fixture
def learn_curve(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    return importlib.import_module("learn_curve")


def _run(learn_curve, model: Path, overlap: bool) -> dict:
    from agentgym.config import load_config

    cfg = load_config(
        REPO / "configs" / "quickstart.toml",
        [
            *learn_curve.LOOP_OVERRIDES,
            f'model.path="{model}"',
            "model.create_tiny=false",
            f"run.max_steps={STEPS}",
            "learner.batch_groups=2",
            "rollout.group_size=2",
            "run.seed=3",
        ],
    )
    return asyncio.run(learn_curve.train_curve(cfg, eval_every=STEPS, eval_tasks=2, log=False, overlap=overlap))


@pytest.mark.timeout(600)
def test_overlap_trains_each_batch_one_version_after_it_was_played_and_repeats_exactly(
    learn_curve, fallback_model: Path
) -> None:
    sync = _run(learn_curve, fallback_model, overlap=False)
    assert [m["staleness_max"] for m in sync["metrics"]] == [0.0] * STEPS
    over = _run(learn_curve, fallback_model, overlap=True)
    assert over["steps"] == STEPS and [s for s, _ in over["curve"]] == [0, STEPS]
    # The first batch is played before any step; each later one while the step before it trains.
    assert [m["staleness_max"] for m in over["metrics"]] == [0.0] + [1.0] * (STEPS - 1)
    assert all(m["staleness_mean"] == m["staleness_max"] for m in over["metrics"])
    # The first batch is the synchronous loop's own (same draws, same weights, same seeds).
    assert over["metrics"][0]["loss"] == sync["metrics"][0]["loss"]
    again = _run(learn_curve, fallback_model, overlap=True)
    assert again["curve"] == over["curve"] and [m["loss"] for m in again["metrics"]] == [
        m["loss"] for m in over["metrics"]
    ]
