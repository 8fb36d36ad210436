"""How SIGINT and SIGTERM end a learner run, however many arrive and from wherever.

    stop = StopSignals()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        nursery.start_soon(stop.watch, signals)      # for the whole life of the learner
        ...
        stop.attach(train_nursery.cancel_scope, trainer)   # once there is a run to stop

A stop signal often comes more than once: ``timeout`` and Slurm's ``scancel`` signal the whole
process group, and ``agentgym train``'s launcher forwards what it got to the learner, which then
has the signal twice or three times; a user presses Ctrl-C again. The first one stops the run:
the train nursery is cancelled, and a training step in progress is abandoned before its first
optimizer step (``Trainer.abandon``, ``StepAbandoned``) or else finishes; the learner then saves
the ``interrupted`` checkpoint and writes summary.json (learner/service.py). Later ones are logged
and change nothing. The receiver stays open until the learner's work is done, and
learner/main.py holds both signals (agentgym/host/early_signals.py) before it opens and after it
closes, so no signal reaches Python's default action (which would kill the process mid-checkpoint).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import AsyncIterator

import structlog
import trio

log = structlog.get_logger(__name__)


class StepAbandoned(Exception):
    """A training step gave up before its first optimizer step (its ``abandon`` event was set):
    the weights, the optimizer state and the step count are those of the last completed step."""


class StopSignals:
    """The learner's stop request: the first signal's reason, and what acting on it cancels."""

    def __init__(self) -> None:
        self.reason: str | None = None
        """``learner got SIGTERM`` once a signal came (the run's end reason), else None."""
        self.scope: trio.CancelScope | None = None
        self.abandon: threading.Event | None = None
        self.mid_step = lambda: False

    async def watch(self, signals: AsyncIterator[int]) -> None:
        async for sig in signals:
            self.got(signal.Signals(sig))

    def got(self, sig: signal.Signals) -> None:
        if self.reason is not None:
            log.info("learner_signal_repeated", signal=sig.name, stopping=self.reason)
            return
        self.reason = f"learner got {sig.name}"
        log.warning("learner_interrupted", signal=sig.name, mid_step=self.mid_step())
        self._act()

    def attach(self, scope: trio.CancelScope, abandon: threading.Event | None, mid_step=lambda: False) -> None:
        """From now on a stop cancels ``scope`` and sets ``abandon``; at once if one came already."""
        self.scope, self.abandon, self.mid_step = scope, abandon, mid_step
        if self.reason is not None:
            self._act()

    def _act(self) -> None:
        if self.abandon is not None:
            self.abandon.set()
        if self.scope is not None:
            self.scope.cancel()
