"""SIGTERM before a process's event loop takes it over.

An actor spends seconds importing torch and vLLM, and up to ``actor.connect_timeout_s`` waiting
for its learner, before its loop installs its own handlers. Python's default SIGTERM would end it
there with no record (Slurm's ``scancel`` of a step that is still starting, a supervisor's stop).
``hold`` replaces that default with a note of the signal; the loop's handler, once installed,
calls ``take`` and acts on a signal held meanwhile as on one that came later.
SIGINT is not held: Ctrl-C during the imports stops the process at once, as it always has.

The learner holds SIGTERM from its start and SIGINT from just before its trio loop, and never lets
go: its loop's receiver replaces the held handlers while it is open and puts them back when it
closes, so a signal repeated or late (the launcher forwarding one the process group already got)
is noted instead of killing a learner that is saving its checkpoint (learner/stopping.py). Once a
learner or an actor has finished, ``ignore_from_now`` keeps late signals from its exit.
"""

from __future__ import annotations

import signal

_held: list[signal.Signals] = []


def hold(sig: signal.Signals = signal.SIGTERM) -> None:
    """From now on ``sig`` is noted, not fatal, until the caller installs a handler of its own."""
    signal.signal(sig, lambda n, _frame: _held.append(signal.Signals(n)))


def take() -> signal.Signals | None:
    """The first signal held since ``hold`` (forgotten once taken), or None."""
    return _held.pop(0) if _held else None


def ignore_from_now() -> None:
    """The process's work is done (its record written): a stop signal has nothing left to stop.
    SIGTERM and SIGINT are ignored from here to the exit. Not a Python handler: the interpreter's
    finalisation puts those back to the default, fatal action, and a signal repeated to the whole
    job (the launcher forwarding one that every process already got) would then end a process
    that stopped cleanly with -15, which its launcher reports as a failure."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
