"""Actors size their own in-flight work (actors/play/concurrency.py), the learner grants by it, and
env pools grow with it; the staleness rule (learner/control/staleness.py) says how much room there is."""

from __future__ import annotations

import asyncio

import pytest

from agentgym.actors.play.concurrency import Concurrency, Signals
from agentgym.config import EnvSpec
from agentgym.envpool.pool import EnvPool
from agentgym.learner.control.scheduler import Scheduler
from agentgym.learner.control.staleness import StalenessRule


def signals(busy: int, kv: float, *, headroom: float = 10, stale: float = 0, waiting: int = 0) -> Signals:
    return Signals(busy=busy, kv_cache_usage=kv, waiting=waiting, running=busy * 8, headroom=headroom, stale=stale)


def settle(ctl: Concurrency, kv_per_group: float, ticks: int = 80) -> list[int]:
    """Run the controller against an engine whose KV usage is ``kv_per_group`` per group played,
    with every slot busy and the learner always having room; returns the targets over time."""
    seen = []
    for _ in range(ticks):
        seen.append(ctl.update(signals(ctl.target, min(1.0, ctl.target * kv_per_group))))
    return seen


def test_a_fast_and_a_slow_actor_each_settle_at_their_own_level() -> None:
    # The "fast" engine has a large KV cache (2% per group), the "slow" one a small one (12%).
    fast, slow = Concurrency(cap=64, start=4), Concurrency(cap=64, start=4)
    f, s = settle(fast, 0.02), settle(slow, 0.12)
    f_tail, s_tail = f[-20:], s[-20:]
    # Each settles: the last 20 ticks stay within a band, below the memory ceiling...
    assert max(f_tail) - min(f_tail) <= max(f_tail) // 3 and max(s_tail) - min(s_tail) <= max(s_tail) // 3
    assert max(s_tail) * 0.12 < 1.0 and max(f_tail) * 0.02 < 1.0
    # ... near it (grown past the 0.8 mark at least once), and the fast one far higher.
    assert max(f_tail) * 0.02 >= 0.8 * 0.75 and max(s_tail) * 0.12 >= 0.8 * 0.75
    assert min(f_tail) > 3 * max(s_tail)


def test_growth_stops_when_the_learner_has_no_room_and_at_the_cap() -> None:
    ctl = Concurrency(cap=10, start=2)
    for _ in range(30):
        ctl.update(signals(ctl.target, 0.01))
    assert ctl.target == 10  # capped
    held = Concurrency(cap=64, start=4)
    for _ in range(10):
        held.update(signals(held.target, 0.01, headroom=0))
    assert held.target == 4 and held.last_reason == "hold"
    idle = Concurrency(cap=64, start=4)
    idle.update(signals(2, 0.01))  # not every slot busy: more slots would not be used
    assert idle.target == 4


def test_it_shrinks_when_groups_go_stale_or_requests_wait_for_memory() -> None:
    ctl = Concurrency(cap=64, start=16)
    ctl.update(signals(16, 0.1, stale=3, headroom=0))  # the first tick only learns the count
    assert ctl.target == 16
    ctl.update(signals(16, 0.1, stale=5))
    assert ctl.target == 12 and ctl.last_reason == "stale"
    ctl.update(Signals(busy=12, kv_cache_usage=0.3, waiting=40, running=30, headroom=0, stale=5))
    assert ctl.target == 12  # queued with room to spare: the engine's next batch, not memory
    ctl.update(Signals(busy=12, kv_cache_usage=0.85, waiting=40, running=30, headroom=10, stale=5))
    assert ctl.target == 9 and ctl.last_reason == "memory"
    for _ in range(20):
        ctl.update(signals(ctl.target, 1.0))
    assert ctl.target == 1  # never below one group
    with pytest.raises(ValueError, match="cap and start"):
        Concurrency(cap=0)


