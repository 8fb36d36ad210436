"""Ticket scheduling: capacity, the staleness admission rule, sync rounds, re-issue of lost work."""

from __future__ import annotations

from collections import Counter

import pytest

from agentgym.config import EnvSpec
from agentgym.learner.control.scheduler import Scheduler
from agentgym.protocol import Ticket


def make(
    mode: str = "async",
    batch: int = 4,
    staleness: int = 1,
    envs: list[EnvSpec] | None = None,
    grant_start: int = 10**6,
    **kw: float,
) -> Scheduler:
    """A scheduler; ``grant_start`` large: capacity alone limits grants unless a test says otherwise."""
    envs = envs or [EnvSpec(name="guess_number", task_start=100, task_count=50)]
    return Scheduler(
        envs=envs,
        batch_groups=batch,
        max_staleness=staleness,
        mode=mode,
        run_id="r",
        seed=0,
        grant_start=grant_start,
        **kw,
    )  # type: ignore[arg-type]  # the test's keywords, Scheduler's own


def test_async_admission_bounds_tickets_by_version_and_staleness() -> None:
    s = make(batch=4, staleness=1)
    s.register("a", b"a", "h", max_groups=100)
    granted = s.fill(version=0)["a"]
    # ticket n is admissible while n // 4 <= 0 + 1: tickets 0..7
    assert len(granted) == 8
    assert s.fill(version=0) == {}
    later = s.fill(version=1)["a"]
    assert len(later) == 4  # one more version: one more batch
    assert all(100 <= t.task_id < 150 for t in granted)
    # Each ticket's min_version keeps its tokens within K of the step it is trained at: the
    # first batch (trained at version 0) any weights, the second (version 1) at least version 0.
    assert [t.min_version for t in granted] == [-1] * 4 + [0] * 4
    assert [t.min_version for t in later] == [1] * 4  # trained at version 2


def test_capacity_is_respected_and_tickets_spread_over_actors() -> None:
    s = make(batch=100, staleness=0)
    s.register("a", b"a", "h", max_groups=3)
    s.register("b", b"b", "h", max_groups=2)
    grants = s.fill(0)
    assert len(grants["a"]) == 3 and len(grants["b"]) == 2
    assert s.fill(0) == {}
    t = grants["a"][0]
    assert s.complete("a", t.group_id) == t
    assert len(s.fill(0)["a"]) == 1


def test_tickets_of_a_lost_actor_are_reissued_first_and_duplicates_detected_by_id() -> None:
    s = make(batch=100)
    s.register("a", b"a", "h", max_groups=2)
    lost = s.fill(0)["a"]
    assert s.remove("a") == lost
    s.register("b", b"b", "h", max_groups=3)
    got = s.fill(0)["b"]
    assert got[:2] == lost and got[2] not in lost
    # the lost actor's copy arrives late: the ticket is no longer outstanding anywhere else
    assert s.complete("a", lost[0].group_id) is None
    assert s.complete("b", lost[0].group_id) == lost[0]


def test_expire_removes_silent_actors(monkeypatch) -> None:
    import agentgym.learner.control.scheduler as mod

    now = [1000.0]
    monkeypatch.setattr(mod.time, "monotonic", lambda: now[0])
    s = make()
    s.register("a", b"a", "h", max_groups=1)
    s.fill(0)
    now[0] += 5
    s.register("b", b"b", "h", max_groups=1)
    now[0] += 6
    dead = s.expire(timeout_s=10)
    assert [d.actor_id for d in dead] == ["a"] and list(s.actors) == ["b"]
    assert len(s.requeue) == 1


def test_sync_rounds_issue_exactly_one_batch_per_version() -> None:
    s = make(mode="sync", batch=3)
    s.register("a", b"a", "h", max_groups=10)
    assert s.fill(0) == {}  # no round open yet
    s.on_version(0)
    first = s.fill(0)["a"]
    assert len(first) == 3 and {t.min_version for t in first} == {0}
    assert s.fill(0) == {}
    s.on_version(1)
    assert {t.min_version for t in s.fill(1)["a"]} == {1}


def test_task_ids_are_deterministic_in_seed_and_ticket_number() -> None:
    a, b = make(), make()
    for s in (a, b):
        s.register("x", b"x", "h", max_groups=8)
    assert [t.task_id for t in a.fill(0)["x"]] == [t.task_id for t in b.fill(0)["x"]]


