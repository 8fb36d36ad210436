"""The Slurm recipe against a real Slurm: slurmctld and three slurmd started here, each node a
network-namespace host (tests/slurm_cluster.py), jobs submitted with scripts/slurm/agentgym.sbatch
exactly as docs/operations.md shows.

  - the learner on n1, a relay and an actor on n2 and on n3;
  - the nodes declare a GPU each (gres, backed by a stand-in device: tests/slurm_cluster.py); the
    job holds them (``sbatch --gres=gpu:1``) and ``launch.slurm_learner_gpus = 1`` makes the
    learner's step ask for one: Slurm binds it to the learner (``scontrol show step``, and the
    learner process's SLURM_STEP_GPUS / CUDA_VISIBLE_DEVICES), and the actor steps ask for none;
  - an actor step cancelled mid-run (``scancel --signal=TERM JOB.STEP``) is started again;
  - the job requeued whole (``scontrol requeue``, as preemption with PreemptMode=REQUEUE does)
    starts again, its learner resumes from the checkpoint with --resume, and it trains to the
    end with every ticket accounted for.
One job does all of it: a Slurm job's start costs seconds, the tiny model's steps less.

Skipped, with the reason, where Slurm is not installed, namespaces cannot be made (not root), or
the daemons do not come up. Never a timing.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, SlurmUnavailable, slurm_unavailable

from agentgym.cluster.scenario import FAST
from agentgym.models.tiny import make_default_tiny_model
from agentgym.observe.logs import read_events

REPO = Path(__file__).resolve().parents[1]
NO_SLURM = slurm_unavailable()
pytestmark = pytest.mark.skipif(NO_SLURM is not None, reason=f"no Slurm here: {NO_SLURM}")


@pytest.fixture
def slurm(tmp_path: Path):
    try:
        cluster = SlurmCluster(tmp_path, nodes=3, gpus=1).__enter__()
    except SlurmUnavailable as exc:
        pytest.skip(f"Slurm did not start here: {exc}")
    try:
        yield cluster
    finally:
        cluster.close()


def submit(slurm: SlurmCluster, tmp_path: Path, steps: int) -> tuple[str, Path]:
    model = make_default_tiny_model(tmp_path / "shared" / "tiny", seed=0)
    run_dir = tmp_path / "run"
    overrides = [
        *FAST,
        f"run.max_steps={steps}",
        f'model.path="{model.resolve()}"',
        "model.create_tiny=false",
        "learner.insecure=true",
        'actor.engine="hf"',
        "actor.env_workers=4",
        "launch.slurm_learner_gpus=1",
    ]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONUNBUFFERED": "1",
    }
    args = [
        "-N",
        "3",
        "--gres=gpu:1",
        "--output",
        str(tmp_path / "job-%j.out"),
        str(REPO / "scripts/slurm/agentgym.sbatch"),
        "--run-dir",
        str(run_dir),
        "--config",
        str(REPO / "configs/quickstart.toml"),
        *[a for o in overrides for a in ("-o", o)],
    ]
    return slurm.sbatch(args, env, cwd=tmp_path), run_dir


def wait(cond: Callable[[], bool], timeout_s: float, what: str, why: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s:.0f} s:\n{why()}")
        time.sleep(0.5)


def step_of(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1])["step"] if lines else 0


def job_output(tmp_path: Path, slurm: SlurmCluster) -> str:
    outs = "\n".join(p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("job-*.out"))
    return f"{outs}\n{slurm.logs()}"


def step_tres(slurm: SlurmCluster, step_id: str) -> str:
    """What a running step asked per task (``TresPerTask=...``; "" when nothing beyond CPUs)."""
    for field in slurm.run("scontrol", "show", "step", "--oneliner", step_id).stdout.split():
        if field.startswith("TresPerTask="):
            return field.split("=", 1)[1]
    return ""


def process_env(marker: str, module: str) -> dict[str, str]:
    """The environment of the running ``python -m MODULE`` process whose command line holds ``marker``."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            python = Path(argv[0].decode(errors="replace")).name.startswith("python")  # not srun's own line
            if python and module.encode() in argv and any(marker.encode() in a for a in argv):
                env = (proc / "environ").read_bytes().split(b"\0")
                return dict(e.decode(errors="replace").split("=", 1) for e in env if b"=" in e)
        except (OSError, ValueError):
            continue
    return {}


def finished(slurm: SlurmCluster, job: str) -> bool:
    return slurm.state(job) in (
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
    )


def accounted(tickets: dict) -> None:
    parts = (
        "trained",
        "expired",
        "stale",
        "invalid",
        "failed",
        "untrained_at_end",
        "in_flight_at_end",
    )
    assert tickets["unaccounted"] == 0 and tickets["issued"] == sum(tickets[k] for k in parts), tickets


