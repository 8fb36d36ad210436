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
and change nothing. With several data-parallel ranks, a rank > 0 that gets a signal asks rank 0
to stop (learner/training/distributed.py, ``RankSignals``): rank 0 acts on it as on its own signal
(``request``), so a signal to any rank ends the run the same way. The receiver stays open until the learner's work is done, and
agentgym/cli/learner.py holds both signals (agentgym/host/early_signals.py) before it opens and after it
closes, so no signal reaches Python's default action (which would kill the process mid-checkpoint).
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
from collections.abc import AsyncIterator, Callable

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
        self.request(f"learner got {sig.name}", signal=sig.name)

    def request(self, reason: str, **fields: object) -> None:
        """Stop the run for ``reason`` (the first request wins; ``fields`` go to the log line):
        this process's signal, or another rank's (``rank``, ``signal``)."""
        if self.reason is not None:
            log.info("learner_signal_repeated", stopping=self.reason, **fields)
            return
        self.reason = reason
        log.warning("learner_interrupted", mid_step=self.mid_step(), **fields)
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


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RankSignals:
    """SIGINT and SIGTERM of a learner rank > 0: never fatal, passed on to rank 0 as a request to
    stop the run (learner/training/distributed.py sends it through the ranks' rendezvous store).

    A rank > 0 spends its time inside collectives that rank 0 leads. Killed by a signal there, it
    would make rank 0's step (or its checkpoint, which every fsdp rank writes a part of) fail
    with no checkpoint and no summary; ignoring the signal would leave a rank that its host is
    about to take away (a node's torchrun stopped, Slurm's KillWait) in a run that needs it. So
    the signal becomes rank 0's: the run stops at a step boundary, every rank takes part in the
    ``interrupted`` checkpoint, and rank 0's ``stop`` command ends this rank (exit 0).

    The C-level handler writes the signal's number to a pipe (``signal.set_wakeup_fd``) that a
    thread reads at once, even while the main thread waits in a collective, where Python-level
    handlers do not run. System calls interrupted by the signal are restarted (``siginterrupt``),
    so the collectives' own threads do not see ``EINTR``. A signal that comes before rank 0 can
    be told (the rank still loading) is sent once it can; one that cannot be sent (rank 0 gone)
    ends the rank at once: there is no run left to protect.
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.reason: str | None = None
        self._send: Callable[[str], None] | None = None
        self._lock = threading.Lock()
        r, w = os.pipe()
        os.set_blocking(w, False)
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda _n, _f: None)  # the pipe carries it; Python's handler has nothing to do
            signal.siginterrupt(sig, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        threading.Thread(target=self._read, args=(r,), name="rank-signals", daemon=True).start()

    def connect(self, send: Callable[[str], None]) -> None:
        """From now on a stop request goes to rank 0 through ``send`` (at once if one is waiting)."""
        with self._lock:
            self._send = send
            pending = self.reason
        if pending is not None:
            self._pass_on(pending)

    def _read(self, fd: int) -> None:
        while data := os.read(fd, 64):
            for n in data:
                self._got(signal.Signals(n))

    def _got(self, sig: signal.Signals) -> None:
        with self._lock:
            if self.reason is not None:
                log.info("learner_rank_signal_repeated", rank=self.rank, signal=sig.name)
                return
            self.reason = f"learner rank {self.rank} got {sig.name}"
            send = self._send
        log.warning("learner_rank_signalled", rank=self.rank, signal=sig.name, rank0_told=send is not None)
        if send is not None:
            self._pass_on(self.reason)

    def _pass_on(self, reason: str) -> None:
        assert self._send is not None
        try:
            self._send(reason)
        except Exception as exc:  # rank 0 unreachable: nothing waits for this rank any more
            log.error("learner_rank_stop_unsent", rank=self.rank, error=str(exc))
            os._exit(130)
        log.info("learner_rank_stop_requested", rank=self.rank, reason=reason)


def rank_process(rank: int, payload: bytes) -> None:
    """Entry point of a rank > 0 spawned by the learner (``torch.multiprocessing``, spawn). Its
    stop signals are taken over first, before torch is imported (seconds in which a signal to the
    job would otherwise kill it and leave rank 0 waiting at the rendezvous); then ``payload``
    (the pickled arguments of ``distributed._rank_main``, whose unpickling imports torch) runs."""
    signals = RankSignals(rank)
    from agentgym.learner.training.distributed import _rank_main

    cfg, build, world, init_method = pickle.loads(payload)
    _rank_main(cfg, build, rank, world, init_method, signals=signals)
