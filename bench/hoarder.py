"""A hoarding peer against a training run: the learner's step rate with the peer, over its rate
without it (the same run, one or more honest actors).

    python bench/hoarder.py [--warmup 60] [--window 90] [--engine hf] [--peer-after STEPS] [--honest 1,2] [--out /tmp/hoarder]

Each condition starts a learner on the quickstart config (tiny model, no evaluation, no
checkpoints, one turn limit, ``schedule.turn_limits = [[0, 6]]``, so that the horizon does not
change mid-measure, a run too long to end) and ``--honest`` honest actor processes
(``agentgym.actors.main``, the HF engine; ``--engine vllm`` for the quickstart's); ``--honest 1,2``
measures both counts, each with and without the peer, in one invocation. With the peer, a scripted actor registers
with the model's fingerprint, asks for ``max_groups=64``, heartbeats every 0.5 s and never
answers a ticket: a hoarder, or a hung engine behind a live heartbeat. It registers before the
honest actor starts, or with ``--peer-after STEPS`` once the learner has made STEPS optimizer
steps: the honest actor has then answered groups, so the peer's tickets get the deadline derived
from its turnaround instead of the cap (``learner.ticket_deadline_max_s``). The learner's
optimizer steps are counted over ``--window`` seconds (its metrics.jsonl), ``--warmup`` seconds
after its first step (after STEPS steps with ``--peer-after``, in both conditions). Prints and
writes OUT/hoarder.json: steps/s per condition, their ratio (the target is >= 0.8), how many
tickets the peer was granted, how many tickets the learner issued again past their deadline,
and the seconds from the peer's registration to its first missed deadline. ``--scripted S``
replaces the honest actor by a scripted one (tests/scripted_actor.py) answering each group
after S seconds: the engine's CPU is then out of the measure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from procs import learner_overrides, start_learner  # noqa: E402


def hoard(addr: str, fingerprint: str, stop: threading.Event, got: list[int]) -> None:
    import zmq

    from agentgym.protocol import Grant, Heartbeat, Hello, decode, encode

    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.ROUTING_ID, b"hoarder")
    s.setsockopt(zmq.LINGER, 0)
    s.connect(addr)
    s.send_multipart(
        encode(
            Hello(
                actor_id="hoarder",
                hostname="bench",
                pid=os.getpid(),
                model_fingerprint=fingerprint,
                engine="none",
                max_groups=64,
                session="hoarder",
            )
        )
    )
    try:
        while not stop.is_set():
            while s.poll(500):
                msg = decode(s.recv_multipart())[0]
                if isinstance(msg, Grant):
                    got[0] += len(msg.tickets)
            s.send_multipart(encode(Heartbeat(actor_id="hoarder", weight_version=0, stats={"capacity": 64.0})))
    finally:
        s.close(0)
        ctx.term()


def wait_steps(metrics: Path, n: int, timeout_s: float, procs: list[subprocess.Popen]) -> float:
    """Wait until the learner has logged ``n`` optimizer steps; the time then."""
    t_end = time.time() + timeout_s
    while len(step_times(metrics)) < n:
        if time.time() > t_end or any(p.poll() is not None for p in procs):
            raise SystemExit(f"hoarder bench: {n} steps not reached in {timeout_s:.0f} s (see {metrics.parent.parent})")
        time.sleep(0.5)
    return time.time()


def overdue_events(log: Path, actor_id: str) -> list[float]:
    """Unix times of the learner's ``ticket_overdue`` events for ``actor_id`` (its JSON log)."""
    from datetime import datetime

    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        if e.get("event") == "ticket_overdue" and e.get("actor_id") == actor_id:
            out.append(datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp())
    return out


def step_times(metrics: Path) -> list[tuple[float, dict]]:
    if not metrics.exists():
        return []
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [(r["time"], r) for r in recs if "tickets_in_flight" in r and "time" in r]


def _start_actor(
    addr: str, model: Path, work: Path, overrides: list[str], args: argparse.Namespace, index: int = 0
) -> subprocess.Popen:
    """Honest actor ``index`` (a real one on ``args.engine``, or a scripted one), its log in ``work``."""
    name = "actor" if index == 0 else f"actor{index}"
    if args.scripted is None:
        actor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentgym.actors.main",
                "--config",
                str(ROOT / "configs/quickstart.toml"),
                "--learner",
                addr,
                "--model",
                str(model),
                "--run-dir",
                str(work / name),
                "--actor-id",
                f"honest-{index}",
                *[a for o in [*overrides, f'actor.engine="{args.engine}"'] for a in ("-o", o)],
            ],
            cwd=ROOT,
            stdout=open(work / f"{name}.log", "w"),
            stderr=subprocess.STDOUT,
        )
    else:  # a scripted honest actor in a process of its own: the engine's CPU out of the measure
        actor = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--play", addr, str(model), str(args.scripted), str(index)],
            cwd=ROOT,
            stdout=open(work / f"{name}.log", "w"),
            stderr=subprocess.STDOUT,
        )
    return actor


