"""Fixtures shared by test modules."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import zmq

from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model


@pytest.fixture(scope="session")
def fallback_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model on the fallback corpus, seed 0: made once per session for every test that
    drives a learner with synthetic rollouts (its tokenizer and vocabulary are all they need)."""
    path = tmp_path_factory.getbasetemp() / "tiny-fallback-seed0"
    if not (path / "config.json").exists():
        make_tiny_model(path, corpus=FALLBACK_CORPUS, seed=0)
    return path


def _leave_unterminated(self: zmq.Context) -> None:
    """``zmq.Context.__del__`` for the test process: warn, and never terminate.

    A test that fails while holding a context skips its ``term()`` and leaves the context with
    its sockets in the failure's garbage (the traceback's frames hold them). The garbage collector
    clears the context's weak set of sockets before finalising anything. pyzmq's ``__del__``
    then calls ``destroy()``, which closes nothing, and ``term()`` waits forever for sockets of
    the same garbage: a 600 s hang inside some later, unrelated test (CI, 2026-11-28). Leaking
    the context costs one idle I/O thread."""
    if not self._shadow and not self.closed:
        warnings.warn(f"zmq context {self!r} left to the garbage collector: not terminated", ResourceWarning, stacklevel=2)


zmq.Context.__del__ = _leave_unterminated  # type: ignore[method-assign]

