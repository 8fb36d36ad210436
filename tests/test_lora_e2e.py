"""A LoRA run end to end: ``agentgym train`` with learner.lora starts the learner and a real actor
(processes, ZeroMQ, the guess_number env); every weight version the actor fetches is the adapter
(its exact byte size, a fraction of the model's), the actor serves each one, and the checkpoint
holds the adapter. An actor whose own config asks for no adapters (its engine started before the
learner's Welcome) restarts its engine to serve them. The engine here is ``hf`` (starts in a
second); tests/test_lora_engines.py checks the vLLM path's logprobs against the learner's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

from agentgym.host.netutil import free_port_pair
from agentgym.models.tiny import make_default_tiny_model

REPO = Path(__file__).resolve().parents[1]
RANK, TARGETS = 8, ("q_proj", "v_proj")


def test_a_lora_run_ships_adapters_to_a_real_actor(tmp_path: Path) -> None:
    from transformers import AutoConfig

    model = make_default_tiny_model(tmp_path / "tiny", seed=0)
    steps, port, run_dir = 3, free_port_pair(), tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentgym.cli",
            "train",
            "--config",
            str(REPO / "configs" / "quickstart.toml"),
            "--run-dir",
            str(run_dir),
            "--actors",
            "1",
            "--max-steps",
            str(steps),
            "-o",
            f'learner.bind="tcp://127.0.0.1:{port}"',
            "-o",
            f'model.path="{model}"',
            "-o",
            "model.create_tiny=false",
            "-o",
            f"learner.lora.rank={RANK}",
            "-o",
            f"learner.lora.target_modules={list(TARGETS)!r}".replace("'", '"'),
            "-o",
            "learner.lr=2e-2",
            "-o",
            'actor.engine="hf"',
            "-o",
            "eval.at_start=false",
            "-o",
            "eval.at_end=false",
            "-o",
            "learner.batch_groups=1",
            "-o",
            "rollout.group_size=4",
            "-o",
            "actor.max_groups=1",
            "-o",
            "schedule.turn_limits=[[0, 2]]",
            # sync: each step's groups are played with the previous step's weights, so the actor
            # must fetch and serve versions 1 and 2 (async could finish on version 0's weights)
            "-o",
            'run.mode="sync"',
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        text=True,
        capture_output=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1))

    # The adapter's size: A (r x in) and B (out x r) of each targeted projection, float32.
    c = AutoConfig.from_pretrained(model)
    kv = c.num_key_value_heads * c.hidden_size // c.num_attention_heads
    per_layer = {"q_proj": (c.hidden_size, c.hidden_size), "v_proj": (c.hidden_size, kv)}
    adapter_bytes = 4 * RANK * c.num_hidden_layers * sum(i + o for i, o in (per_layer[t] for t in TARGETS))
    model_bytes = (model / "model.safetensors").stat().st_size

    (log_file,) = (run_dir / "logs").glob("actor-local-*.jsonl")
    events = [json.loads(line) for line in log_file.read_text().splitlines()]
    updates = [e for e in events if e.get("event") == "weights_updated"]
    loaded = [e for e in events if e.get("event") == "engine_weights_loaded"]
    assert set(range(1, steps)) <= {e["version"] for e in updates} <= set(range(1, steps + 1)), updates
    assert all(e["mib"] == round(adapter_bytes / 2**20, 2) for e in updates), (updates, adapter_bytes)
    assert adapter_bytes < model_bytes / 10
    assert [e["engine"] for e in loaded] == ["HfLoraEngine"] * len(updates)
    assert all(e["tensors"] == len(TARGETS) * c.num_hidden_layers for e in loaded)  # merged layers

    ckpt = max((run_dir / "checkpoints").iterdir())
    names = {p.name for p in ckpt.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json"} <= names and "model.safetensors" not in names
    assert json.loads((ckpt / "adapter_config.json").read_text())["r"] == RANK
    saved = load_file(str(ckpt / "adapter_model.safetensors"))
    assert sum(t.numel() * t.element_size() for t in saved.values()) == adapter_bytes


def test_an_actor_whose_config_has_no_lora_serves_the_learners_adapters(tmp_path: Path) -> None:
    # The actor starts its engine before the learner's Welcome (its config: no adapters); the
    # Welcome asks for them, so it starts an adapter-serving engine instead and plays with that.
    model = make_default_tiny_model(tmp_path / "tiny", seed=0)
    port, run_dir = free_port_pair(), tmp_path / "run"
    common = [
        "--config",
        str(REPO / "configs" / "quickstart.toml"),
        "-o",
        f'model.path="{model}"',
        "-o",
        "model.create_tiny=false",
        "-o",
        'actor.engine="hf"',
        "-o",
        "eval.at_start=false",
        "-o",
        "eval.at_end=false",
        "-o",
        "learner.batch_groups=1",
        "-o",
        "rollout.group_size=4",
        "-o",
        "actor.max_groups=1",
        "-o",
        "schedule.turn_limits=[[0, 2]]",
        "-o",
        'run.mode="sync"',
        "--run-dir",
        str(run_dir),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    learner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgym.learner.main",
            *common,
            "--bind",
            f"tcp://127.0.0.1:{port}",
            "--max-steps",
            "2",
            "-o",
            f"learner.lora.rank={RANK}",
            "-o",
            f"learner.lora.target_modules={list(TARGETS)!r}".replace("'", '"'),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    actor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgym.actors.main",
            *common,
            "--learner",
            f"tcp://127.0.0.1:{port}",
            "--actor-id",
            "a",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lout, _ = learner.communicate(timeout=600)
        aout, _ = actor.communicate(timeout=120)
    finally:
        for p in (learner, actor):
            p.kill()
    assert learner.returncode == 0, lout[-3000:]
    assert actor.returncode == 0, aout[-3000:]
    events = [json.loads(line) for line in (run_dir / "logs" / "actor-a.jsonl").read_text().splitlines()]
    names = [e["event"] for e in events]
    assert "engine_restarting" in names, names
    started = [e for e in events if e["event"] == "engine_started" and "lora" in e]
    assert [e["lora"] for e in started] == [False, True], started
    loaded = [e for e in events if e["event"] == "engine_weights_loaded"]
    assert loaded and all(e["engine"] == "HfLoraEngine" for e in loaded), loaded
