"""The learner's bounded state: the dedupe set keeps a watermark per learner life instead of every
id, and the ticket journal folds settled tickets into counts; both keep answering exactly as
the unbounded versions did."""

from __future__ import annotations

import json
import random
from pathlib import Path

from agentgym.learner.control.dedupe import SeenSet
from agentgym.learner.records.accounting import TicketLedger
from agentgym.protocol import Ticket


def test_the_seen_set_answers_as_a_set_and_keeps_only_the_tickets_in_flight() -> None:
    seen, plain = SeenSet(), set()
    rng = random.Random(0)
    order = list(range(5000))
    for i in range(0, 5000, 50):  # answered out of order within a window, as tickets in flight are
        rng.shuffle(w := order[i : i + 50])
        order[i : i + 50] = w
    for n in order[:-3]:
        seen.add(f"run:{n}")
        plain.add(f"run:{n}")
    assert all((f"run:{n}" in seen) == (f"run:{n}" in plain) for n in range(5100))
    assert len(seen) <= 50  # the watermark holds the rest
    for g in ("run:eval3:guess_number:1", "other"):
        seen.add(g)
        assert g in seen
    seen.discard("run:10")  # a resume re-opens one ticket below the watermark
    assert "run:10" not in seen and "run:9" in seen and "run:11" in seen
    back = SeenSet.load(json.loads(json.dumps(seen.state())))
    assert all((f"run:{n}" in back) == (f"run:{n}" in seen) for n in range(5100))
    old = SeenSet.load(sorted(plain))  # a checkpoint written before: a list of ids
    assert all((f"run:{n}" in old) == (f"run:{n}" in plain) for n in range(5100)) and len(old) <= 50


def test_a_resumed_life_numbers_on_and_other_ids_stay_bounded() -> None:
    seen = SeenSet()
    seen.start("life2", 700)
    for n in range(700, 800):
        seen.add(f"life2:{n}")
    assert len(seen) == 0 and "life2:799" in seen and "life2:800" not in seen
    for i in range(SeenSet.OTHER_KEEP + 10):
        seen.add(f"r:eval{i}:env:0")
    assert len(seen) == SeenSet.OTHER_KEEP and "r:eval0:env:0" not in seen


def test_a_compacted_journal_resumes_and_sums_like_the_full_one(tmp_path: Path) -> None:
    def run(compact: bool, path: Path) -> tuple[dict, list[str]]:
        led = TicketLedger(path)
        tickets = [Ticket(group_id=f"r:{n}", env="e", task_id=n) for n in range(60)]
        led.issued(tickets)
        for step in range(1, 6):  # 8 trained per step, one stale, one invalid
            base = (step - 1) * 10
            led.trained([f"r:{n}" for n in range(base, base + 8)], step)
            led.judged(f"r:{base + 8}", "stale")
            led.judged(f"r:{base + 9}", "invalid")
            if compact:
                led.compact(keep_from_step=step - 2)  # the oldest checkpoint kept
        led.judged("r:50", "accepted")
        led.close()
        again = TicketLedger(path)
        reopened = again.resume(checkpoint_step=4)
        return again.summary([], [t.group_id for t in reopened]), [t.group_id for t in reopened]

    full, reopened_full = run(False, tmp_path / "full.jsonl")
    small, reopened_small = run(True, tmp_path / "small.jsonl")
    assert reopened_small == reopened_full  # step 5's groups, the buffered one, those in flight
    assert small == full and small["unaccounted"] == 0 and small["issued"] == 60
    assert (tmp_path / "small.jsonl").stat().st_size < (tmp_path / "full.jsonl").stat().st_size / 2
