"""Metric sinks: TensorBoard event files read back by tensorboard's own EventAccumulator, the
config choosing them, and a clear error for a sink whose library is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentgym.config import ConfigError, load_config
from agentgym.observe.logs import MetricsWriter, read_metrics
from agentgym.observe.sinks import SinkError, SinkWriter, check_sinks, scalars, with_sinks


def test_scalars_keep_numbers_only() -> None:
    assert scalars({"step": 3, "time": 1.0, "loss": 0.5, "ok": True, "split": "test", "v": [0, 1]}) == {
        "loss": 0.5,
        "ok": 1.0,
    }


def test_tensorboard_event_files_hold_the_scalars(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(None, ['metrics.sinks=["jsonl", "tensorboard"]'])
    train = with_sinks(MetricsWriter(tmp_path / "metrics.jsonl"), cfg.metrics.sinks, tmp_path, "train")
    ev = with_sinks(MetricsWriter(tmp_path / "eval.jsonl"), cfg.metrics.sinks, tmp_path, "eval")
    assert isinstance(train, SinkWriter)
    for step in (1, 2, 3):
        train.write({"step": step, "loss": 1.0 / step, "success_rate": 0.25 * step, "split": "x"})
    ev.write({"step": 2, "pass@8": 0.75})
    train.close()
    ev.write({"step": 3, "pass@8": 0.875})  # the shared event file stays open for the other writer
    ev.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]  # JSONL as before

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/success_rate", "eval/pass@8"} <= tags and "train/split" not in tags
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3]
    assert [e.value for e in loss] == pytest.approx([1.0, 0.5, 1 / 3])
    assert [(e.step, e.value) for e in acc.Scalars("eval/pass@8")] == [(2, 0.75), (3, 0.875)]


def test_sinks_config_is_checked_and_jsonl_alone_is_plain(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sinks"):
        load_config(None, ['metrics.sinks=["tensorbord"]'])
    w = MetricsWriter(tmp_path / "m.jsonl")
    assert with_sinks(w, ["jsonl"], tmp_path, "train") is w
    w.close()


def test_missing_wandb_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError, as when not installed
    with pytest.raises(SinkError, match=r"agentgym\[wandb\]"):
        check_sinks(["jsonl", "wandb"])
    with pytest.raises(SinkError, match=r"agentgym\[wandb\]"):
        SinkWriter(MetricsWriter(tmp_path / "m.jsonl"), ["wandb"], tmp_path, "train")
    check_sinks(["jsonl"])


def test_wandb_keeps_every_point_on_its_own_step_axis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eval records written after later train steps (the async learner's order) all reach the
    W&B run, each prefix against its own step; the resolved config and [metrics.wandb] go with it."""
    pytest.importorskip("wandb")
    from wandb_history import read_wandb_run

    for var in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_NAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_PROJECT", "from-env")  # unset in the config: the variable counts
    cfg = load_config(None, ['metrics.sinks=["jsonl", "wandb"]', 'metrics.wandb.name="my-run"', "learner.lr=0.5"])
    train = with_sinks(MetricsWriter(tmp_path / "metrics.jsonl"), cfg.metrics.sinks, tmp_path, "train", cfg=cfg)
    ev = with_sinks(MetricsWriter(tmp_path / "eval.jsonl"), cfg.metrics.sinks, tmp_path, "eval", cfg=cfg)
    for step in range(1, 8):
        train.write({"step": step, "loss": 1.0 / step, "success_rate": 0.1 * step})
        if step in (3, 6):
            ev.write({"step": step - 2, "success_rate": 0.05 * step, "pass@8": 0.1 * step})  # late, lower step
    ev.close()
    train.close()

    rows, metrics, config = read_wandb_run(next(tmp_path.glob("wandb/offline-run-*/run-*.wandb")))
    got_train = [(r["train/step"], r["train/loss"], r["train/success_rate"]) for r in rows if "train/loss" in r]
    want_train = [(r["step"], r["loss"], r["success_rate"]) for r in read_metrics(tmp_path / "metrics.jsonl")]
    assert got_train == want_train and len(want_train) == 7
    got_eval = [(r["eval/step"], r["eval/success_rate"], r["eval/pass@8"]) for r in rows if "eval/pass@8" in r]
    want_eval = [(r["step"], r["success_rate"], r["pass@8"]) for r in read_metrics(tmp_path / "eval.jsonl")]
    assert got_eval == want_eval and [s for s, *_ in got_eval] == [1, 4]
    axes = {m.glob_name: m.step_metric for m in metrics if m.glob_name}
    assert axes == {"train/*": "train/step", "eval/*": "eval/step"}
    assert config["learner"]["lr"] == 0.5 and config["metrics"]["sinks"] == ["jsonl", "wandb"]
    assert config["wandb"] == {"mode": "offline", "project": "from-env", "entity": None, "name": "my-run"}


def test_tensorboard_holds_the_config(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(None, ['metrics.sinks=["tensorboard"]', "learner.lr=0.25"])
    w = with_sinks(MetricsWriter(tmp_path / "metrics.jsonl"), cfg.metrics.sinks, tmp_path, "train", cfg=cfg)
    w.write({"step": 1, "loss": 0.5})
    w.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "[learner]" in text and "lr = 0.25" in text and 'sinks = ["tensorboard"]' in text
