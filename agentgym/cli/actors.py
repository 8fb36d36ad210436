"""``agentgym actors leave ACTOR_ID --run RUN_DIR``: ask one actor of a running learner to leave.

The learner (it reads RUN_DIR/requests/ once a heartbeat; learner/control/requests.py) sends that actor
a leave request; the actor leaves as on SIGTERM: its live episodes stop at a turn boundary and
are handed over in its Leave, its tickets go back to the pool, and it exits 0. The command waits
for the learner's answer, then for the actor's ``actor_left`` in RUN_DIR/logs/learner.jsonl.

Exit codes: 0 the actor left; 1 no such actor registered, or no answer or departure in time;
2 bad arguments (an id that cannot be a file name, a directory that is not a run's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser("actors", help="act on the actors of a running learner (leave)")
    asub = a.add_subparsers(dest="actors_cmd", required=True)
    lv = asub.add_parser(
        "leave",
        help="ask an actor to leave: it hands its live episodes over and exits",
        description=__doc__.split("\n\n")[1],
    )
    lv.add_argument("actor_id", help="the actor's id (the learner's actor_joined lines name it)")
    lv.add_argument("--run", type=Path, required=True, help="the learner's run directory (RUN_DIR)")
    lv.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the learner's answer and the actor's departure (default: 120)",
    )
    lv.add_argument("--no-wait", action="store_true", help="return once the learner has sent the request")


def _departures(run_dir: Path, actor_id: str) -> list[dict]:
    """The learner's ``actor_left`` records of this actor so far."""
    from agentgym.observe.logs import read_events

    return [e for e in read_events(run_dir / "logs" / "learner.jsonl", "actor_left") if e.get("actor_id") == actor_id]


def run(args: argparse.Namespace) -> int:
    from agentgym.learner.control.requests import ask_leave

    run_dir: Path = args.run
    if not (run_dir / "config.toml").is_file():
        print(
            f"agentgym actors leave: --run {run_dir} is not a learner's run directory (no config.toml)", file=sys.stderr
        )
        return 2
    before = len(_departures(run_dir, args.actor_id))
    try:
        done = ask_leave(run_dir, args.actor_id)
    except ValueError as exc:
        print(f"agentgym actors leave: {exc}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.timeout
    while not done.exists():
        if time.monotonic() > deadline:
            # Withdrawn: a learner started later must not act on a request nobody waits for.
            done.with_name(args.actor_id).unlink(missing_ok=True)
            print(
                f"agentgym actors leave: the learner of {run_dir} did not answer within {args.timeout:.0f} s "
                "(is it running? it reads requests once a heartbeat); the request is withdrawn",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.2)
    answer = json.loads(done.read_text())
    if answer.get("status") != "sent":
        print(
            f"agentgym actors leave: no actor {args.actor_id!r} is registered with the learner of {run_dir} "
            f"(registered: {', '.join(answer.get('actors', [])) or 'none'})",
            file=sys.stderr,
        )
        return 1
    print(f"asked actor {args.actor_id} to leave (it holds {answer.get('tickets', 0)} tickets)", flush=True)
    if args.no_wait:
        return 0
    while len(left := _departures(run_dir, args.actor_id)) <= before:
        if time.monotonic() > deadline:
            print(
                f"agentgym actors leave: actor {args.actor_id} has not left within {args.timeout:.0f} s",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.5)
    print(
        f"actor {args.actor_id} left: {left[-1].get('handed_over', 0)} groups handed over, "
        f"{left[-1].get('tickets_returned', 0)} tickets returned"
    )
    return 0
