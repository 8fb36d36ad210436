"""The learner's service state over a long run: does what goes into every checkpoint (and the ticket
journal beside it) grow with the step count?

    python bench/checkpoint_growth.py [--steps 10000] [--actors 4] [--out /tmp/growth.json]

Drives the learner's own control side (``learner.service.Learner`` without a trainer: the
scheduler, the ticket guard, the dedupe set, the ticket journal) with simulated actors on one
thread: each step they answer every ticket they hold with a valid group (a few stale, invalid
or failed, some answered twice, one actor ten times slower so deadlines fire), the step takes
``batch_groups`` groups from the buffer as ``train_loop`` does, and every ``checkpoint_every``
steps the service state is serialised as the checkpoint holds it and the journal compacted as
``Learner.checkpoint`` does. Prints the checkpoint's service-state bytes (and what its dedupe list of every answered
id would be), the journal's bytes and the ledger's tickets held, every 2000 steps (and at 100,
1000, 5000), and writes them to --out; ``--no-compact`` leaves the journal whole.
No torch step runs: the measure is of the bookkeeping, which is all that grows.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Hub:
    """What the service sends, dropped (acks and grants are read from the scheduler's state)."""

    def send(self, peer: bytes, msg: object) -> None:
        pass

    def ack(self, peer: bytes, group_id: str, status: str) -> None:
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--actors", type=int, default=4)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--no-compact", action="store_true", help="leave the journal whole (for the comparison)")
    p.add_argument("--out", type=Path, default=Path("/tmp/checkpoint_growth.json"))
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from learner_fixtures import GOOD, PROMPTS, episode, make_cfg

    from agentgym.learner.service import Learner
    from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model
    from agentgym.protocol import Rollout

    work = Path(tempfile.mkdtemp(prefix="growth-"))
    model = make_tiny_model(work / "model", corpus=FALLBACK_CORPUS, seed=0)
    group = 2
    cfg = make_cfg(
        model,
        f"rollout.group_size={group}",
        "learner.batch_groups=8",
        "learner.max_staleness=2",
        "learner.ticket_deadline_min_s=0.005",
        "learner.ticket_deadline_max_s=0.005",
    )
    ln = Learner(cfg, work / "run", trainer=None, hub=Hub())
    rng = random.Random(0)
    names = [f"sim{i}" for i in range(args.actors)]
    for a in names:
        ln.sched.register(a, a.encode(), "h", 8, session=a)
    ln.control.grant()
    rows, t0 = [], time.monotonic()
    known: dict = {}  # tickets the actors were granted, by group id
    for step in range(1, args.steps + 1):
        for a in names:
            state = ln.sched.actors[a]
            if a == names[-1] and step % 10:  # the slow one answers one step in ten
                continue
            known.update(state.outstanding)
            late = [known.pop(g) for g in list(state.late) if g in known]  # still played: answered late
            for t in [*state.outstanding.values(), *late]:
                status = rng.random()
                token = GOOD if status > 0.02 else 10**9  # 2% invalid (out of the vocabulary)
                eps = [
                    episode(
                        PROMPTS[i % 2],
                        [[token]],
                        [float(i % 2)],
                        version=max(0, ln.version - (status < 0.01) * 9),
                        behav=[-0.7],
                    )
                    for i in range(group)
                ]
                r = Rollout(group_id=t.group_id, actor_id=a, env=t.env, task_id=t.task_id, episodes=eps)
                ln.control.on_rollout(a.encode(), r)
                if status > 0.97:
                    ln.control.on_rollout(a.encode(), r)  # a re-sent copy: a duplicate
        ln.sched.overdue()  # the slow actor's tickets pass their (5 ms) deadline: copies go to others
        ln.control.grant()
        batch = ln.buffer.take(min(len(ln.buffer), cfg.learner.batch_groups))
        ln.ledger.trained([r.group_id for r in batch], step)
        ln.step = step
        ln.sched.on_version(step)
        ln.expire_stale()
        ln.control.grant()
        if step % args.checkpoint_every == 0:
            state = json.dumps(ln.checkpoint_state())
            if not args.no_compact:
                ln.ledger.compact(max(0, step - 2 * args.checkpoint_every))  # the oldest of 3 kept
            if step in (100, 1000, 5000, args.steps) or step % 2000 == 0:
                rows.append(
                    {
                        "step": step,
                        "checkpoint_state_bytes": len(state),
                        "journal_bytes": ln.ledger.path.stat().st_size,
                        "ledger_tickets": len(ln.ledger.tickets),
                        "seen_kept": len(ln.control.seen),
                        # what the dedupe state was before it was compacted: every answered id
                        "seen_as_id_list_bytes": len(json.dumps([f"{ln.run_id}:{n}" for n in range(ln.sched.issued)])),
                        "issued": ln.sched.issued,
                        "late_answers": ln.sched.late_answers,
                        "seconds": round(time.monotonic() - t0, 1),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    ln.ledger.close()
    args.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
