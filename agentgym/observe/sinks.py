"""Metric sinks beside the JSONL files: TensorBoard event files and a W&B run.

    check_sinks(cfg.metrics.sinks)                   # at start: a chosen sink's library is installed
    writer = with_sinks(MetricsWriter(run_dir / "metrics.jsonl"), cfg.metrics.sinks, run_dir, "train", cfg=cfg)
    writer.write({"step": 3, "loss": 0.1, ...})      # JSONL as before, plus each sink
    writer.close()

JSONL stays the record (the viewer and tests read it); a sink gets every numeric field of a
record as a scalar ``<prefix>/<key>`` at the record's ``step``, and the run's resolved config
once (TensorBoard: a text entry ``config``; W&B: the run's config). The libraries are optional
extras (``pip install 'agentgym[tensorboard]'`` / ``'agentgym[wandb]'``) and imported only when
chosen; a chosen sink whose library is missing is an error at start, not a silent gap.

W&B: train and eval records each carry their own step metric (``train/step``, ``eval/step``,
tied to their keys with ``define_metric``). The learner writes the eval record of step 50 after
later train steps in async mode, and W&B drops a point logged at a step below its current one;
with a step metric per prefix nothing is passed as W&B's own ``step`` and every point is kept.
Mode, project, entity and name come from ``[metrics.wandb]``, then ``WANDB_*``, then offline /
"agentgym" / the run directory's name; offline needs no account (``wandb sync`` uploads later).
"""

from __future__ import annotations

import importlib
import numbers
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.observe.logs import MetricsWriter

_LIBRARIES = {"tensorboard": "tensorboard", "wandb": "wandb"}


class SinkError(RuntimeError):
    """A configured sink cannot start (its library is not installed)."""


def check_sinks(sinks: Sequence[str]) -> None:
    """``SinkError`` (one line, with the install command) for a chosen sink whose library cannot
    be imported; a command checks it before anything starts (only chosen libraries are imported)."""
    for sink in sinks:
        lib = _LIBRARIES.get(sink)
        if lib is None:
            continue
        try:
            importlib.import_module(lib)
        except ImportError:
            raise SinkError(
                f"metrics.sinks has {sink!r} but {lib} is not installed: pip install 'agentgym[{sink}]'"
            ) from None


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a record (booleans as 0/1), without ``step`` and ``time``."""
    return {k: float(v) for k, v in record.items() if isinstance(v, numbers.Real) and k not in ("step", "time")}


def wandb_settings(cfg: Any, run_dir: Path) -> dict[str, str | None]:
    """The W&B run's mode, project, entity and name: ``[metrics.wandb]``, else ``WANDB_*``, else
    the defaults (offline, "agentgym", W&B's default entity, the run directory's name)."""
    w = cfg.metrics.wandb if cfg is not None else None
    env = os.environ.get
    return {
        "mode": (w and w.mode) or env("WANDB_MODE") or "offline",
        "project": (w and w.project) or env("WANDB_PROJECT") or "agentgym",
        "entity": (w and w.entity) or env("WANDB_ENTITY") or None,
        "name": (w and w.name) or env("WANDB_NAME") or run_dir.name,
    }


class _TensorBoard:
    def __init__(self, run_dir: Path, cfg: Any) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise SinkError(
                "metrics.sinks has 'tensorboard' but it is not installed: pip install 'agentgym[tensorboard]'"
            ) from exc
        self.w = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        if cfg is not None:
            # TensorBoard's text tab renders markdown: indented lines show as a code block.
            self.w.add_text("config", "\n".join("    " + line for line in cfg.to_toml().splitlines()), 0)

    def write(self, prefix: str, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.w.add_scalar(f"{prefix}/{k}", v, step)
        self.w.flush()

    def close(self) -> None:
        self.w.close()


class _Wandb:
    def __init__(self, run_dir: Path, cfg: Any) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise SinkError("metrics.sinks has 'wandb' but it is not installed: pip install 'agentgym[wandb]'") from exc
        settings: dict[str, Any] = wandb_settings(cfg, run_dir)  # wandb.init's options by name
        config = cfg.model_dump(mode="json") if cfg is not None else {}
        config["wandb"] = settings  # what was used, whichever of config, WANDB_* or default gave it
        # console="off": the learner's own console and JSON logs stay as they are (no capture).
        self.run = wandb.init(
            dir=str(run_dir), config=config, reinit="create_new", settings=wandb.Settings(console="off"), **settings
        )
        for prefix in ("train", "eval"):
            self.run.define_metric(f"{prefix}/step")
            self.run.define_metric(f"{prefix}/*", step_metric=f"{prefix}/step")

    def write(self, prefix: str, step: int, values: dict[str, float]) -> None:
        self.run.log({f"{prefix}/step": step, **{f"{prefix}/{k}": v for k, v in values.items()}})

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() can return before W&B's core process has written the run's last records
        # (seen with wandb 0.31 offline: a run file holding its header only); teardown waits
        # for the core to exit, so the run directory is complete when the learner exits.
        wandb.teardown()


class SinkWriter:
    """A ``MetricsWriter`` (same ``write``/``close``) that also feeds the configured sinks.
    Sinks are shared between the writers of one run (train and eval go to one event file)."""

    _open: dict[tuple[Path, str], list[Any]] = {}  # (run dir, kind) -> [sink, writers using it]

    def __init__(self, jsonl: MetricsWriter, sinks: list[str], run_dir: Path, prefix: str, cfg: Any = None) -> None:
        self.jsonl, self.prefix, self.path = jsonl, prefix, jsonl.path
        self.keys = [(run_dir.resolve(), s) for s in dict.fromkeys(sinks) if s != "jsonl"]
        for key in self.keys:
            if key not in self._open:
                self._open[key] = [(_TensorBoard if key[1] == "tensorboard" else _Wandb)(run_dir, cfg), 0]
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


def with_sinks(
    jsonl: MetricsWriter, sinks: list[str], run_dir: Path, prefix: str, cfg: Any = None
) -> MetricsWriter | SinkWriter:
    """``jsonl`` itself when only JSONL is configured, else a writer that feeds the sinks too;
    ``cfg``: the run's resolved config, logged to each sink (and [metrics.wandb] for W&B)."""
    return jsonl if all(s == "jsonl" for s in sinks) else SinkWriter(jsonl, list(sinks), run_dir, prefix, cfg)