def test_tickets_draw_environments_by_weight_and_tasks_from_each_range() -> None:
    envs = [EnvSpec(name="a", task_start=0, task_count=10, weight=3), EnvSpec(name="b", task_start=1000, task_count=5)]
    s = make(batch=4000, staleness=0, envs=envs)
    s.register("x", b"x", "h", max_groups=4000)
    tickets = s.fill(version=0)["x"]
    counts = Counter(t.env for t in tickets)
    assert counts["a"] + counts["b"] == 4000
    assert 0.72 < counts["a"] / 4000 < 0.78  # weight 3 : 1
    assert {t.task_id for t in tickets if t.env == "a"} == set(range(10))
    assert {t.task_id for t in tickets if t.env == "b"} == set(range(1000, 1005))
    # the draw is a function of (seed, ticket number): a resumed scheduler repeats it
    again = make(batch=4000, staleness=0, envs=envs)
    again.register("x", b"x", "h", max_groups=4000)
    assert [(t.env, t.task_id) for t in again.fill(version=0)["x"]] == [(t.env, t.task_id) for t in tickets]


def test_scheduler_needs_an_environment() -> None:
    with pytest.raises(ValueError, match="no environment"):
        make(envs=[]) if False else Scheduler(
            envs=[], batch_groups=1, max_staleness=0, mode="async", run_id="r", seed=0
        )


def test_eval_tickets_go_first_outside_the_staleness_rule_and_name_split_indexes() -> None:
    envs = [EnvSpec(name="a"), EnvSpec(name="b")]
    s = make(batch=2, staleness=0, envs=envs)
    s.register("x", b"x", "h", max_groups=3)
    assert len(s.fill(version=0)["x"]) == 2  # training tickets up to the admission bound
    made = s.eval_round(version=0, split="test", tasks=3)
    assert [(t.env, t.task_id, t.split, t.min_version) for t in made] == [
        ("a", 0, "test", 0),
        ("a", 1, "test", 0),
        ("a", 2, "test", 0),
        ("b", 0, "test", 0),
        ("b", 1, "test", 0),
        ("b", 2, "test", 0),
    ]
    got = s.fill(version=0)["x"]
    assert [t.group_id for t in got] == [made[0].group_id]  # capacity 3: one slot was free
    assert s.in_flight == 3 + 5
    s.complete("x", made[0].group_id)
    assert s.fill(version=0)["x"] == [made[1]]
    assert s.issued == 2  # evaluation does not use up training tickets


def test_touch_all_forgives_silence_caused_by_the_learner_itself() -> None:
    import time

    s = make()
    s.register("a", b"a", "h", max_groups=1)
    s.actors["a"].last_seen -= 100
    s.touch_all()
    assert s.expire(timeout_s=30) == [] and "a" in s.actors
    s.actors["a"].last_seen = time.monotonic() - 100
    assert [d.actor_id for d in s.expire(timeout_s=30)] == ["a"]


def test_forfeited_tickets_free_their_place_so_lost_groups_never_stall_the_pipeline() -> None:
    s = make(batch=4, staleness=1)
    s.register("a", b"a", "h", max_groups=100)
    tickets = s.fill(version=0)["a"]
    assert len(tickets) == 8 and s.fill(version=0) == {}
    # Five of the eight come back rejected (stale, failed, ...): without forfeits only three could
    # ever be trained and version 0 would never get a batch of four.
    for t in tickets[:5]:
        s.complete("a", t.group_id)
        s.forfeit(t.group_id)
    assert len(s.fill(version=0)["a"]) == 5
    # Evaluation tickets and another run's groups are not this counter's.
    s.forfeit("r:eval0:guess_number:3")
    s.forfeit("other:12")
    assert s.forfeited == 5 and s.fill(version=0) == {}


def test_sync_round_replaces_a_forfeited_group() -> None:
    s = make(mode="sync", batch=3)
    s.register("a", b"a", "h", max_groups=10)
    s.on_version(0)
    tickets = s.fill(0)["a"]
    assert len(tickets) == 3 and s.fill(0) == {}
    s.complete("a", tickets[0].group_id)
    s.forfeit(tickets[0].group_id)  # e.g. every episode of it failed: the round would never fill
    again = s.fill(0)["a"]
    assert len(again) == 1 and again[0].min_version == 0 and s.fill(0) == {}


