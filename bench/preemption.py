"""Preempting an actor mid-episode: sampled tokens lost per preemption, and SIGTERM to exit.

    python bench/preemption.py --preemptions 3 --out /tmp/preemption

A real learner and two actors (``hf`` engine, the tiny model; agentgym.cmd_chaos.Scenario on
loopback) play long episodes: guess_number over 1..1000 (rarely guessed), ``--turns`` turns of up
to ``--tokens`` sampled tokens each. ``--preemptions`` times, one actor gets SIGTERM (Slurm's
scancel and preemption send it) ``--play-s`` seconds after it joined, while the run trains,
and a new one takes its place.

Per preemption, from the stopped actor's own counters (RUN/actors/ID.json) and the learner's log:
  - live: the sampled tokens of its live groups at SIGTERM. Before hand-over every one of them
    was lost (the groups were played again from the start), so this is "lost before";
  - lost: what is lost with hand-over: tokens of turns still sampling ``TURN_GRACE_S`` after
    SIGTERM, aborted (``sampled_tokens_dropped``), plus those of handed-over episodes whose
    replay diverged (none for built-in envs);
  - SIGTERM to exit (s), and the part of it spent reaching turn boundaries (``handover_ready``).
Prints one JSON line per preemption and a summary; ``--out`` keeps the run directory.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from agentgym.cmd_chaos import FAST, Scenario
from agentgym.logs import read_events
from agentgym.netns import Loopback
from agentgym.tiny_model import make_default_tiny_model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preemptions", type=int, default=3)
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--tokens", type=int, default=16, help="max sampled tokens per turn")
    p.add_argument("--play-s", type=float, default=60.0, help="seconds an actor plays before its SIGTERM")
    p.add_argument("--out", type=Path, help="work directory (default: a temporary one)")
    args = p.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="agentgym-preemption-"))
    model = make_default_tiny_model(work / "model" / "tiny", seed=0)
    overrides = [*FAST, "env.kwargs={low=1, high=1000}", f"schedule.turn_limits=[[0, {args.turns}]]",
                 f"rollout.max_tokens_per_turn={args.tokens}", "rollout.max_episode_tokens=1536", "rollout.group_size=4",
                 "learner.batch_groups=2", "learner.max_staleness=4", "run.max_steps=1000"]  # fmt: skip
    rows = []
    with Loopback(["learner", "a1", "a2"]) as net:
        sc = Scenario(net, work, model.resolve(), overrides)
        victim = sc.start_actor("a1")
        sc.start_actor("a2")
        sc.start_learner()
        sc.wait(lambda: sc.step() >= 1, 900, "a first step")
        for n in range(args.preemptions):
            joined = lambda v=victim: [e for e in sc.events("actor_joined") if e["actor_id"] == v]  # noqa: E731
            sc.wait(lambda: bool(joined()), 300, "the actor to join")
            time.sleep(args.play_s)  # it plays a while: its episodes are some turns in
            t0 = time.monotonic()
            sc.actors[victim].send_signal(15)
            code = sc.actors[victim].wait(timeout=300)
            exit_s = time.monotonic() - t0
            stats = json.loads((sc.actor_home / "a1" / "actors" / f"{victim}.json").read_text())
            ready = [e for e in read_events(sc.actor_home / "a1" / "logs" / f"actor-{victim}.jsonl", "handover_ready")]
            handed, dropped = stats.get("sampled_tokens_handed_over", 0), stats.get("sampled_tokens_dropped", 0)
            rows.append({"preemption": n, "code": code, "sigterm_to_exit_s": round(exit_s, 2),
                         "to_turn_boundaries_s": ready[-1]["seconds"] if ready else None,
                         "groups": stats.get("handover_groups", 0), "partial_episodes": stats.get("handover_partial", 0),
                         "finished_episodes": stats.get("handover_finished", 0),
                         "live_sampled_tokens": handed + dropped, "lost_before": handed + dropped, "lost_after": dropped})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            victim = sc.start_actor("a1")
        at = sc.step()
        sc.wait(lambda: sc.step() >= at + 2, 900, "2 more steps")  # the handed-over groups are played on
        resumed = sc.events("episode_resumed")
        received = sc.events("handover_received")
        diverged = sum(len(e["prefixes"]) for e in received) - len(resumed)
    summary = {
        "preemptions": len(rows), "lost_before_mean": sum(r["lost_before"] for r in rows) / len(rows),
        "lost_after_mean": sum(r["lost_after"] for r in rows) / len(rows),
        "sigterm_to_exit_s": [r["sigterm_to_exit_s"] for r in rows],
        "to_turn_boundaries_s": [r["to_turn_boundaries_s"] for r in rows],
        "episodes_resumed": len(resumed), "partial_not_resumed_yet_or_diverged": diverged, "work": str(work),
    }  # fmt: skip
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
