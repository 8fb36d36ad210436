"""Checkpoints that survive interruption, with a real learner process and the scripted actor of
test_learner_resume (the real protocol over ZeroMQ, deterministic groups, no engine):

- SIGTERM between periodic checkpoints saves one at once; ``agentgym train --resume`` then
  continues the run to run.max_steps from it, and summary.json accounts for every ticket.
- ``learner.checkpoint_minutes`` saves one after a step once that much time has passed, with no
  step-based checkpoint configured.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from learner_fixtures import make_cfg
from test_learner_resume import BATCH, GROUP_SIZE, REPO, ScriptedActor, _learner, _stop

from agentgym.config import to_toml
from agentgym.host.netutil import free_port_pair
from agentgym.learner.training.checkpoint import latest_checkpoint
from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model
from agentgym.observe.logs import read_events


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("ckpt") / "m", corpus=FALLBACK_CORPUS, seed=0)


def _config(model_dir: Path, tmp_path: Path, *extra: str) -> tuple[Path, str, object]:
    bind = f"tcp://127.0.0.1:{free_port_pair()}"
    cfg = make_cfg(
        model_dir,
        'run.mode="sync"',
        f'learner.bind="{bind}"',
        f"learner.batch_groups={BATCH}",
        f"rollout.group_size={GROUP_SIZE}",
        "learner.actor_timeout_s=600",
        *extra,
    )
    path = tmp_path / "config.toml"
    path.write_text(to_toml(cfg))
    return path, bind, cfg


def _events(run_dir: Path, name: str) -> list[dict]:
    return read_events(run_dir / "logs" / "learner.jsonl", name)


def test_sigterm_saves_a_checkpoint_and_train_resume_continues(model_dir: Path, tmp_path: Path) -> None:
    config, bind, cfg = _config(
        model_dir, tmp_path, "run.max_steps=2", "learner.checkpoint_every=0", "learner.checkpoint_minutes=0"
    )
    run_dir, log = tmp_path / "run", tmp_path / "learner.log"
    proc = _learner(["--config", str(config), "--run-dir", str(run_dir)], log)
    actor = ScriptedActor(bind, cfg)  # type: ignore[arg-type]  # the test's config, which ScriptedActor reads
    try:
        actor.play(0, BATCH, proc)
        actor.pump(lambda: len(actor.weights) >= 2, proc)  # step 1 trained and published
        assert latest_checkpoint(run_dir / "checkpoints") is None  # nothing periodic configured
        assert _stop(proc, signal.SIGTERM, log) == 130, log.read_text()[-3000:]
    finally:
        actor.close()
        if proc.poll() is None:
            proc.kill()
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    assert ckpt is not None and ckpt.name == "step_000001"
    assert [e["reason"] for e in _events(run_dir, "checkpoint_saved")] == ["interrupted"]
    first = json.loads((run_dir / "summary.json").read_text())["tickets"]
    assert first["trained"] == BATCH and first["unaccounted"] == 0
    assert first["in_flight_at_end"] == first["issued"] - BATCH  # granted for step 2, not played

    # `agentgym train --resume`: the run's own config.toml, no local actors (the script plays).
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "ab") as f:
        train = subprocess.Popen(
            [sys.executable, "-m", "agentgym.cli", "train", "--resume", "--run-dir", str(run_dir), "--actors", "0"],
            cwd=REPO,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
        )
    actor = ScriptedActor(bind, cfg)  # type: ignore[arg-type]  # the test's config, which ScriptedActor reads
    try:
        actor.play(BATCH, BATCH, train)
        assert train.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        actor.close()
        if train.poll() is None:
            train.kill()
    assert [e["step"] for e in _events(run_dir, "learner_resumed")] == [1]
    metrics = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics == [1, 2]
    summary = json.loads((run_dir / "summary.json").read_text())
    t = summary["tickets"]
    assert summary["step"] == 2 and t["trained"] == 2 * BATCH and t["unaccounted"] == 0, t
    # the tickets granted for step 2 before the SIGTERM were re-issued, not lost
    assert t["lost_in_restart"] == {"in_flight": first["in_flight_at_end"]}


def test_checkpoint_minutes_saves_without_a_step_interval(model_dir: Path, tmp_path: Path) -> None:
    config, bind, cfg = _config(
        model_dir, tmp_path, "run.max_steps=3", "learner.checkpoint_every=0", "learner.checkpoint_minutes=0.001"
    )
    run_dir, log = tmp_path / "run", tmp_path / "learner.log"
    proc = _learner(["--config", str(config), "--run-dir", str(run_dir)], log)
    actor = ScriptedActor(bind, cfg)  # type: ignore[arg-type]  # the test's config, which ScriptedActor reads
    try:
        # The clock starts when the learner is made, before it welcomes anyone: waiting 0.2 s
        # after the Welcome puts step 1 past the 0.06 s interval however fast the step is.
        actor.pump(lambda: actor.welcome is not None, proc)
        time.sleep(0.2)
        actor.play(0, BATCH, proc)
        ckpts = run_dir / "checkpoints"
        actor.pump(lambda: latest_checkpoint(ckpts) is not None, proc)
        assert latest_checkpoint(ckpts).name == "step_000001"  # type: ignore[union-attr]  # a checkpoint was written
        proc.kill()  # no chance to save anything more
        proc.wait()
    finally:
        actor.close()
        if proc.poll() is None:
            proc.kill()
    assert [e["reason"] for e in _events(run_dir, "checkpoint_saved")] == ["periodic"]


def test_a_failure_after_a_step_saves_a_checkpoint(model_dir: Path, tmp_path: Path) -> None:
    # The episode log cannot be written (its path is a directory): the train loop fails after
    # step 1 was trained and published, outside the step, where the state is consistent.
    config, bind, cfg = _config(
        model_dir,
        tmp_path,
        "run.max_steps=3",
        "learner.checkpoint_every=0",
        "learner.checkpoint_minutes=0",
        "learner.log_episodes=2",
    )
    run_dir, log = tmp_path / "run", tmp_path / "learner.log"
    (run_dir / "episodes.jsonl").mkdir(parents=True)
    proc = _learner(["--config", str(config), "--run-dir", str(run_dir)], log)
    actor = ScriptedActor(bind, cfg)  # type: ignore[arg-type]  # the test's config, which ScriptedActor reads
    try:
        actor.play(0, BATCH, proc)
        code = proc.wait(timeout=120)
    finally:
        actor.close()
        if proc.poll() is None:
            proc.kill()
    assert code not in (0, 130), log.read_text()[-3000:]
    assert "IsADirectoryError" in log.read_text()
    assert [e["reason"] for e in _events(run_dir, "checkpoint_saved")] == ["crash"]
    assert latest_checkpoint(run_dir / "checkpoints").name == "step_000001"  # type: ignore[union-attr]  # a checkpoint was written