def test_a_ticket_past_its_deadline_is_issued_again_and_the_later_answer_is_late() -> None:
    s = make(batch=100, grant_start=1, deadline_min_s=10, deadline_max_s=60)
    s.register("hoarder", b"h", "h", max_groups=64)
    t = s.fill(0)["hoarder"][0]
    assert s.fill(0) == {}  # a new actor starts with grant_start tickets, whatever it asks
    _, deadline = s.actors["hoarder"].deadlines[t.group_id]
    assert s.overdue(deadline - 1) == []
    assert [x.group_id for _, x in s.overdue(deadline + 1)] == [t.group_id]
    assert s.overdue(deadline + 2) == []  # issued again once
    assert s.deadline_reissued == 1 and s.requeue[0] == t
    assert s.fill(0) == {}  # never back to the actor that missed it
    s.register("honest", b"o", "h", max_groups=4)
    assert s.fill(0)["honest"] == [t] and t.group_id in s.actors["hoarder"].outstanding
    assert s.in_flight == len({*s.actors["honest"].outstanding, *s.actors["hoarder"].outstanding})
    assert s.complete("honest", t.group_id) == t  # first answer
    hoarder = s.actors["hoarder"]
    assert hoarder.outstanding == {} and list(hoarder.late) == [t.group_id]
    assert "hoarder" not in s.fill(0)  # the late slot stays taken: nothing more for it
    assert s.complete("hoarder", t.group_id) is None and s.late_answers == 1
    assert hoarder.late == {} and hoarder.earned == 1 and hoarder.missed == 1


def test_the_late_holder_answering_first_wins_and_the_copy_becomes_late() -> None:
    s = make(batch=100, grant_start=1, deadline_min_s=1, deadline_max_s=5)
    s.register("slow", b"s", "h", max_groups=1)
    t = s.fill(0)["slow"][0]
    s.overdue(s.actors["slow"].deadlines[t.group_id][1] + 1)
    s.register("fast", b"f", "h", max_groups=4)  # grant_start 1: still one ticket at first
    assert s.fill(0)["fast"] == [t]
    assert s.complete("slow", t.group_id) == t
    assert s.actors["fast"].late.keys() == {t.group_id} and s.actors["slow"].turnaround_s is not None
    earned = s.actors["fast"].earned
    assert s.complete("fast", t.group_id) is None and s.late_answers == 1
    # In time by its own deadline, the copy's holder lost a race: it earns as an answer does (a
    # late joiner handed copies would otherwise never grow past grant_start).
    assert s.actors["fast"].earned == earned + 1


def test_deadlines_follow_the_measured_p95_turnaround_within_floor_and_cap() -> None:
    s = make(batch=1000, grant_start=8, deadline_factor=3, deadline_min_s=2, deadline_max_s=100)
    s.register("a", b"a", "h", max_groups=8)
    assert s.deadline_s(s.actors["a"]) == 100  # nobody has answered: the cap
    got = s.fill(0)["a"]
    t0 = s.actors["a"].deadlines[got[0].group_id][0]
    s.complete("a", got[0].group_id, now=t0 + 4)
    # its own p95 (one answer), which is also the fleet's
    assert s.deadline_s(s.actors["a"]) == 12
    s.register("b", b"b", "h", max_groups=4)
    assert s.deadline_s(s.actors["b"]) == 12  # a newcomer: the fleet's figure
    for g, took in zip(got[1:7], (1.0, 1.0, 1.0, 1.0, 1.0, 1.0), strict=True):
        s.complete("a", g.group_id, now=t0 + took)
    # 7 answers, 6 of 1 s and one of 4 s: the p95 (nearest rank) is the 4 s one
    assert s.deadline_s(s.actors["a"]) == 12
    for _ in range(64):  # the window (64) forgets the slower answers
        s.deadlines.observe("a", 0.5)
    assert s.deadline_s(s.actors["a"]) == 2  # 3 x 0.5 s, under the floor
    assert s.deadline_s(s.actors["b"]) == 3  # the fleet's p95: 1 s
    for _ in range(64):
        s.deadlines.observe("a", 1000)
    assert s.deadline_s(s.actors["a"]) == 100  # the cap


def test_an_actor_that_misses_a_deadline_loses_all_its_tickets_at_once_and_its_grant_shrinks() -> None:
    s = make(batch=1000, grant_start=2, deadline_min_s=2, deadline_max_s=100)
    s.register("a", b"a", "h", max_groups=8)
    held = s.fill(0)["a"]
    assert len(held) == 2
    t0 = s.actors["a"].deadlines[held[0].group_id][0]
    for t in held:
        s.complete("a", t.group_id, now=t0 + 1)
    got = s.fill(0)["a"]
    assert len(got) == 4  # +1 per group answered first, in time
    a = s.actors["a"]
    # One of them is granted later: its own deadline has not passed when the first ones' has.
    first_deadline = a.deadlines[got[0].group_id][1]
    a.deadlines[got[3].group_id] = (first_deadline, first_deadline + 50)
    missed = s.overdue(first_deadline + 0.5)
    assert {t.group_id for _, t in missed} == {t.group_id for t in got}  # all of them, at once
    assert [t.group_id for t in s.requeue] == [t.group_id for t in got] and s.deadline_reissued == 4
    assert a.earned == 2 and a.missed == 4  # what it answered (2), at most half of 4
    assert s.overdue(first_deadline + 60) == []  # issued again once


