"""Metric sinks beside the JSONL files: TensorBoard event files and an offline W&B run.

    writer = with_sinks(MetricsWriter(run_dir / "metrics.jsonl"), cfg.metrics.sinks, run_dir, "train")
    writer.write({"step": 3, "loss": 0.1, ...})      # JSONL as before, plus each sink
    writer.close()

JSONL stays the record (the viewer and tests read it); a sink gets every numeric field of a
record as a scalar ``<prefix>/<key>`` at the record's ``step``. The libraries are optional extras
(``pip install 'agentgym[tensorboard]'`` / ``'agentgym[wandb]'``) and imported only when chosen;
a chosen sink whose library is missing is an error at start, not a silent gap. W&B runs offline
(``WANDB_MODE=offline``): no network or account is needed; ``wandb sync RUN_DIR/wandb/...``
uploads it later.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

from agentgym.logs import MetricsWriter


class SinkError(RuntimeError):
    """A configured sink cannot start (its library is not installed)."""


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a record (booleans as 0/1), without ``step`` and ``time``."""
    return {k: float(v) for k, v in record.items()
            if isinstance(v, numbers.Real) and k not in ("step", "time")}  # fmt: skip


class _TensorBoard:
    def __init__(self, run_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise SinkError("metrics.sinks has 'tensorboard' but it is not installed: pip install 'agentgym[tensorboard]'") from exc
        self.w = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def write(self, prefix: str, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.w.add_scalar(f"{prefix}/{k}", v, step)
        self.w.flush()

    def close(self) -> None:
        self.w.close()


class _Wandb:
    def __init__(self, run_dir: Path, name: str) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise SinkError("metrics.sinks has 'wandb' but it is not installed: pip install 'agentgym[wandb]'") from exc
        self.run = wandb.init(mode="offline", dir=str(run_dir), name=name, reinit=True)

    def write(self, prefix: str, step: int, values: dict[str, float]) -> None:
        self.run.log({f"{prefix}/{k}": v for k, v in values.items()}, step=step)

    def close(self) -> None:
        self.run.finish()


class SinkWriter:
    """A ``MetricsWriter`` (same ``write``/``close``) that also feeds the configured sinks.
    Sinks are shared between the writers of one run (train and eval go to one event file)."""

    _open: dict[tuple[Path, str], list[Any]] = {}  # (run dir, kind) -> [sink, writers using it]

    def __init__(self, jsonl: MetricsWriter, sinks: list[str], run_dir: Path, prefix: str) -> None:
        self.jsonl, self.prefix, self.path = jsonl, prefix, jsonl.path
        self.keys = [(run_dir.resolve(), s) for s in dict.fromkeys(sinks) if s != "jsonl"]
        for key in self.keys:
            if key not in self._open:
                self._open[key] = [_TensorBoard(run_dir) if key[1] == "tensorboard" else _Wandb(run_dir, run_dir.name), 0]
            self._open[key][1] += 1

    def write(self, record: dict[str, Any]) -> None:
        self.jsonl.write(record)
        step, values = int(record.get("step", 0)), scalars(record)
        for key in self.keys:
            self._open[key][0].write(self.prefix, step, values)

    def close(self) -> None:
        self.jsonl.close()
        for key in self.keys:
            entry = self._open[key]
            entry[1] -= 1
            if entry[1] == 0:  # the last writer of the run closes the shared sink
                del self._open[key]
                entry[0].close()
        self.keys = []


def with_sinks(jsonl: MetricsWriter, sinks: list[str], run_dir: Path, prefix: str) -> MetricsWriter | SinkWriter:
    """``jsonl`` itself when only JSONL is configured, else a writer that feeds the sinks too."""
    return jsonl if all(s == "jsonl" for s in sinks) else SinkWriter(jsonl, list(sinks), run_dir, prefix)
