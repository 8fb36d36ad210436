"""A training run whose actors take their weights through a relay: ``agentgym train`` (a real
learner and two real actor processes on the simulated engine) with ``actor.weights_relay``
pointing at a real ``agentgym-relay`` process. Every version reaches the actors, and the
learner sends each chunk to the relay only: its egress is one copy per version, not one per
actor (docs/adr/0018-weight-fan-out.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym.host.netutil import free_port_pair

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3


@pytest.mark.timeout(600)
def test_actors_train_through_a_relay_and_the_learner_sends_each_version_once(tmp_path: Path) -> None:
    port, relay_port = free_port_pair(), free_port_pair()
    stats = tmp_path / "relay.json"
    relay = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgym.cluster.relay",
            "--bind",
            f"tcp://127.0.0.1:{relay_port}",
            "--upstream",
            f"tcp://127.0.0.1:{port + 1}",
            "--stats",
            str(stats),
            "--stats-every",
            "1",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        run = tmp_path / "run"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentgym.cli",
                "train",
                "--config",
                str(ROOT / "configs" / "quickstart.toml"),
                "--run-dir",
                str(run),
                "--actors",
                "2",
                "--max-steps",
                str(STEPS),
                "-o",
                f'learner.bind="tcp://127.0.0.1:{port}"',
                "-o",
                f'model.path="{tmp_path / "tiny"}"',
                "-o",
                'actor.engine="sim"',
                "-o",
                "actor.env_workers=2",
                "-o",
                "actor.sim.tokens_per_s=2000",
                "-o",
                f'actor.weights_relay="tcp://127.0.0.1:{relay_port}"',
                "-o",
                "eval.at_start=false",
                "-o",
                "eval.at_end=false",
                "-o",
                "eval.every=0",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=540,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    finally:
        os.killpg(relay.pid, signal.SIGTERM)
        relay.wait(30)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] == STEPS
    versions = STEPS + 1  # version 0 and one per step
    # Every chunk the learner served went to the relay, each version once: the two actors asked
    # the relay, never the learner (chunks_in counts what the relay fetched upstream).
    relayed = json.loads(stats.read_text())
    assert relayed["chunks_in"] == summary["weights_served"]["chunks"] > 0
    assert relayed["bytes_in"] == summary["weights_served"]["bytes"]
    assert relayed["chunks_out"] >= 2 * STEPS * summary["weights_served"]["chunks"] // versions
    assert relayed["bad_chunks"] == 0
    logs = [json.loads(line) for p in (run / "logs").glob("actor-*.jsonl") for line in p.read_text().splitlines()]
    loaded = {(e.get("actor"), e["version"]) for e in logs if e.get("event") == "weights_updated"}
    for actor in (0, 1):  # version 0 is the model each actor starts from; the last may come after it left
        assert {v for a, v in loaded if a == actor} >= set(range(1, STEPS)), loaded