@pytest.mark.timeout(900)
def test_a_slurm_job_with_a_cancelled_actor_step_and_a_requeue_trains_to_the_end(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    # Steps enough that the requeue (after the first checkpoint, at step 4) lands mid-run on a fast
    # machine too: at 8 the first start could finish before Slurm stopped it.
    steps = 24
    job, run_dir = submit(slurm, tmp_path, steps=steps)
    why = lambda: job_output(tmp_path, slurm)  # noqa: E731
    wait(lambda: step_of(run_dir) >= 2, 400, "2 steps", why)

    # The learner's step holds the GPU it asked for; the actors' steps ask for none.
    steps_now = slurm.steps(job)
    assert step_tres(slurm, steps_now["agentgym-learner"]) == "gres:gpu:1", slurm.run(
        "scontrol", "show", "step", steps_now["agentgym-learner"]
    ).stdout
    assert "gpu" not in step_tres(slurm, steps_now["agentgym-actors-n2"])
    env = process_env(str(run_dir), "agentgym.learner.main")
    assert env.get("SLURM_STEP_GPUS") == "0" and env.get("CUDA_VISIBLE_DEVICES") == "0", {
        k: v for k, v in env.items() if "GPU" in k or "CUDA" in k
    }

    # One node's actor step cancelled (docs/operations.md, "On Slurm"): it is started again.
    # (Slurm 22.05's scancel signals the step, then reports "Invalid job id specified" for it:
    # its exit code says nothing; the restart below is what is checked.)
    # Once its actor joined: one still starting stops as cleanly (tests/test_actor_early_signal.py),
    # but this one has episodes to hand over.
    joined = lambda: read_events(run_dir / "logs" / "learner.jsonl", "actor_joined")  # noqa: E731
    wait(lambda: any(e["actor_id"].startswith("slurm-n3-") for e in joined()), 300, "n3's actor joined", why)
    slurm.run("scancel", "--signal=TERM", slurm.steps(job)["agentgym-actors-n3"], check=False)
    events = lambda name: read_events(run_dir / "logs" / f"slurm-{job}.jsonl", name)  # noqa: E731
    wait(
        lambda: bool(events("actor_step_restarted")),
        120,
        "the actor step started again",
        why,
    )
    at = step_of(run_dir)
    wait(lambda: step_of(run_dir) >= at + 1, 300, "a step after the restart", why)

    # The whole job requeued (as preemption with PreemptMode=REQUEUE does): it starts again and
    # its learner resumes from the newest checkpoint.
    ckpts = lambda: sorted(run_dir.glob("checkpoints/step_*/trainer/state.pt"))  # noqa: E731
    wait(lambda: bool(ckpts()), 300, "a checkpoint", why)
    slurm.run("scontrol", "requeue", job)
    wait(
        lambda: bool(read_events(run_dir / "logs" / "learner.jsonl", "learner_resumed")),
        400,
        "the learner resumed",
        why,
    )
    wait(
        lambda: finished(slurm, job) and (run_dir / "summary.json").exists(),
        400,
        "end of the requeued job",
        why,
    )
    assert slurm.state(job) == "COMPLETED", why()

    restarted = events("actor_step_restarted")
    assert [e["node"] for e in restarted][:1] == ["n3"]
    assert [e["restart_count"] for e in events("slurm_job")] == [0, 1]
    starts = events("learner_starting")
    assert [e["resume"] for e in starts] == [False, True]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == steps and summary["reason"] == "run finished"
    accounted(summary["tickets"])
    assert {e["actor_id"].rsplit("-", 1)[0] for e in joined()} == {"slurm-n2-0", "slurm-n3-0"}
    # Every actor stopped cleanly: the cancelled one on its SIGTERM, those of the requeued job's first
    # start when its learner stopped, the two of the last start when the run finished.
    reasons = Counter(json.loads(p.read_text())["reason"] for p in (run_dir / "actors").glob("*.json"))
    assert reasons["learner: run finished"] == 2 and reasons["got SIGTERM"] >= 1, reasons
    assert set(reasons) <= {"learner: run finished", "got SIGTERM", "learner: learner got SIGTERM"}, reasons
    started = [e["step"] for e in events("step_starting")]
    assert sorted(set(started)) == [
        "agentgym-actors-n2",
        "agentgym-actors-n3",
        "agentgym-learner",
        "agentgym-relay",
    ]
    # n3's actors: the first start, the restart after the cancel, the requeued start (and, when
    # the requeue's stop reaches the driver after the step's end, one more restart it began).
    assert started.count("agentgym-learner") == 2 and started.count("agentgym-actors-n3") >= 3, started