def test_the_scheduler_grants_each_actor_up_to_its_reported_capacity() -> None:
    # grant_start large: capacity alone limits here (earned grants: tests/test_scheduler.py)
    s = Scheduler(
        envs=[EnvSpec(name="guess_number")],
        batch_groups=8,
        max_staleness=4,
        mode="async",
        run_id="r",
        seed=0,
        grant_start=100,
    )
    s.register("fast", b"f", "h", max_groups=4)
    s.register("slow", b"s", "h", max_groups=4)
    first = s.fill(0)
    assert {k: len(v) for k, v in first.items()} == {"fast": 4, "slow": 4}
    s.set_capacity("fast", 20)
    s.set_capacity("slow", 2)  # fewer than it holds: nothing more until it is below
    s.set_capacity("ghost", 9)  # unknown actor: ignored
    assert {k: len(v) for k, v in s.fill(0).items()} == {"fast": 16}
    assert s.headroom(0) == 8 * 5 - 24


def test_the_staleness_rule_admits_by_the_batch_a_ticket_will_be_trained_in() -> None:
    rule = StalenessRule(mode="async", max_staleness=2, batch_groups=4, token_mode="drop")
    assert [rule.min_version(live, 0) for live in (0, 11, 12)] == [-1, 0, None]  # 12 // 4 = 3 > K
    # At version 10: the next batch (live < 4) may be played by weights 8..10, the batch K steps
    # ahead (live 8..11) only by the weights of now, so no trained token is older than K.
    assert [rule.min_version(live, 10) for live in (0, 3, 4, 8, 11, 12)] == [8, 8, 9, 10, 10, None]
    assert rule.headroom(5) == 7 and rule.headroom(20) == 0
    assert rule.verdict(oldest=0, newest=3, version=5) == "accepted"  # its later turns are trainable
    assert rule.verdict(oldest=0, newest=2, version=5) == "stale"
    assert rule.verdict(oldest=6, newest=6, version=5) == "stale"  # weights the learner never had
    sync = StalenessRule(mode="sync", max_staleness=2, batch_groups=2)
    assert sync.min_version(0, 3) is None  # no round open
    sync.on_version(3)
    assert [sync.min_version(0, 3), sync.min_version(0, 3), sync.min_version(0, 3)] == [3, 3, None]
    sync.on_forfeit()
    assert sync.headroom(0) == 1 and sync.min_version(0, 3) == 3
    assert sync.verdict(oldest=2, newest=3, version=3) == "stale"


def test_an_env_pool_grows_with_the_actor_and_runs_the_new_workers() -> None:
    async def main() -> tuple[int, int]:
        async with EnvPool("guess_number", {"high": 8}, size=1) as pool:
            pool.grow(3)
            pool.grow(2)  # never shrinks
            for _ in range(300):  # the new workers start in the background
                if pool.stats()["live_workers"] == 3:
                    break
                await asyncio.sleep(0.05)

            async def play(task: int) -> int | None:
                async with pool.episode(task) as ep:
                    await ep.reset()
                    await asyncio.sleep(0.2)  # held at once: needs three workers
                    return ep.worker_pid

            pids = await asyncio.gather(*(play(t) for t in range(3)))
            return pool.size, len(set(pids))

    assert asyncio.run(main()) == (3, 3)


def test_the_staleness_tally_counts_trained_tokens_per_bucket_over_the_run() -> None:
    from agentgym.learner.control.staleness import StalenessTally

    t = StalenessTally(max_staleness=2)
    t.add(
        {
            "agent_tokens": 100.0,
            "staleness_frac_0": 0.5,
            "staleness_frac_1": 0.3,
            "staleness_frac_2": 0.2,
            "staleness_frac_gt2": 0.0,
            "staleness_max": 2.0,
        }
    )
    t.add(
        {
            "agent_tokens": 50.0,
            "staleness_frac_0": 0.0,
            "staleness_frac_1": 0.0,
            "staleness_frac_2": 0.8,
            "staleness_frac_gt2": 0.2,
            "staleness_max": 4.0,
        }
    )
    assert t.summary() == {
        "max_staleness": 2,
        "tokens": {"0": 50, "1": 30, "2": 60, ">2": 10},
        "over_bound_share": round(10 / 150, 5),
        "max_seen": 4,
    }
