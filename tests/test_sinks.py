"""Metric sinks: TensorBoard event files read back by tensorboard's own EventAccumulator, the
config choosing them, and a clear error for a sink whose library is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentgym.config import ConfigError, load_config
from agentgym.logs import MetricsWriter, read_metrics
from agentgym.sinks import SinkError, SinkWriter, scalars, with_sinks


def test_scalars_keep_numbers_only() -> None:
    assert scalars({"step": 3, "time": 1.0, "loss": 0.5, "ok": True, "split": "test", "v": [0, 1]}) == {"loss": 0.5, "ok": 1.0}


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


def test_missing_wandb_is_a_clear_error(tmp_path: Path) -> None:
    try:
        import wandb  # noqa: F401
    except ImportError:
        with pytest.raises(SinkError, match=r"agentgym\[wandb\]"):
            SinkWriter(MetricsWriter(tmp_path / "m.jsonl"), ["wandb"], tmp_path, "train")
    else:
        pytest.skip("wandb is installed: its offline run is exercised instead by hand (docs)")
