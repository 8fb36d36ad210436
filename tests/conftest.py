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


HOSTS_GROUP = "hosts"
"""The modules that make network-namespace hosts or a Slurm cluster: one worker runs them all, one
at a time (root's network namespaces and the daemons are machine-wide)."""
HOSTS_MODULES = {"test_actor_leave", "test_handover_e2e", "test_learner_multinode", "test_multihost", "test_relay", "test_slurm"}
SPLIT_MODULES = {"test_e2e"}
"""Modules whose tests share no costly fixture: each test is a group of its own."""


def _group(item: pytest.Item) -> str:
    module = item.path.stem
    if module in HOSTS_MODULES:
        return HOSTS_GROUP
    return item.nodeid if module in SPLIT_MODULES else module


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``scripts/test.sh``: ``-n 2 --dist loadgroup``): every test of a module
    goes to the same worker, so a module's fixtures (a pretrained base model, a vLLM engine) are
    made once, and the host-making modules share one worker. xdist hands out the groups with the
    most tests first, so the many short tests run two at a time and the long single runs (each a
    learner, actors and engines on both cores) come last. Handing the long ones out first did
    no better (2026-11-28: 1,915 s, against 1,808-2,004 s in three runs of this order)."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
