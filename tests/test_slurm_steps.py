"""The Slurm recipe's steps (agentgym/cli/slurm.py), without a Slurm: which GPUs each step asks
for, from the config; how long the driver waits for the steps left once the learner has exited.
tests/test_slurm.py runs them against a real Slurm."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentgym.cli.slurm import Job, Layout, step_gpus
from agentgym.config import load_config


def gpus(*overrides: str) -> tuple[int, int]:
    return step_gpus(load_config(None, list(overrides)))


def test_a_cpu_run_asks_for_no_gpu_and_a_cuda_run_for_one_per_rank_and_actor() -> None:
    assert gpus() == (0, 0)  # devices "auto": nothing is asked for
    assert gpus('learner.device="cpu"', 'actor.device="cpu"') == (0, 0)
    assert gpus('learner.device="cuda"') == (1, 0)
    assert gpus('learner.device="cuda"', "learner.dp_size=4", 'actor.device="cuda"') == (4, 1)
    # The keys win over the devices, both ways.
    assert gpus('learner.device="cuda"', "launch.slurm_learner_gpus=0", "launch.slurm_actor_gpus=2") == (0, 2)
    assert gpus("launch.slurm_learner_gpus=8") == (8, 0)


def test_the_gpu_flag_goes_on_the_step_that_asks_and_only_there() -> None:
    argv = ["python", "-m", "agentgym.learner.main"]
    learner = Job.srun_argv("agentgym-learner", ["n1"], 1, argv, gpus_per_task=2)
    assert learner[:7] == [
        "srun",
        "--job-name=agentgym-learner",
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=n1",
        "--gpus-per-task=2",
        "--overlap",
    ]
    assert learner[-3:] == argv
    actors = Job.srun_argv("agentgym-actors-n2", ["n2"], 3, ["sh"], gpus_per_task=0)
    assert "--ntasks=3" in actors and not any(a.startswith("--gpus") for a in actors)


def _step(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


STUCK = "import time\nwhile True: time.sleep(0.05)"  # a step that outlives its learner; SIGTERM ends it


def test_after_a_signal_the_steps_left_get_the_grace_not_the_whole_exit_window(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Slurm's SIGTERM gives the job KillWait (30 s) before SIGKILL: once the learner has exited,
    an actor step still running is told to stop SIGNAL_GRACE_S after the signal, not after the
    window that an unsignalled job gives its actors to leave on the learner's Shutdown."""
    import agentgym.cli.launch as launch

    monkeypatch.setattr(launch, "ACTORS_EXIT_S", 3600.0)  # the unsignalled wait: longer than the test's timeout
    monkeypatch.setattr(launch, "SIGNAL_GRACE_S", 0.5)
    lay = Layout("1", ["n1"], "n1", "127.0.0.1", 5555, 0)
    job = Job(lay, tmp_path, [], 1, False, 0)
    job.actors = {"n1": _step(STUCK)}
    job.relays = _step(STUCK)
    job.signalled, job.signalled_at = signal.SIGTERM, time.monotonic()
    job.stop_rest()
    assert job.actors["n1"].returncode == -signal.SIGTERM
    assert job.relays.returncode == -signal.SIGTERM


def test_without_a_signal_an_actor_that_ends_on_the_learners_shutdown_is_waited_for(tmp_path: Path) -> None:
    lay = Layout("1", ["n1"], "n1", "127.0.0.1", 5555, 0)
    job = Job(lay, tmp_path, [], 1, False, 0)
    job.actors = {"n1": _step("import time; time.sleep(1.0)")}  # leaves on its own, a second later
    job.stop_rest()
    assert job.actors["n1"].returncode == 0  # waited for, not signalled
