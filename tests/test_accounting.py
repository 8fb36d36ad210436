"""The ticket journal (learner/records/accounting.py) on its own: the identity over fates, and what a
resume re-opens, replayed from the file a killed learner left behind."""

from __future__ import annotations

from pathlib import Path

from agentgym.learner.records.accounting import TicketLedger, format_table
from agentgym.protocol import Ticket


def tickets(n: int, run: str = "r1") -> list[Ticket]:
    return [Ticket(group_id=f"{run}:{i}", env="guess_number", task_id=i) for i in range(n)]


def test_identity_and_resume_reopen(tmp_path: Path) -> None:
    path = tmp_path / "tickets.jsonl"
    a = TicketLedger(path)
    ts = tickets(8)
    a.issued(ts)
    a.issued(ts[:1])  # a re-issue of a lost actor's ticket: the same id, not a new ticket
    a.issued([Ticket(group_id="r1:eval0:g:0", env="g", task_id=0, split="test")])  # not a training ticket
    for g, status in [
        ("r1:0", "accepted"),
        ("r1:1", "accepted"),
        ("r1:2", "accepted"),
        ("r1:3", "stale"),
        ("r1:4", "invalid"),
        ("r1:0", "duplicate"),
        ("zz:9", "accepted"),
    ]:
        a.judged(g, status)
    a.trained(["r1:0"], step=1)
    a.trained(["r1:1"], step=2)
    s = a.summary(buffered=["r1:2"], in_flight=["r1:5", "r1:6", "r1:0"])
    assert (s["issued"], s["trained"], s["stale"], s["invalid"], s["untrained_at_end"]) == (8, 2, 1, 1, 1)
    assert s["in_flight_at_end"] == 2 and s["unaccounted"] == 1  # r1:7: nobody holds it
    assert s["accepted_not_buffered"] == 0 and s["reissued"] == 1 and s["unissued_arrivals"] == {"accepted": 1}
    assert "unaccounted" in format_table(s)
    a.close()  # a SIGKILLed learner would not even get here; the lines are already written

    # A new learner resumes from the step-1 checkpoint: r1:1 was trained after it, r1:2 was
    # buffered, r1:5..7 in flight; r1:0 (trained at 1), r1:3 (stale), r1:4 (invalid) stay settled.
    with path.open("a") as f:
        f.write('{"e":"trai')  # a torn last line
    b = TicketLedger(path)
    reopened = b.resume(checkpoint_step=1)
    assert [t.group_id for t in reopened] == ["r1:1", "r1:2", "r1:5", "r1:6", "r1:7"]
    assert dict(b.lost_in_restart) == {"trained_after_checkpoint": 1, "buffered": 1, "in_flight": 3}
    b.judged("r1:1", "accepted")
    b.trained(["r1:1", "r1:2"], step=2)
    s = b.summary(buffered=[], in_flight=[t.group_id for t in reopened[2:]])
    assert (s["issued"], s["trained"], s["in_flight_at_end"], s["unaccounted"]) == (8, 3, 3, 0)
    b.close()
    # A third life resumed from step 2 re-opens only what is still open.
    c = TicketLedger(path)
    assert [t.group_id for t in c.resume(checkpoint_step=2)] == ["r1:5", "r1:6", "r1:7"]
    # lost_in_restart is the run's total over every resume
    assert dict(c.lost_in_restart) == {"trained_after_checkpoint": 1, "buffered": 1, "in_flight": 6}
