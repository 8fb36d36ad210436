"""Logging and metrics, configured once per process.

    setup_logging(role="actor", json_path=run_dir / "logs" / "actor-3.jsonl")
    structlog.contextvars.bind_contextvars(actor=3)
    log.info("trajectory_accepted", version=12)

Console gets readable lines on stderr; the run directory gets the same events as JSON lines.
``MetricsWriter`` appends one JSON object per line (``metrics.jsonl``) for plotting.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import IO, Any

import structlog


class _Tee:
    """A structlog processor chain end that writes JSON to a file and console text to stderr."""

    def __init__(self, json_file: IO[str] | None, console_level: int) -> None:
        self._json = json_file
        self._console = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        self._level = console_level

    def __call__(self, _logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
        if self._json is not None:
            self._json.write(json.dumps(event, default=str) + "\n")
            self._json.flush()
        if logging.getLevelNamesMapping().get(method.upper(), logging.INFO) >= self._level:
            sys.stderr.write(self._console(_logger, method, dict(event)) + "\n")
            sys.stderr.flush()
        raise structlog.DropEvent


def quiet_libraries(level: str = "info") -> None:
    """Keep vLLM's and transformers' own chatter (per-update INFO lines, progress bars, upstream
    deprecation warnings) off the console unless asked for with ``--log-level debug``. Call it
    before importing vLLM: vLLM reads its level from the environment at import."""
    import os
    import warnings

    if level.lower() != "debug":
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TQDM_DISABLE", "1")
        os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")  # vLLM's engine processes
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*Triton.*")
        # vLLM's import-time warnings go through the root logger before its own config applies
        logging.getLogger("vllm").setLevel(logging.ERROR)


def setup_logging(role: str, json_path: Path | None = None, level: str = "info") -> None:
    """Configure structlog for this process; ``role`` is bound into every event."""
    json_file = None
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_file = open(json_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _Tee(json_file, logging.getLevelNamesMapping()[level.upper()]),
        ],
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(role=role)
    # Libraries that log through stdlib logging (vLLM, transformers) stay on their own handlers.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # `kill -USR1 PID` prints every thread's Python stack to stderr: what a stuck process is doing,
    # without a debugger (docs/operations.md).
    if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
        for stream in (sys.stderr, sys.__stderr__):  # a replaced stderr (captured) may have no descriptor
            try:
                faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True, chain=False)  # type: ignore[arg-type]  # None: the except takes it
                break
            except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is both of the last two
                continue


class MetricsWriter:
    """Appends metric records as JSON lines; every record gets a wall-clock ``time``."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = open(path, "a", buffering=1)  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps({"time": time.time(), **record}, default=float) + "\n")

    def close(self) -> None:
        self._f.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics file (for tests, plots and reports)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def read_events(path: Path, name: str) -> list[dict[str, Any]]:
    """The records of one event in a JSON log file (a file still being written, or missing, is
    fine: an unfinished or unreadable line is skipped)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if f'"{name}"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == name:
            out.append(rec)
    return out
