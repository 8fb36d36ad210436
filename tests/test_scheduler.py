"""Ticket scheduling: capacity, the staleness admission rule, sync rounds, re-issue of lost work."""

from __future__ import annotations

from collections import Counter

import pytest

from agentgym.config import EnvSpec
from agentgym.learner.scheduler import Scheduler


def make(mode: str = "async", batch: int = 4, staleness: int = 1, envs: list[EnvSpec] | None = None) -> Scheduler:
    envs = envs or [EnvSpec(name="guess_number", task_start=100, task_count=50)]
    return Scheduler(envs=envs, batch_groups=batch, max_staleness=staleness, mode=mode, run_id="r", seed=0)


def test_async_admission_bounds_tickets_by_version_and_staleness() -> None:
    s = make(batch=4, staleness=1)
    s.register("a", b"a", "h", max_groups=100)
    granted = s.fill(version=0)["a"]
    # ticket n is admissible while n // 4 <= 0 + 1: tickets 0..7
    assert len(granted) == 8
    assert s.fill(version=0) == {}
    assert len(s.fill(version=1)["a"]) == 4  # one more version: one more batch
    assert all(100 <= t.task_id < 150 and t.min_version == -1 for t in granted)


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
    import agentgym.learner.scheduler as mod

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
        make(envs=[]) if False else Scheduler(envs=[], batch_groups=1, max_staleness=0, mode="async", run_id="r", seed=0)


def test_eval_tickets_go_first_outside_the_staleness_rule_and_name_split_indexes() -> None:
    envs = [EnvSpec(name="a"), EnvSpec(name="b")]
    s = make(batch=2, staleness=0, envs=envs)
    s.register("x", b"x", "h", max_groups=3)
    assert len(s.fill(version=0)["x"]) == 2  # training tickets up to the admission bound
    made = s.eval_round(version=0, split="test", tasks=3)
    assert [(t.env, t.task_id, t.split, t.min_version) for t in made] == [
        ("a", 0, "test", 0), ("a", 1, "test", 0), ("a", 2, "test", 0),
        ("b", 0, "test", 0), ("b", 1, "test", 0), ("b", 2, "test", 0),
    ]  # fmt: skip
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