def run(with_peer: bool, model: Path, port: int, work: Path, args: argparse.Namespace, honest: int = 1) -> dict:
    from agentgym.config import model_fingerprint

    work.mkdir(parents=True, exist_ok=True)
    addr = f"tcp://127.0.0.1:{port}"
    turns = ["schedule.turn_limits=[[0, 6]]"]
    learner = start_learner(model, work, addr, turns)
    overrides = learner_overrides(model, turns)  # the actors take the learner's, so both agree on the run
    stop, got = threading.Event(), [0]
    peer, peer_t = None, None
    if with_peer:
        peer = threading.Thread(target=hoard, args=(addr, model_fingerprint(model), stop, got), daemon=True)
    if peer is not None and not args.peer_after:  # first in line, before the honest actor has answered anything
        peer.start()
        peer_t = time.time()
        time.sleep(3)
    actors = [_start_actor(addr, model, work, overrides, args, i) for i in range(honest)]
    metrics = work / "run" / "metrics.jsonl"
    try:
        wait_steps(metrics, max(1, args.peer_after), args.start_timeout, [*actors, learner])
        if peer is not None and args.peer_after:  # the honest actor has answered: deadlines are its own
            peer.start()
            peer_t = time.time()
        time.sleep(args.warmup)
        t0 = time.time()
        time.sleep(args.window)
        t1 = time.time()
    finally:
        stop.set()
        for p in (*actors, learner):
            p.terminate()
        for p in (*actors, learner):
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        if peer is not None:
            peer.join(5)
    recs = step_times(metrics)
    window = [r for t, r in recs if t0 <= t <= t1]
    last = recs[-1][1] if recs else {}
    overdue = overdue_events(work / "run" / "logs" / "learner.jsonl", "hoarder")
    return {
        "peer": with_peer,
        "honest": honest,
        "steps_in_window": len(window),
        "steps_per_s": len(window) / (t1 - t0),
        "peer_tickets": got[0],
        "deadline_reissued": last.get("tickets_deadline_reissued", 0),
        "late_answers": last.get("late_answers", 0),
        "steps_total": len(recs),
        "peer_overdue": len(overdue),
        "peer_first_deadline_s": round(overdue[0] - peer_t, 1) if overdue and peer_t else None,
    }


def play(addr: str, model: str, delay_s: float, index: int = 0) -> int:
    """Scripted honest actor ``index`` (tests/scripted_actor.py): 8 groups at once, each after delay_s."""
    sys.path.insert(0, str(ROOT / "tests"))
    import zmq
    from scripted_actor import ScriptedActor

    from agentgym.config import model_fingerprint

    ctx = zmq.Context()
    a = ScriptedActor(
        ctx,
        addr,
        f"honest-{index}",
        delay_s=delay_s,
        fingerprint=model_fingerprint(Path(model)),
        group_size=8,
        max_groups=8,
    )
    while True:
        a.step(10)


def main() -> int:
    if len(sys.argv) == 6 and sys.argv[1] == "--play":
        return play(sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--warmup", type=float, default=60.0)
    p.add_argument("--window", type=float, default=90.0)
    p.add_argument("--engine", default="hf", help="the honest actor's engine (hf on a CPU, vllm on a GPU)")
    p.add_argument(
        "--scripted",
        type=float,
        metavar="SECONDS",
        help="a scripted honest actor that answers each group after SECONDS instead of a real one "
        "(what is measured is then the scheduling alone, on a loaded machine)",
    )
    p.add_argument(
        "--peer-after",
        type=int,
        default=0,
        metavar="STEPS",
        help="register the peer once the learner has made STEPS steps (0: before the honest actor starts)",
    )
    p.add_argument(
        "--start-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for the first steps (an engine's start on a loaded machine)",
    )
    p.add_argument("--honest", default="1", help="honest actor counts to measure, comma-separated (e.g. 1,2)")
    p.add_argument("--out", type=Path, default=Path("/tmp/hoarder"))
    args = p.parse_args()
    counts = [int(n) for n in args.honest.split(",") if n.strip()]
    if not counts or min(counts) < 1:
        p.error(f"--honest: counts of at least 1 actor, comma-separated; got {args.honest!r}")
    from agentgym.host.netutil import free_port_pair
    from agentgym.models.tiny import make_default_tiny_model

    model = make_default_tiny_model(args.out / "tiny", seed=0).resolve()
    rows = [
        run(peer, model, free_port_pair(), args.out / f"honest{n}" / ("with_peer" if peer else "alone"), args, n)
        for n in counts
        for peer in (False, True)
    ]
    ratios = {n: rows[2 * i + 1]["steps_per_s"] / max(rows[2 * i]["steps_per_s"], 1e-9) for i, n in enumerate(counts)}
    out = {
        "rows": rows,
        "ratio": ratios[counts[0]],
        "ratios": {str(n): r for n, r in ratios.items()},
        "load": os.getloadavg(),
        "warmup_s": args.warmup,
        "window_s": args.window,
        "engine": "scripted" if args.scripted is not None else args.engine,
        "peer_after": args.peer_after,
    }
    for r in rows:
        print(
            f"honest={r['honest']}  peer={r['peer']!s:5}  steps/s={r['steps_per_s']:.3f}  ({r['steps_in_window']} steps)  "
            f"peer tickets={r['peer_tickets']}  reissued past deadline={r['deadline_reissued']}  "
            f"peer's first deadline after {r['peer_first_deadline_s']} s"
        )
    for n, ratio in ratios.items():
        print(f"{n} honest actor(s): ratio (with / without) = {ratio:.2f}")
    print(f"load average {os.getloadavg()}")
    (args.out / "hoarder.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
