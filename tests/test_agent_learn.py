"""An unmodified ``openai.OpenAI`` agent (examples/guess_number_agent.py) learns through the actor's
agent endpoint, and ``agentgym train`` runs one end to end.

- In this process, as tests/test_algorithms_learn.py does for the native path: the reference
  engine serves the endpoint, the example agent plays groups of guess_number through it (the
  ``openai`` SDK in a thread per episode; each call sampled with its own seed, from the request
  id that names its episode and call, so the threads' timing changes nothing), the learner's
  Trainer takes a step on each batch and the new weights go into the engine. Held-out success
  (test tasks, resolved by the runner from evaluation tickets as the actor does) must rise by
  the same margin as the native path's.
- Real processes: ``agentgym train`` with ``actor.agent_endpoint`` on, a learner and one actor
  (hf engine) over ZeroMQ: every episode arrives through the endpoint, is trained and accounted
  for, and summary.json counts the prefix breaks (none for this agent).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from learn_loop import RequestSeededEngine, learn

pytest.importorskip("openai")

from agentgym.actors.play.agent_runner import AgentRunner  # noqa: E402
from agentgym.config import load_config  # noqa: E402
from agentgym.config.actor import AgentEndpointConfig  # noqa: E402
from agentgym.host.netutil import free_port_pair  # noqa: E402
from agentgym.learner.control.actor_control import rollout_spec  # noqa: E402
from agentgym.learner.training.trainer import Trainer  # noqa: E402
from agentgym.models.tiny import make_default_tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart.toml"
PROGRAM = f"{REPO / 'examples' / 'guess_number_agent.py'}:play"
STEPS = 40
HELD_OUT_TASKS, HELD_OUT_EPISODES = 64, 4
MIN_RISE = 0.06  # as tests/test_algorithms_learn.py (its docstring says why)
SETTINGS = (
    "env.kwargs={ low = 1, high = 4 }",
    "schedule.turn_limits=[[0, 2]]",
    "rollout.max_tokens_per_turn=2",
    "rollout.group_size=8",
    "learner.batch_groups=4",
    "learner.lr=1e-2",
    f"run.max_steps={STEPS}",
    'learner.loss_agg="token_mean"',
    'learner.lr_schedule="constant"',
    'learner.truncation="terminal"',
    'learner.device="cpu"',
    "model.create_tiny=false",
    'learner.algorithm="grpo"',
    "run.seed=0",
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_default_tiny_model(tmp_path_factory.mktemp("agentlearn") / "tiny", seed=0)


async def train_and_evaluate(model_dir: Path) -> tuple[float, float, list[dict[str, float]], dict[str, int]]:
    from transformers import AutoTokenizer

    cfg = load_config(QUICKSTART, [*SETTINGS, f'model.path="{model_dir}"'])
    spec = rollout_spec(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    trainer = Trainer.load(cfg)
    engine = RequestSeededEngine(cfg.model.path, seed=cfg.run.seed)  # the same tokens whatever the calls' order
    stats: dict[str, int] = {}
    runner = AgentRunner(AgentEndpointConfig(enabled=True, program=PROGRAM), engine, tokenizer, stats)

    await engine.start()
    await runner.start()
    try:
        before, after, metrics = await learn(
            cfg, trainer, engine, lambda t, i, limit: runner.play(t, i, spec, limit), HELD_OUT_TASKS, HELD_OUT_EPISODES
        )
    finally:
        await runner.close()
        await engine.close()
        trainer.close()
    return before, after, metrics, stats


@pytest.mark.slow
def test_an_openai_sdk_agent_learns_through_the_endpoint(model_dir: Path) -> None:
    before, after, metrics, stats = asyncio.run(asyncio.wait_for(train_and_evaluate(model_dir), 540))
    train = [round(m["success_rate"], 2) for m in metrics]
    print(f"\nendpoint agent: held-out success {before:.3f} -> {after:.3f}; training success per step {train}; {stats}")
    # Played by the weights it trains, tokens as generated: the learner's logprobs are the engine's.
    assert all(m["staleness_max"] == 0 for m in metrics)
    assert max(abs(m["is_weight_mean"] - 1) for m in metrics) < 1e-3
    assert stats["agent_prefix_breaks"] == 0 and not stats.get("agent_failures")
    assert after >= before + MIN_RISE, (
        f"held-out success {before:.3f} -> {after:.3f}; training success per step {train}"
    )


def test_agentgym_train_with_the_agent_endpoint(model_dir: Path, tmp_path: Path) -> None:
    steps, port, run_dir = 3, free_port_pair(), tmp_path / "run"
    overrides = [
        f'learner.bind="tcp://127.0.0.1:{port}"',
        f'model.path="{model_dir}"',
        "model.create_tiny=false",
        'run.mode="sync"',
        'actor.engine="hf"',
        "learner.batch_groups=2",
        "rollout.group_size=4",
        "rollout.max_tokens_per_turn=2",
        "actor.max_groups=2",
        "eval.at_start=false",
        "eval.at_end=true",
        "eval.every=0",
        "eval.tasks=2",
        "learner.checkpoint_every=0",
        "actor.agent_endpoint.enabled=true",
        f'actor.agent_endpoint.program="{PROGRAM}"',
    ]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentgym.cli",
            "train",
            "--config",
            str(QUICKSTART),
            "--run-dir",
            str(run_dir),
            "--actors",
            "1",
            "--max-steps",
            str(steps),
            *(a for o in overrides for a in ("-o", o)),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        text=True,
        capture_output=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "run finished" and summary["step"] == steps
    assert summary["prefix_breaks"] == {"prefix_breaks": 0, "split_episodes": 0}
    assert summary["groups"]["accepted"] >= steps * 2 and summary["groups"]["eval"] == 2
    assert summary["episodes"]["env_failure"] == 0 and summary["tickets"]["unaccounted"] == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1)) and "prefix_breaks" in records[-1]
    (actor,) = [json.loads(p.read_text()) for p in (run_dir / "actors").glob("*.json")]
    assert actor["episodes_sent"] == actor["agent_episodes"] > 0 and actor["agent_calls"] >= actor["agent_episodes"]
    assert actor["agent_prefix_breaks"] == 0 and actor["groups_sent"] == actor["acked"] + actor["unacked"]
    log = (run_dir / "logs" / "actor-local-0.jsonl").read_text()
    assert "agent_endpoint_started" in log and "env_pool_started" not in log  # the agent played, not the env