def test_an_actor_holds_no_more_than_its_share_of_the_pipeline_by_demonstrated_throughput() -> None:
    s = make(batch=8, staleness=2, grant_start=2)  # the rule admits 24 tickets
    for name in ("fast", "slow", "new"):
        s.register(name, b"x", "h", max_groups=24)
        s.actors[name].earned = 24
    assert s.limit(s.actors["slow"], 0) == 24  # nothing answered yet: capacity and earned decide
    for i in range(220):  # fast answered ten groups for each of slow's
        s._first("slow" if i % 11 == 0 else "fast")
    assert s.limit(s.actors["fast"], 0) == 24
    assert s.limit(s.actors["slow"], 0) == 5  # ceil(2 x 24 x 20/220)
    assert s.limit(s.actors["new"], 0) == 2  # no answer yet: grant_start


def test_an_actor_that_leaves_returns_only_tickets_not_already_issued_again() -> None:
    s = make(batch=100, grant_start=2, deadline_max_s=5)
    s.register("a", b"a", "h", max_groups=2)
    t1, t2 = s.fill(0)["a"]
    s.overdue(s.actors["a"].deadlines[t1.group_id][1] + 1)
    assert {t.group_id for t in s.requeue} == {t1.group_id, t2.group_id}  # both past the deadline
    s.requeue.remove(t2)
    s.actors["a"].deadlines[t2.group_id] = (0.0, 1e18)
    s._copies.pop(t2.group_id)  # t2 as if it were not late: t1's copy is still queued
    assert s.remove("a") == [t2] and list(s.requeue) == [t2, t1]


def test_one_key_one_identity_and_no_takeover_of_a_live_id_without_keys() -> None:
    s = make()
    assert s.identity_conflict("a", "KEY1", "") is None
    s.register("a", b"a", "h", max_groups=1)
    assert s.identity_conflict("a", "KEY2", "") == "actor_id_of_another_key"
    assert s.owned_by("a", "KEY1") and not s.owned_by("a", "KEY2") and s.owned_by("b", "KEY2")
    s.remove("a")
    assert s.identity_conflict("a", "KEY2", "") == "actor_id_of_another_key"  # gone, still its key's
    # without keys: the live id is refused to another process, its own reconnect is welcome
    s.register("b", b"b", "h", max_groups=1, session="s1")
    assert s.identity_conflict("b", "", "s1") is None
    assert s.identity_conflict("b", "", "s2") == "actor_id_in_use"
    assert s.identity_conflict("b", "", "") == "actor_id_in_use"
    s.remove("b")
    assert s.identity_conflict("b", "", "s2") is None


def test_tickets_reissued_after_a_restart_fill_the_pipeline_and_new_ones_wait_for_room() -> None:
    """A resumed learner issues the earlier life's open tickets again first (ADR 0010). They are
    the pipeline: async admits new tickets only as they are trained, so staleness stays within
    the bound; sync plays them in the next round instead of new ones."""
    old = [Ticket(group_id=f"old:{n}", env="guess_number", task_id=100 + n) for n in range(48, 60)]
    evals = [Ticket(group_id="old:eval12:guess_number:0", env="guess_number", task_id=0, split="test")]
    s = make(batch=4, staleness=2)
    s.issued = 60  # 12 versions trained 48 groups; 12 were buffered or in flight
    s.register("a", b"a", "h", max_groups=100)
    s.reissue([*old, *evals], version=12)
    assert s.live(12) == 12 and s.headroom(12) == 0
    first = s.fill(version=12)["a"]
    assert [t.group_id for t in first] == [t.group_id for t in [*old, *evals]]  # the rule admits no new one
    assert s.fill(version=12) == {}
    assert [t.min_version for t in s.fill(version=13)["a"]] == [13] * 4  # one batch trained: one batch of room
    s.forfeit("old:50")  # one of them comes back invalid: its place is free, once
    s.forfeit("old:50")
    s.forfeit("old:eval12:guess_number:0")
    assert [t.min_version for t in s.fill(version=13)["a"]] == [13]

    sync = make(mode="sync", batch=4)
    sync.issued = 6
    sync.register("a", b"a", "h", max_groups=100)
    sync.reissue(old[:3], version=1)
    sync.on_version(1)
    assert [t.group_id for t in sync.fill(1)["a"]] == ["old:48", "old:49", "old:50", "r:6"]  # one round of 4
    assert sync.fill(1) == {}
    sync.on_version(2)
    assert len(sync.fill(2)["a"]) == 4  # then whole rounds again
