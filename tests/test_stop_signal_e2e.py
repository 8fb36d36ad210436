"""A stop signal never loses work: ``agentgym train`` (the launcher, a learner, two actors on the
simulated engine, the tiny model) stopped mid-step the ways a job is stopped, then resumed.

1. As Slurm's ``scancel`` does: SIGTERM to the job's whole process group (the launcher runs in a
   session of its own), twice, while a training step runs. The step is abandoned before its
   optimizer step, the ``interrupted`` checkpoint holds the last completed step, summary.json is
   written, the actors leave (their env workers, signalled too, stay up until closed), every
   process exits with its own code (130 for the launcher and learner, 0 for the actors).
2. ``agentgym train --resume`` under ``timeout``, whose deadline comes (SIGALRM, what its own
   timer sends it): it sends SIGTERM to the launcher and to their process group, and exits 124;
   a SIGINT to the learner alone on top. The run continues from the checkpoint's step, and stops
   the same way. A last ``--resume`` continues from the step ``timeout`` stopped it at, to the end.

3. A learner with two data-parallel ranks (fsdp, gloo): SIGTERM to rank 1 alone stops the run
   the same way (rank 1 asks rank 0 to stop; both take part in the checkpoint), and the job's
   process-group SIGTERM that follows, which reaches rank 1 again, kills no rank.
4. Once the learner has stopped, the launcher waits for its actors; a SIGTERM to the launcher
   during that wait ends it, even for an actor that will never stop on its own.

Micro-batches of 64 tokens make a step of many micro-batches, long enough to be caught in.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import psutil

from agentgym.host.netutil import free_port_pair
from agentgym.learner.training.checkpoint import latest_checkpoint
from agentgym.observe.logs import read_events

REPO = Path(__file__).resolve().parents[1]


def _wait(cond: Callable[[], bool], what: str, procs: list[subprocess.Popen], log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        for p in procs:
            assert p.poll() is None, f"exited ({p.returncode}) before {what}:\n" + log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + log.read_text()[-3000:]
        time.sleep(0.05)


def _steps(run_dir: Path) -> list[int]:
    m = run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in m.read_text().splitlines()] if m.exists() else []


def run_cli(cmd: list[str], *args: str, cwd: Path, env: dict[str, str], log: Path) -> int:
    with log.open("ab") as out:
        return subprocess.run(
            [*cmd, *args], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=600
        ).returncode


def _learner_events(run_dir: Path, name: str) -> list[dict]:
    return read_events(run_dir / "logs" / "learner.jsonl", name)


def _mid_step(run_dir: Path, after: int) -> Callable[[], bool]:
    """True once the learner has started a training step past step ``after``."""
    return lambda: any(e["step"] > after for e in _learner_events(run_dir, "train_step_started"))


def _family(pid: int) -> list[psutil.Process]:
    return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]


def _check_stopped(run_dir: Path, reason: str) -> int:
    """The run ended for ``reason`` with nothing lost; returns the checkpoint's step."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == reason, summary["reason"]
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    assert ckpt is not None
    step = int(ckpt.name.split("_")[1])
    # the interrupted checkpoint is the last completed step, recorded in metrics.jsonl
    assert summary["step"] == step == _steps(run_dir)[-1], (summary["step"], ckpt, _steps(run_dir)[-1:])
    assert _learner_events(run_dir, "checkpoint_saved")[-1]["reason"] == "interrupted"
    assert summary["tickets"]["unaccounted"] == 0, summary["tickets"]
    assert _learner_events(run_dir, "learner_finished")[-1]["step"] == step
    return step


