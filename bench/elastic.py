"""Actors joining and leaving in bursts, a quarter at once, while a real learner trains.

    python bench/elastic.py --out /tmp/elastic          # 32 actors in 4 processes

A real ``agentgym-learner`` (tiny model, loopback, ``learner.batch_groups = 8``) and 4
``agentgym.cluster.play_fleet`` processes of simulated actors (bench/control_plane.py describes them).
Timeline: ``--phase`` s steady; one process (a quarter of the actors) is SIGKILLed (they vanish
without a word: the learner notices after ``learner.actor_timeout_s`` and re-issues their
tickets); ``--phase`` s later a new process of as many actors joins at once; then another
quarter leaves politely (SIGTERM: each identity sends Leave, and the learner re-issues its
tickets at once) and a quarter joins again. Reported per phase: optimizer steps per second and groups accepted
per second (from the learner's metrics.jsonl), and the longest gap between two steps, so a
stall would show as a gap far above the steady state's.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from procs import start_learner  # noqa: E402


def spawn_fleet(model: Path, port: int, prefix: str, count: int, work: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgym.cluster.play_fleet",
            "--learner",
            f"tcp://127.0.0.1:{port}",
            "--model",
            str(model),
            "--count",
            str(count),
            "--prefix",
            prefix,
            "--max-groups",
            "1",
            "--latency",
            "1.0",
            "--out",
            str(work / f"{prefix}.json"),
        ],
        cwd=ROOT,
        stdout=open(work / f"{prefix}.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _start_learner(model: Path, port: int, work: Path) -> subprocess.Popen:
    """The learner on quickstart's config over ``model``, bound to ``port``, its log in ``work``."""
    extra = (
        "learner.batch_groups=8",
        "rollout.group_size=4",
        "learner.actor_timeout_s=6",
        "learner.heartbeat_interval_s=1.0",
    )
    return start_learner(model, work, f"tcp://127.0.0.1:{port}", extra)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--actors", type=int, default=32)
    p.add_argument("--phase", type=float, default=30.0)
    p.add_argument("--out", type=Path, default=Path("/tmp/elastic"))
    args = p.parse_args()
    from agentgym.models.tiny import make_default_tiny_model

    work = args.out
    work.mkdir(parents=True, exist_ok=True)
    model = make_default_tiny_model(work / "tiny", seed=0).resolve()
    port, q = 17700, args.actors // 4
    learner = _start_learner(model, port, work)
    fleets = {f"f{i}": spawn_fleet(model, port, f"f{i}", q, work) for i in range(4)}
    marks: list[tuple[str, float]] = []
    try:
        metrics = work / "run" / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 5):
            time.sleep(1)  # training under way
        marks.append(("steady", time.time()))
        time.sleep(args.phase)
        os.killpg(fleets.pop("f0").pid, signal.SIGKILL)
        marks.append(("a quarter killed", time.time()))
        time.sleep(args.phase)
        fleets["f4"] = spawn_fleet(model, port, "f4", q, work)
        marks.append(("a quarter joined", time.time()))
        time.sleep(args.phase)
        fleets.pop("f1").terminate()
        marks.append(("a quarter stopped", time.time()))
        time.sleep(args.phase)
        fleets["f5"] = spawn_fleet(model, port, "f5", q, work)
        marks.append(("a quarter joined again", time.time()))
        time.sleep(args.phase)
        marks.append(("end", time.time()))
    finally:
        for f in fleets.values():
            f.terminate()
        learner.terminate()
        learner.wait(timeout=60)
    recs = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in recs if "tickets_in_flight" in r]
    rows = []
    for (name, t0), (_, t1) in zip(marks, marks[1:]):
        inside = [r for r in steps if t0 <= r["time"] < t1]
        times = [t0] + [r["time"] for r in inside] + [t1]
        acc0 = max((r["groups_accepted"] for r in steps if r["time"] < t0), default=0)
        acc1 = max((r["groups_accepted"] for r in inside), default=acc0)
        rows.append(
            {
                "phase": name,
                "seconds": t1 - t0,
                "steps_per_s": len(inside) / (t1 - t0),
                "accepted_groups_per_s": (acc1 - acc0) / (t1 - t0),
                "longest_gap_s": max(b - a for a, b in zip(times, times[1:])),
                "actors_at_end": inside[-1]["actors"] if inside else None,
            }
        )
    (work / "elastic.json").write_text(
        json.dumps({"rows": rows, "actors": args.actors, "loadavg": os.getloadavg()}, indent=2)
    )
    print(
        "| phase | seconds | steps/s | accepted groups/s | longest gap between steps (s) | actors registered at its end |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['phase']} | {r['seconds']:.0f} | {r['steps_per_s']:.2f} | {r['accepted_groups_per_s']:.1f} | "
            f"{r['longest_gap_s']:.2f} | {r['actors_at_end']} |"
        )
    print(f"\nload average {os.getloadavg()}, {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
