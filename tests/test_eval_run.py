"""A trained run, then what a user does with it: the README's ``agentgym eval`` example on the
run gives the run's own final evaluation (within sampling noise), because eval plays with the
run's config.toml; flags that change how the model was trained to play are warned about; the
run's offline W&B history holds every train and eval point of metrics.jsonl and eval.jsonl, each
on its own step axis, and TensorBoard holds the config.

One short run of the quickstart (hf engine, one actor) serves every test here. Its model is
pretrained on random play for 100 steps (``model.pretrain_steps``, agentgym/models/base.py), so
it answers with a number from the first step and its success is well above 0 (about 0.5; the
random model's is near 0 with any settings, and the quickstart's lr of 1e-2, tuned for that
model, would wreck this one within three steps: lr 1e-4 keeps it).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym.config import load_config
from agentgym.host.netutil import free_port_pair

REPO = Path(__file__).resolve().parents[1]
STEPS = 6
EVALS = [3, STEPS]  # eval.every = 3, and at the end (the quickstart's eval.at_end)
# About two minutes on 2 idle cores: the base model's pretraining, the run, one evaluation.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def _cli(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}
    return subprocess.run(
        [sys.executable, "-m", "agentgym.cli", *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    root = tmp_path_factory.mktemp("evalrun")
    run_dir = root / "run"
    proc = _cli(
        [
            "train",
            "--config",
            str(REPO / "configs" / "quickstart.toml"),
            "--run-dir",
            str(run_dir),
            "--actors",
            "1",
            "--max-steps",
            str(STEPS),
            "-o",
            f'learner.bind="tcp://127.0.0.1:{free_port_pair()}"',
            "-o",
            f'model.path="{root / "model"}"',
            "-o",
            'actor.engine="hf"',
            "-o",
            "actor.max_groups=4",
            "-o",
            "learner.batch_groups=4",
            "-o",
            "eval.every=3",
            "-o",
            "eval.at_start=false",
            "-o",
            "model.pretrain_steps=100",
            "-o",
            "learner.lr=1e-4",
            "-o",
            'metrics.sinks=["jsonl", "tensorboard", "wandb"]',
        ],
        root,
        timeout=2000,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


def _readme_example() -> list[str]:
    """The README's eval example on a run, as printed (comment dropped)."""
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("agentgym eval --model runs/quickstart "):
            return shlex.split(line.split("#")[0])[1:]
    raise AssertionError("README.md has no `agentgym eval --model runs/quickstart ...` example")


def test_the_readme_eval_example_reproduces_the_runs_final_eval(run: Path) -> None:
    final = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()][-1]
    assert final["step"] == STEPS
    args = [str(run) if a == "runs/quickstart" else a for a in _readme_example()]
    out = run.parent / "readme-eval.json"
    proc = _cli([*args, "--out", str(out)], run.parent, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"settings from {run / 'config.toml'}" in proc.stderr and "warning" not in proc.stderr, proc.stderr
    report = json.loads(out.read_text())
    k = report["k"]
    ((env, row),) = report["envs"].items()
    ours, n_ours = row[f"avg@{k}"], row["samples"]
    theirs, n_theirs = final["success_rate"], final["episodes"]
    assert theirs >= 0.2, f"the run's final success {theirs:.3f}: too low for the comparison to mean anything"
    # Two estimates of one success probability: within 3 standard errors of their difference.
    p = (ours * n_ours + theirs * n_theirs) / (n_ours + n_theirs)
    noise = 3 * math.sqrt(max(p * (1 - p), 0.02) * (1 / n_ours + 1 / n_theirs))
    assert abs(ours - theirs) <= noise, (
        f"eval avg@{k} {ours:.3f} ({n_ours} episodes) vs the run's {theirs:.3f} ({n_theirs})"
    )
    # the limit the run played at its last step (the quickstart's schedule: 4 turns before step 40)
    assert report["turn_limit"] == load_config(run / "config.toml").schedule.turn_limit(STEPS) == 4


def test_flags_that_change_how_the_model_plays_are_warned_about(run: Path) -> None:
    from agentgym.cli.eval import trained_config, trained_differences

    assert trained_config(run) == trained_config(run / "checkpoints") == run / "config.toml"
    newest = sorted((run / "checkpoints").iterdir())[-1]
    assert trained_config(newest) == run / "config.toml"
    trained = load_config(run / "config.toml")
    assert trained_differences(trained, trained, ["guess_number"], trained.rollout.temperature, 4, STEPS) == []
    cfg = load_config(run / "config.toml", ["rollout.max_tokens_per_turn=8", "env.kwargs={low = 1, high = 100}"])
    diffs = trained_differences(cfg, trained, ["guess_number"], 0.0, 6, STEPS)
    assert any(d.startswith("rollout.max_tokens_per_turn = 8 (trained with 1)") for d in diffs), diffs
    assert any("temperature 0.0" in d for d in diffs) and any(
        "turn limit 6 on guess_number (trained with 4 turns)" in d for d in diffs
    ), diffs
    assert any("'high': 100" in d for d in diffs), diffs


def test_wandb_history_holds_every_train_and_eval_point(run: Path) -> None:
    from wandb_history import read_wandb_run

    from agentgym.observe.logs import read_metrics

    rows, metrics, config = read_wandb_run(next(run.glob("wandb/offline-run-*/run-*.wandb")))
    train = read_metrics(run / "metrics.jsonl")
    evals = read_metrics(run / "eval.jsonl")
    assert len(train) == STEPS and [e["step"] for e in evals] == EVALS
    for prefix, records in (("train", train), ("eval", evals)):
        logged = {r[f"{prefix}/step"]: r for r in rows if f"{prefix}/step" in r}
        assert sorted(logged) == [r["step"] for r in records], prefix
        for rec in records:
            for key, value in rec.items():
                if isinstance(value, (int, float)) and key not in ("step", "time") and math.isfinite(value):
                    assert logged[rec["step"]][f"{prefix}/{key}"] == pytest.approx(float(value)), (
                        prefix,
                        rec["step"],
                        key,
                    )
    assert {m.glob_name: m.step_metric for m in metrics if m.glob_name} == {
        "train/*": "train/step",
        "eval/*": "eval/step",
    }
    assert config["rollout"]["max_tokens_per_turn"] == 1 and config["run"]["max_steps"] == STEPS
    assert config["wandb"]["mode"] == "offline" and config["wandb"]["name"] == run.name

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert re.search(r"max_tokens_per_turn = 1\b", text)
    assert [e.step for e in acc.Scalars("eval/success_rate")] == EVALS
