"""The Slurm recipe's step command lines (agentgym/cli/slurm.py), without a Slurm: which GPUs each
step asks for, from the config. tests/test_slurm.py runs them against a real Slurm."""

from __future__ import annotations

from agentgym.cli.slurm import Job, step_gpus
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
