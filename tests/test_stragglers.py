"""Stragglers against a live learner process: a heartbeating actor that holds its tickets and
never answers, and an honest actor ten times slower than the others (3 s a group against 0.3 s).
Training keeps stepping to the end in both, every ticket is accounted for in ``summary.json``, and
the slow actor's late answers are acknowledged ``duplicate`` and counted, never lost.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq
from scripted_actor import LiveLearner, ScriptedActor

GROUP = 2


@pytest.fixture(scope="module")
def model_dir(fallback_model: Path) -> Path:
    return fallback_model  # tests/conftest.py


def accounted(summary: dict) -> None:
    t = summary["tickets"]
    assert t["unaccounted"] == 0 and t["accepted_not_buffered"] == 0, t


def test_a_heartbeating_hoarder_never_stalls_training(model_dir: Path, tmp_path: Path) -> None:
    steps = 8
    # max_staleness 0: the staleness rule admits one batch (2 tickets) at a time, so the hoarder's
    # tickets are the whole pipeline: without deadlines not one step would be trained.
    with LiveLearner(
        model_dir,
        tmp_path,
        steps,
        "learner.max_staleness=0",
        "learner.ticket_deadline_min_s=0.5",
        "learner.ticket_deadline_max_s=2",
    ) as ln:
        ctx = zmq.Context()
        # The hoarder comes first and asks for everything: before anyone has answered, it gets
        # grant_start tickets with the cap as deadline, and never any more.
        hoarder = ScriptedActor(
            ctx, ln.addr, "hoarder", delay_s=None, fingerprint=ln.fingerprint, group_size=GROUP, max_groups=64
        )
        while not hoarder.welcomed:
            hoarder.step(50)
        honest = ScriptedActor(ctx, ln.addr, "honest", delay_s=0.02, fingerprint=ln.fingerprint, group_size=GROUP)
        try:
            summary = ln.run([hoarder, honest])
        finally:
            hoarder.close()
            honest.close()
            ctx.term()
        assert summary["reason"] == "run finished" and summary["step"] == steps
        assert 1 <= len({t.group_id for t in hoarder.granted}) <= 2, hoarder.granted  # learner.grant_start
        t = summary["tickets"]
        assert t["deadline_reissued"] >= len({g.group_id for g in hoarder.granted}) and t["late_answers"] == 0, t
        assert {g.group_id for g in hoarder.granted} <= set(honest.sent)  # its tickets were played by another
        accounted(summary)
        assert "ticket_overdue" in ln.text()


def test_an_actor_ten_times_slower_is_counted_not_lost_and_training_keeps_stepping(
    model_dir: Path, tmp_path: Path
) -> None:
    steps = 12
    # max_staleness 0: each step waits for its own two tickets, so a ticket the slow actor holds
    # holds up the step until its deadline passes.
    with LiveLearner(
        model_dir,
        tmp_path,
        steps,
        "learner.max_staleness=0",
        "learner.ticket_deadline_min_s=0.3",
        "learner.ticket_deadline_max_s=5",
        "learner.ticket_deadline_factor=2",
    ) as ln:
        ctx = zmq.Context()
        # 0.3 s and 3 s a group: the learner times a fast actor's turnaround as its delay plus the
        # learner's and the poll loop's latency, which a loaded machine stretches, and the slow
        # actor's first deadline is twice the fast ones' turnaround. Against 0.1 s and 1 s that
        # latency alone could let the slow actor's first answers arrive in time (none overdue).
        fast = [
            ScriptedActor(ctx, ln.addr, f"fast{i}", delay_s=0.3, fingerprint=ln.fingerprint, group_size=GROUP)
            for i in range(2)
        ]
        made: list[ScriptedActor] = []

        def slow() -> ScriptedActor:  # joins once the fast ones have answered: its first deadline is theirs
            made.append(ScriptedActor(ctx, ln.addr, "slow", delay_s=3.0, fingerprint=ln.fingerprint, group_size=GROUP))
            return made[0]

        try:
            summary = ln.run(list(fast), join={2: slow})
            for a in [*fast, *made]:  # what was still on the way when the learner finished
                a.step(200)
        finally:
            for a in [*fast, *made]:
                a.close()
            ctx.term()
        assert summary["reason"] == "run finished" and summary["step"] == steps
        (s,) = made
        t = summary["tickets"]
        assert t["deadline_reissued"] >= 1 and t["late_answers"] >= 1, (t, s.statuses, s.sent, ln.text()[-2000:])
        assert s.statuses["duplicate"] >= 1 and summary["groups"]["duplicate"] >= t["late_answers"]
        acked_late = [g for g in s.sent if s.acks.get(g) == "duplicate"]
        assert all(g in {x for a in fast for x in a.sent} for g in acked_late)  # its copy was played by another first
        assert s.statuses["accepted"] >= 1  # once timed, its own deadlines fit it: its groups are trained
        accounted(summary)
