"""Ticket scheduling: capacity, the staleness admission rule, sync rounds, re-issue of lost work."""

from __future__ import annotations

from agentgym.learner.scheduler import Scheduler


def make(mode: str = "async", batch: int = 4, staleness: int = 1) -> Scheduler:
    return Scheduler(env="guess_number", task_start=100, task_count=50, batch_groups=batch,
                     max_staleness=staleness, mode=mode, run_id="r", seed=0)  # fmt: skip


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
    s.open_sync_round(0)
    first = s.fill(0)["a"]
    assert len(first) == 3 and {t.min_version for t in first} == {0}
    assert s.fill(0) == {}
    s.open_sync_round(1)
    assert {t.min_version for t in s.fill(1)["a"]} == {1}


def test_task_ids_are_deterministic_in_seed_and_ticket_number() -> None:
    a, b = make(), make()
    for s in (a, b):
        s.register("x", b"x", "h", max_groups=8)
    assert [t.task_id for t in a.fill(0)["x"]] == [t.task_id for t in b.fill(0)["x"]]