def test_sigterm_to_the_job_or_through_timeout_mid_step_keeps_the_run(fallback_model: Path, tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    port = free_port_pair()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = [
        "--run-dir",
        str(run_dir),
        "--actors",
        "2",
        "--max-steps",
        "1000",
        "-o",
        f'learner.bind="tcp://127.0.0.1:{port}"',
        "-o",
        f'model.path="{fallback_model}"',
        "-o",
        "model.create_tiny=false",
        "-o",
        'actor.engine="sim"',
        "-o",
        "learner.micro_batch_tokens=64",
        "-o",
        "learner.checkpoint_every=0",
        "-o",
        "learner.checkpoint_minutes=0",
        "-o",
        "eval.at_start=false",
        "-o",
        "eval.at_end=false",
        "-o",
        "eval.every=0",
        "-o",  # local actors wait for a learner however slowly it starts (the launcher watches it)
        "actor.connect_timeout_s=1",
    ]
    train = [sys.executable, "-m", "agentgym.cli", "train"]

    # 1. Slurm: the job's process group gets SIGTERM, and again while the learner stops.
    with log.open("ab") as out:
        job = subprocess.Popen(
            [*train, "--config", str(REPO / "configs" / "quickstart.toml"), *args],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait(_mid_step(run_dir, after=2), "step 3 to start", [job], log)
        family = _family(job.pid)
        os.killpg(job.pid, signal.SIGTERM)
        time.sleep(0.3)
        second = time.time()
        os.killpg(job.pid, signal.SIGTERM)
        assert job.wait(timeout=120) == 130, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"
    interrupted = _learner_events(run_dir, "learner_interrupted")
    assert [e["signal"] for e in interrupted] == ["SIGTERM"] and interrupted[0]["mid_step"], interrupted
    # A learner still running at the second signal logs it (one that had already finished, as
    # can happen when its step ends within the 0.3 s, ignores it: the exit code above says so).
    finished = _learner_events(run_dir, "learner_finished")
    if (
        not finished
        or datetime.fromisoformat(finished[0]["timestamp"].replace("Z", "+00:00")).timestamp() > second + 0.05
    ):
        assert _learner_events(run_dir, "learner_signal_repeated"), "the second SIGTERM was not seen"
    abandoned = _learner_events(run_dir, "train_step_abandoned")
    first = _check_stopped(run_dir, "learner got SIGTERM")
    assert [e["step"] for e in abandoned] == [first + 1], (abandoned, first)
    assert _steps(run_dir) == list(range(1, first + 1))
    for f in (run_dir / "actors").glob("*.json"):
        assert json.loads(f.read_text())["reason"] in ("got SIGTERM", "learner: learner got SIGTERM"), f.read_text()
    # The actors stopped cleanly (a late SIGTERM did not end them with -15), and their env
    # workers, signalled with the group, stayed up until the actors closed them.
    assert "actor_failed" not in log.read_text(), log.read_text()[-3000:]
    for f in (run_dir / "logs").glob("actor-local-*.jsonl"):
        assert '"crash"' not in f.read_text(), f.read_text()[-3000:]  # the pool's failures by reason

    # 2. `timeout` stops the resumed run at its deadline: SIGALRM is its timer's signal (a deadline
    # of N seconds, without waiting them), on which it TERMs the launcher and the process group;
    # a SIGINT to the learner alone on top.
    assert shutil.which("timeout"), "coreutils' timeout is needed"
    with log.open("ab") as out:
        job = subprocess.Popen(
            ["timeout", "600", *train, "--resume", *args],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait(_mid_step(run_dir, after=first + 2), "two steps after the resume", [job], log)
        family = _family(job.pid)
        learner = next(p for p in family if "agentgym.learner.main" in " ".join(p.cmdline()))
        job.send_signal(signal.SIGALRM)
        time.sleep(0.3)
        learner.send_signal(signal.SIGINT)
        assert job.wait(timeout=120) == 124, log.read_text()[-3000:]  # timeout's "timed out"
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"
    assert [e["step"] for e in _learner_events(run_dir, "learner_resumed")] == [first]
    assert "actor_failed" not in log.read_text(), log.read_text()[-3000:]
    second = _check_stopped(run_dir, "learner got SIGTERM")
    assert second >= first + 2
    assert _steps(run_dir) == list(range(1, second + 1))  # the step count went on from the checkpoint

    # 3. `--resume` after the deadline continues from where `timeout` stopped the run, to its end.
    done = run_cli(train, "--resume", *args, "--max-steps", str(second + 2), cwd=tmp_path, env=env, log=log)
    assert done == 0, log.read_text()[-3000:]
    assert [e["step"] for e in _learner_events(run_dir, "learner_resumed")] == [first, second]
    assert json.loads((run_dir / "summary.json").read_text())["reason"] == "run finished"
    assert _steps(run_dir) == list(range(1, second + 3))


def test_a_stop_signal_to_any_learner_rank_stops_every_rank_cleanly(fallback_model: Path, tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    port = free_port_pair()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = [
        "--run-dir",
        str(run_dir),
        "--actors",
        "1",
        "--max-steps",
        "1000",
        "-o",
        f'learner.bind="tcp://127.0.0.1:{port}"',
        "-o",
        f'model.path="{fallback_model}"',
        "-o",
        "model.create_tiny=false",
        "-o",
        'actor.engine="sim"',
        "-o",
        "learner.micro_batch_tokens=64",
        "-o",
        "learner.dp_size=2",
        "-o",
        'learner.dp_mode="fsdp"',
        "-o",
        "learner.dist_timeout_s=300",
        "-o",
        "learner.checkpoint_every=0",
        "-o",
        "learner.checkpoint_minutes=0",
        "-o",
        "eval.at_start=false",
        "-o",
        "eval.at_end=false",
        "-o",
        "eval.every=0",
    ]
    with log.open("ab") as out:
        job = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentgym.cli",
                "train",
                "--config",
                str(REPO / "configs" / "quickstart.toml"),
                *args,
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait(_mid_step(run_dir, after=1), "step 2 to start", [job], log)
        family = _family(job.pid)
        (rank1,) = _learner_events(run_dir, "dp_started")[-1]["pids"]
        assert rank1 in [p.pid for p in family]
        # SIGTERM to rank 1 alone, mid-step: rank 0 stops the run.
        os.kill(rank1, signal.SIGTERM)
        _wait(lambda: bool(_learner_events(run_dir, "learner_interrupted")), "rank 0 to stop", [job], log, timeout=60)
        # Then the whole job, rank 1 again included, while the step ends and the checkpoint is written.
        os.killpg(job.pid, signal.SIGTERM)
        assert job.wait(timeout=120) == 130, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"
    text = log.read_text()
    assert "Traceback" not in text and "actor_failed" not in text, text[-3000:]
    interrupted = _learner_events(run_dir, "learner_interrupted")
    assert [(e.get("rank"), e["signal"]) for e in interrupted] == [(1, "SIGTERM")], interrupted
    # Every rank was still there for the fsdp checkpoint, which gathers the shards of both.
    _check_stopped(run_dir, "learner rank 1 got SIGTERM")


def _launcher_events(run_dir: Path, name: str) -> list[dict]:
    path = run_dir / "logs" / "launcher.jsonl"
    return read_events(path, name) if path.exists() else []


def test_a_stop_signal_ends_the_launchers_wait_for_a_stuck_actor(fallback_model: Path, tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    args = [
        "--run-dir",
        str(run_dir),
        "--actors",
        "1",
        "-o",
        f'learner.bind="tcp://127.0.0.1:{free_port_pair()}"',
        "-o",
        f'model.path="{fallback_model}"',
        "-o",
        "model.create_tiny=false",
        "-o",
        'actor.engine="sim"',
        "-o",
        "eval.at_start=false",
        "-o",
        "eval.at_end=false",
        "-o",
        "eval.every=0",
    ]
    with log.open("ab") as out:
        job = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentgym.cli",
                "train",
                "--config",
                str(REPO / "configs" / "quickstart.toml"),
                *args,
            ],
            cwd=tmp_path,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait(lambda: bool(_launcher_events(run_dir, "launched")), "the launch", [job], log)
        (actor,) = _launcher_events(run_dir, "launched")[0]["actor_pids"]
        os.kill(actor, signal.SIGSTOP)  # stuck: it will neither join nor stop on its own
        _wait(lambda: bool(_learner_events(run_dir, "learner_listening")), "the learner", [job], log)
        family = _family(job.pid)
        job.send_signal(signal.SIGTERM)  # passed on to the learner, which stops, and to the stuck actor
        _wait(lambda: bool(_launcher_events(run_dir, "actors_waiting")), "the learner's exit", [job], log)
        job.send_signal(signal.SIGTERM)  # during the wait for the actor
        assert job.wait(timeout=120) == 130, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"
    assert json.loads((run_dir / "summary.json").read_text())["reason"] == "learner got SIGTERM"
    # The wait ended on the signal, not at its 60 s limit; the killed actor is not reported as failed.
    assert [(e["actor_id"], e["reason"]) for e in _launcher_events(run_dir, "actor_kill")] == [("local-0", "signal")]
    assert not _launcher_events(run_dir, "actor_failed")
