"""A stop signal mid-step to a whole ``agentgym train`` job, as Slurm sends it, then ``--resume``:
what is kept and how long the stop takes, for any model.

    python bench/stop_signal.py --out /tmp/stop                                   # the tiny model
    python bench/stop_signal.py --model models/smollm2-135m --after 2 --out /tmp/stop-smol \\
        -o rollout.group_size=4 -o learner.batch_groups=4                        # a real model

``agentgym train`` (``--config``, default configs/quickstart.toml, with ``-o`` overrides) runs in a
session of its own; once the learner starts training step ``--after`` + 1
(``train_step_started``), the job's whole process group gets SIGTERM, and ``--repeat`` more
0.3 s apart (``scancel`` and ``timeout`` signal every process; the launcher passes it on too).
Then ``agentgym train --resume`` runs ``--resume-steps`` more steps. Prints one JSON line with:

- seconds from the signal to the learner's ``learner_interrupted``, ``checkpoint_saved``
  (reason ``interrupted``), ``learner_finished``, and to the exit of the whole job (Slurm sends
  SIGKILL ``KillWait``, 30 s by default, after its SIGTERM);
- ``abandoned``: whether the step in progress was abandoned (``train_step_abandoned``) or finished;
- ``kept``: the checkpoint's step, the last step in metrics.jsonl and summary.json's step (all
  three equal when nothing was lost);
- ``resumed_from`` and ``resumed_to``: the step the resume loaded and the last it trained.

Timings depend on the machine and its load: report them with both.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agentgym.host.netutil import free_port_pair
from agentgym.learner.training.checkpoint import latest_checkpoint
from agentgym.observe.logs import read_events

REPO = Path(__file__).resolve().parents[1]


def _time(e: dict) -> float:
    from datetime import datetime

    return datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=REPO / "configs" / "quickstart.toml")
    p.add_argument("--model", help="model.path (default: the config's, made by `agentgym train` if it is the tiny one)")
    p.add_argument("-o", dest="overrides", action="append", default=[], help="config override, as agentgym train's -o")
    p.add_argument("--actors", type=int, default=1)
    p.add_argument("--after", type=int, default=3, help="signal while step AFTER+1 is being trained")
    p.add_argument("--repeat", type=int, default=1, help="more SIGTERMs to the group after the first")
    p.add_argument("--resume-steps", type=int, default=2)
    p.add_argument("--timeout", type=float, default=3600, help="seconds to wait for each phase")
    p.add_argument("--out", type=Path, required=True, help="work directory (the run directory is OUT/run)")
    args = p.parse_args()
    return args


def main() -> int:
    args = _parse_args()

    run_dir, log = args.out / "run", args.out / "train.log"
    args.out.mkdir(parents=True, exist_ok=True)
    over = [
        *args.overrides,
        f'learner.bind="tcp://127.0.0.1:{free_port_pair()}"',
        "learner.checkpoint_every=0",
        "learner.checkpoint_minutes=0",
        "eval.at_start=false",
        "eval.at_end=false",
        "eval.every=0",
    ]
    if args.model:
        over += [f'model.path="{args.model}"', "model.create_tiny=false"]
    common = ["--run-dir", str(run_dir), "--actors", str(args.actors), *[a for o in over for a in ("-o", o)]]
    train = [sys.executable, "-m", "agentgym.cli", "train"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    events = lambda name: read_events(run_dir / "logs" / "learner.jsonl", name)  # noqa: E731

    with log.open("ab") as out:
        job = subprocess.Popen(
            [*train, "--config", str(args.config), "--max-steps", "100000", *common],
            cwd=args.out,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + args.timeout
    while not any(e["step"] > args.after for e in events("train_step_started")):
        if job.poll() is not None or time.monotonic() > deadline:
            print(f"the run ended or timed out before step {args.after + 1}: see {log}", file=sys.stderr)
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
            return 1
        time.sleep(0.1)
    t_signal = time.time()
    os.killpg(job.pid, signal.SIGTERM)
    for _ in range(args.repeat):
        time.sleep(0.3)
        try:
            os.killpg(job.pid, signal.SIGTERM)
        except ProcessLookupError:
            break
    try:
        code = job.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        code = job.wait()
    t_exit = time.time()

    def after(name: str, **match: object) -> float | None:
        hits = [e for e in events(name) if all(e.get(k) == v for k, v in match.items())]
        return round(_time(hits[-1]) - t_signal, 2) if hits else None

    ckpt = latest_checkpoint(run_dir / "checkpoints")
    metrics = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    row: dict[str, object] = {
        "exit_code": code,
        "to_interrupted_s": after("learner_interrupted"),
        "to_checkpoint_s": after("checkpoint_saved", reason="interrupted"),
        "to_finished_s": after("learner_finished"),
        "to_job_exit_s": round(t_exit - t_signal, 2),
        "abandoned": bool(events("train_step_abandoned")),
        "kept": {
            "checkpoint": int(ckpt.name.split("_")[1]) if ckpt else None,
            "metrics": metrics[-1] if metrics else None,
            "summary": summary.get("step"),
        },
    }

    if ckpt is not None and args.resume_steps > 0:
        target = int(ckpt.name.split("_")[1]) + args.resume_steps
        with log.open("ab") as out:
            res = subprocess.Popen(
                [*train, "--resume", "--max-steps", str(target), *common],
                cwd=args.out,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            res.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(res.pid, signal.SIGKILL)
        resumed = events("learner_resumed")
        after_resume = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        row.update(
            resumed_from=resumed[-1]["step"] if resumed else None,
            resumed_to=after_resume[-1],
            steps_contiguous=after_resume == list(range(1, after_resume[-1] + 1)),
        )
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
