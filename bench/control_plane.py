"""The learner's control plane under 8 to 256 simulated actors, with and without training.

    python bench/control_plane.py --out /tmp/control_plane     # N = 8, 32, 128, 256

A real ``agentgym-learner`` (the tiny model, loopback) and ``agentgym.cluster.play_fleet`` processes of
simulated actors (64 identities a process at most): each identity says Hello, heartbeats, plays
every ticket it is granted into a Rollout (a simulated engine's turn, ``--latency`` s per group)
and takes Acks and WeightsReady, as an actor does. Two learner settings per N:
- ``control``: ``learner.batch_groups`` so large that no step is taken in the window: the
  learner only registers, grants, judges, acks and answers heartbeats: its control plane alone;
- ``train``: ``learner.batch_groups = 8``: the same, plus training on what it accepts.
Over a ``--window`` s window after ``--warmup`` s: groups offered (rollouts sent) and accepted
per second, tickets granted per second, heartbeats per second, the learner process's CPU
(seconds per second, from /proc), CPU per control message (all messages in and out; in ``train``
this includes training, so it is an upper bound), and optimizer steps per second.
Writes OUT/control_plane.json and prints a markdown table. The simulated actors share the
machine's cores with the learner: on a small machine they limit the offered load, which the
table shows next to what the learner accepted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from procs import start_learner  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime, threads included


def counts(files: list[Path]) -> dict[str, float]:
    total: dict[str, float] = {}
    for f in files:
        try:
            for k, v in json.loads(f.read_text()).items():
                total[k] = total.get(k, 0) + v
        except (OSError, ValueError):
            pass
    return total


def steps(metrics: Path, t0: float, t1: float) -> int:
    if not metrics.exists():
        return 0
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return sum(1 for r in recs if "tickets_in_flight" in r and t0 <= r.get("time", 0) <= t1)  # step records


def _start_learner(model: Path, work: Path, port: int, batch: int) -> subprocess.Popen:
    """The learner on quickstart's config over ``model``, bound to ``port``, its log in ``work``."""
    extra = (
        f"learner.batch_groups={batch}",
        "rollout.group_size=4",
        "learner.actor_timeout_s=120",
        "learner.max_staleness=4",
    )
    return start_learner(model, work, f"tcp://127.0.0.1:{port}", extra)


def run_one(n: int, mode: str, model: Path, args: argparse.Namespace, work: Path, port: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    batch = 8 if mode == "train" else 1_000_000
    learner = _start_learner(model, work, port, batch)
    fleets, files = [], []
    try:
        for i, start in enumerate(range(0, n, 64)):
            f = work / f"fleet-{i}.json"
            files.append(f)
            fleets.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "agentgym.cluster.play_fleet",
                        "--learner",
                        f"tcp://127.0.0.1:{port}",
                        "--model",
                        str(model),
                        "--count",
                        str(min(64, n - start)),
                        "--prefix",
                        f"p{i}",
                        "--max-groups",
                        "1",
                        "--latency",
                        str(args.latency),
                        "--out",
                        str(f),
                    ],
                    cwd=ROOT,
                    stdout=open(work / f"fleet-{i}.log", "w"),
                    stderr=subprocess.STDOUT,
                )
            )
        time.sleep(args.warmup)
        c0, cpu0, t0 = counts(files), cpu_s(learner.pid), time.time()
        time.sleep(args.window)
        c1, cpu1, t1 = counts(files), cpu_s(learner.pid), time.time()
    finally:
        for p in fleets:
            p.terminate()
        learner.terminate()
        for p in [*fleets, learner]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    dt = t1 - t0
    d = {k: c1.get(k, 0) - c0.get(k, 0) for k in c1}
    messages = sum(v for k, v in d.items() if k.startswith("recv_") or k.endswith("_sent"))
    cpu = cpu1 - cpu0
    return {
        "actors": n,
        "mode": mode,
        "window_s": dt,
        "offered_groups_per_s": d.get("rollouts_sent", 0) / dt,
        "accepted_groups_per_s": d.get("ack_accepted", 0) / dt,
        "tickets_per_s": d.get("tickets", 0) / dt,
        "heartbeats_per_s": d.get("heartbeats_sent", 0) / dt,
        "messages_per_s": messages / dt,
        "learner_cpu": cpu / dt,
        "cpu_ms_per_message": 1000 * cpu / max(messages, 1),
        "steps_per_s": steps(work / "run" / "metrics.jsonl", t0, t1) / dt,
        "acks": {k: v for k, v in d.items() if k.startswith("ack_")},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--actors", default="8,32,128,256")
    p.add_argument("--modes", default="control,train")
    p.add_argument("--latency", type=float, default=1.0, help="simulated seconds per group played")
    p.add_argument("--warmup", type=float, default=25.0)
    p.add_argument("--window", type=float, default=30.0)
    p.add_argument("--out", type=Path, default=Path("/tmp/control_plane"))
    args = p.parse_args()
    from agentgym.models.tiny import make_default_tiny_model

    model = make_default_tiny_model(args.out / "tiny", seed=0).resolve()
    load = os.getloadavg()
    rows = []
    port = 17555
    for n in [int(x) for x in args.actors.split(",")]:
        for mode in args.modes.split(","):
            port += 2
            row = run_one(n, mode, model, args, args.out / f"{mode}-{n}", port)
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "control_plane.json").write_text(
        json.dumps(
            {
                "rows": rows,
                "loadavg_before": load,
                "loadavg_after": os.getloadavg(),
                "latency_s": args.latency,
                "window_s": args.window,
            },
            indent=2,
        )
    )
    print(
        "\n| N | learner | offered groups/s | accepted groups/s | tickets/s | heartbeats/s | messages/s | learner CPU (s/s) | CPU ms/message | steps/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['actors']} | {r['mode']} | {r['offered_groups_per_s']:.1f} | {r['accepted_groups_per_s']:.1f} | {r['tickets_per_s']:.1f} | "
            f"{r['heartbeats_per_s']:.1f} | {r['messages_per_s']:.0f} | {r['learner_cpu']:.2f} | {r['cpu_ms_per_message']:.2f} | {r['steps_per_s']:.2f} |"
        )
    print(f"\nload average before {load}, after {os.getloadavg()}, {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
