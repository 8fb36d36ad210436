"""Preempting an actor mid-episode: sampled tokens lost per preemption with hand-over off and on,
and SIGTERM to exit.

    python bench/preemption.py --preemptions 3 --out /tmp/preemption        # off, then on
    python bench/preemption.py --modes on                                   # one mode only

For each mode (``actor.handover = false``, then ``true``; back to back, each a fresh run): a real
learner and two actors (``hf`` engine, the tiny model; agentgym.cluster.scenario.Scenario on loopback)
play long episodes: guess_number over 1..1000 (rarely guessed), ``--turns`` turns of up to
``--tokens`` sampled tokens each. ``--preemptions`` times, one actor (started with that mode) gets
SIGTERM (Slurm's scancel and preemption send it) ``--play-s`` seconds after it joined, while the
run trains, and a new one takes its place.

Per preemption, from the stopped actor's own counters (RUN/actors/ID.json), counted the same way
in both modes: ``lost`` = the tokens its engine sampled (``sampled_tokens``) less those it sent in
rollouts and those it handed over (its own tokens only: not a prefix it was handed). With hand-over
off that is every token of its live groups (their finished episodes too); with it on, the tokens
of turns still sampling ``TURN_GRACE_S`` after SIGTERM (aborted). A turn being sampled when a
hand-over-off actor is cancelled never leaves its engine and is not counted: "off" is a lower
bound. ``handed_over``: tokens carried to the next actor (on). Also SIGTERM to exit (s), and for
"on" the part of it spent reaching turn boundaries (``handover_ready``), and how many handed-over
episodes the learner saw continued (``episode_resumed``) or not yet/diverged.
Prints one JSON line per preemption and a summary per mode; ``--out`` keeps the run directories.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from agentgym.cluster.netns import Loopback
from agentgym.cluster.scenario import FAST, Scenario
from agentgym.models.tiny import make_default_tiny_model
from agentgym.observe.logs import read_events


def run_mode(handover: bool, args: argparse.Namespace, work: Path, model: Path) -> dict:
    mode = "on" if handover else "off"
    overrides = [
        *FAST,
        "env.kwargs={low=1, high=1000}",
        f"schedule.turn_limits=[[0, {args.turns}]]",
        f"rollout.max_tokens_per_turn={args.tokens}",
        "rollout.max_episode_tokens=1536",
        "rollout.group_size=4",
        "learner.batch_groups=2",
        "learner.max_staleness=4",
        "run.max_steps=1000",
    ]
    victim_cfg = [f"actor.handover={str(handover).lower()}"]
    rows = []
    with Loopback(["learner", "a1", "a2"]) as net:
        sc = Scenario(net, work / mode, model, overrides)
        victim = sc.start_actor("a1", victim_cfg)
        sc.start_actor("a2")
        sc.start_learner()
        sc.wait(lambda: sc.step() >= 1, 900, "a first step")
        for n in range(args.preemptions):
            joined = lambda v=victim: [e for e in sc.events("actor_joined") if e["actor_id"] == v]  # noqa: E731
            sc.wait(lambda joined=joined: bool(joined()), 300, "the actor to join")
            time.sleep(args.play_s)  # it plays a while: its episodes are some turns in
            t0 = time.monotonic()
            sc.actors[victim].send_signal(15)
            code = sc.actors[victim].wait(timeout=300)
            exit_s = time.monotonic() - t0
            stats = json.loads((sc.actor_home / "a1" / "actors" / f"{victim}.json").read_text())
            ready = read_events(sc.actor_home / "a1" / "logs" / f"actor-{victim}.jsonl", "handover_ready")
            rows.append(
                {
                    "mode": mode,
                    "preemption": n,
                    "code": code,
                    "sigterm_to_exit_s": round(exit_s, 2),
                    "to_turn_boundaries_s": ready[-1]["seconds"] if ready else None,
                    "sampled": stats.get("sampled_tokens", 0),
                    "sent": stats.get("sampled_tokens_sent", 0),
                    "handed_over": stats.get("sampled_tokens_handed_over", 0),
                    "lost": stats.get("sampled_tokens_lost", 0),
                    "aborted_turns_tokens": stats.get("sampled_tokens_dropped", 0),
                    "groups_handed_over": stats.get("handover_groups", 0),
                    "partial_episodes": stats.get("handover_partial", 0),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            victim = sc.start_actor("a1", victim_cfg)
        at = sc.step()
        sc.wait(lambda: sc.step() >= at + 2, 900, "2 more steps")  # the handed-over groups are played on
        resumed = sc.events("episode_resumed")
        received = sc.events("handover_received")
    n = len(rows)
    summary = {
        "mode": mode,
        "preemptions": n,
        "lost_mean": round(sum(r["lost"] for r in rows) / n, 1),
        "lost": [r["lost"] for r in rows],
        "handed_over": [r["handed_over"] for r in rows],
        "sigterm_to_exit_s": [r["sigterm_to_exit_s"] for r in rows],
        "to_turn_boundaries_s": [r["to_turn_boundaries_s"] for r in rows],
        "episodes_resumed": len(resumed),
        "partial_not_resumed_yet_or_diverged": sum(len(e["prefixes"]) for e in received) - len(resumed),
        "steps": sc.step(),
        "work": str(work / mode),
    }
    print(json.dumps(summary), flush=True)
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preemptions", type=int, default=3)
    p.add_argument("--modes", default="off,on", help="hand-over modes to run, in order (default: off,on)")
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--tokens", type=int, default=16, help="max sampled tokens per turn")
    p.add_argument("--play-s", type=float, default=60.0, help="seconds an actor plays before its SIGTERM")
    p.add_argument("--out", type=Path, help="work directory (default: a temporary one)")
    args = p.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in ("off", "on") for m in modes):
        p.error(f"--modes: expected a comma-separated list of off and on, got {args.modes!r}")
    work = args.out or Path(tempfile.mkdtemp(prefix="agentgym-preemption-"))
    model = make_default_tiny_model(work / "model" / "tiny", seed=0).resolve()
    summaries = [run_mode(m == "on", args, work, model) for m in modes]
    by = {s["mode"]: s["lost_mean"] for s in summaries}
    if by.get("off") and "on" in by:
        print(
            json.dumps(
                {"lost_mean_off": by["off"], "lost_mean_on": by["on"], "on_over_off": round(by["on"] / by["off"], 4)}
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
