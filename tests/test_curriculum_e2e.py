"""The turn-limit curriculum end to end: ``agentgym train`` (a learner process and a real actor with
the ``hf`` engine, ZeroMQ over loopback) on a mix of guess_number and maze, each env with its own
schedule: guess_number by step (1 turn, then 2 from step 2), maze by success (2 turns, then 3 once
its success plateaus). In sync mode every batch is played with the weights, and so the limits, of
the step before: each episode the learner trained must have been played under its own env's limit
announced with those weights, which the actor can only know from WeightsReady.turn_limits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agentgym.host.netutil import free_port_pair
from agentgym.models.tiny import make_default_tiny_model

REPO = Path(__file__).resolve().parents[1]
STEPS = 4


def test_an_actor_plays_each_env_under_its_own_and_advanced_turn_limit(tmp_path: Path) -> None:
    model = make_default_tiny_model(tmp_path / "tiny", seed=0)
    port, run_dir = free_port_pair(), tmp_path / "run"
    overrides = [
        f'learner.bind="tcp://127.0.0.1:{port}"',
        f'model.path="{model}"',
        "model.create_tiny=false",
        'run.mode="sync"',
        'actor.engine="hf"',
        "learner.batch_groups=6",
        "rollout.group_size=2",
        "rollout.max_tokens_per_turn=2",
        "actor.max_groups=6",
        "actor.env_workers=3",
        "learner.log_episodes=64",
        "eval.at_start=false",
        "eval.at_end=false",
        "eval.every=0",
        "learner.checkpoint_every=0",
        'env.mix=[{name = "guess_number", kwargs = {low = 1, high = 4}}, {name = "maze", kwargs = {size = 3}}]',
        "schedule.turn_limits=[[0, 1], [2, 2]]",  # guess_number: no entry of its own
        # maze: window 1 and min_delta 1: its second trained step can only be a plateau (short of
        # going from no success to all successes, which then advances one step later). With 6 groups
        # a step drawn 1:1 from the two envs, a step without maze (1/64) or a first two steps without
        # guess_number (1/4096) are rare enough not to matter.
        "schedule.envs.maze.stages=[2, 3]",
        "schedule.envs.maze.patience=1",
        "schedule.envs.maze.min_delta=1.0",
        "schedule.envs.maze.window=1",
    ]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentgym.cli",
            "train",
            "--config",
            str(REPO / "configs" / "mix.toml"),
            "--run-dir",
            str(run_dir),
            "--actors",
            "1",
            "--max-steps",
            str(STEPS),
            *(a for o in overrides for a in ("-o", o)),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        text=True,
        capture_output=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    events = [json.loads(line) for line in (run_dir / "logs" / "learner.jsonl").read_text().splitlines()]
    advanced = [
        {k: e[k] for k in ("env", "from_limit", "to_limit", "step", "reason")}
        for e in events
        if e.get("event") == "turn_limit_advanced"
    ]
    guess = [a for a in advanced if a["env"] == "guess_number"]
    assert guess == [{"env": "guess_number", "from_limit": 1, "to_limit": 2, "step": 2, "reason": "step"}], advanced
    maze = [a for a in advanced if a["env"] == "maze"]
    assert len(maze) == 1 and (maze[0]["from_limit"], maze[0]["to_limit"], maze[0]["reason"]) == (2, 3, "plateau"), (
        advanced
    )
    moved = maze[0]["step"]

    # metrics.jsonl: each step's record has the limit per env its batch was played under.
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    # One vocabulary: the console's step line names its values as metrics.jsonl does.
    lines = [e for e in events if e.get("event") == "step"]
    assert [e["step"] for e in lines] == list(range(1, STEPS + 1))
    for e, r in zip(lines, records, strict=True):
        assert {
            "reward_mean",
            "success_rate",
            "trajectories_per_s",
            "tokens_per_s",
            "staleness_mean",
            "turn_limit",
        } <= e.keys() & r.keys()
        assert (e["success_rate"], e["reward_mean"]) == (round(r["success_rate"], 3), round(r["reward_mean"], 3))
    assert "success_rate=" in proc.stdout + proc.stderr and "traj_per_s" not in proc.stdout + proc.stderr
    assert [r["env/guess_number/turn_limit"] for r in records] == [1, 1] + [2] * (STEPS - 2)
    assert [r["env/maze/turn_limit"] for r in records] == [2 if s <= moved else 3 for s in range(1, STEPS + 1)]
    assert [r["turn_limit"] for r in records] == [
        max(r["env/guess_number/turn_limit"], r["env/maze/turn_limit"]) for r in records
    ]
    assert moved < STEPS, "maze advanced at the last step: no batch shows the new limit"

    # The actor applied them: every trained episode was played under its env's limit of its step.
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    train = [e for e in episodes if e["kind"] == "train"]
    assert {e["env"] for e in train} == {"guess_number", "maze"}
    by_step = {r["step"]: r for r in records}
    for e in train:
        assert e["turn_limit"] == by_step[e["step"]][f"env/{e['env']}/turn_limit"], e
        assert e["turns"] <= e["turn_limit"], e
    played = {(e["env"], e["turn_limit"]) for e in train}
    assert {("guess_number", 1), ("guess_number", 2), ("maze", 2)} <= played
    # a maze batch after the advance was played under its new limit
    assert ("maze", 3) in played or all(
        by_step[s].get("env/maze/episodes", 0) == 0 for s in range(moved + 1, STEPS + 1)
    )

    # The actor's JSON log is named by its id, beside its console log.
    assert sorted(p.name for p in (run_dir / "logs").glob("actor-*")) == [
        "actor-local-0.console.log",
        "actor-local-0.jsonl",
    ]
    actor_log = run_dir / "logs" / "actor-local-0.jsonl"
    changes = [json.loads(line) for line in actor_log.read_text().splitlines()]
    per_env = [e["per_env"] for e in changes if e.get("event") == "turn_limits_changed"]
    assert {"guess_number": 2, "maze": 3} in per_env and {"guess_number": 1, "maze": 2} in per_env, per_env
