"""BabyAI's progress reward (envpool/envs/babyai_progress.py): each action paid its share of the way."""

from __future__ import annotations

import pytest

from agentgym.envpool.envs import babyai_progress
from agentgym.envpool.envs.babyai import BabyAI


def _play_expert(env: BabyAI, limit: int = 64) -> list:
    results = []
    for _ in range(limit):
        results.append(env.step(env.expert_action()))
        if results[-1].done:
            break
    return results


@pytest.mark.parametrize("level", ["GoToObj", "GoToLocal", "PickupLoc"])
def test_the_expert_is_paid_the_whole_way_and_success_stays_the_missions(level: str) -> None:
    plain, paid = BabyAI(levels=level), BabyAI(levels=level, progress_reward=True)
    shortest = 0
    for task in range(8):
        assert paid.reset(task) == plain.reset(task)  # the same world and view
        start = babyai_progress.actions_to_go(paid._env)
        assert start is not None and start >= 1
        results = _play_expert(paid)
        plain.reset(task)
        base = _play_expert(plain)
        last = results[-1]
        assert last.info["success"] is True and base[-1].info["success"] is True
        assert len(results) == len(base)  # shaping changes no observation and no step
        # Whatever way the bot takes, the shares sum to the whole way (1), on top of BabyAI's
        # reward; where it takes a shortest one, every action is paid 1 / start.
        assert sum(r.reward for r in results) == pytest.approx(1.0 + base[-1].reward)
        assert [r.observation for r in results] == [r.observation for r in base]
        if len(results) == start:
            assert [r.reward for r in results[:-1]] == pytest.approx([1 / start] * (start - 1))
            shortest += 1
    assert shortest >= 4  # the object in sight: the bot walks straight to it


def test_a_turn_away_costs_its_share_and_useless_actions_pay_nothing() -> None:
    env = BabyAI(levels="GoToObj", progress_reward=True)
    checked = 0
    for task in range(12):
        env.reset(task)
        start = babyai_progress.actions_to_go(env._env)
        assert env.step("toggle").reward == 0.0  # nothing to toggle: the state does not change
        assert env.step("dance").reward == 0.0  # not an action
        for away, back in (("turn left", "turn right"), ("turn right", "turn left")):
            d0 = babyai_progress.actions_to_go(env._env)
            r1 = env.step(away)
            d1 = babyai_progress.actions_to_go(env._env)
            if r1.done:
                break
            assert r1.reward == pytest.approx((d0 - d1) / start)
            r2 = env.step(back)
            assert r2.reward == pytest.approx(-r1.reward)  # turning back undoes it exactly
            checked += r1.reward < 0
    assert checked >= 6  # most starts have a turn that leads away


def test_missions_without_a_distance_are_refused_by_name() -> None:
    env = BabyAI(levels="PutNextLocal", progress_reward=True)
    with pytest.raises(
        ValueError,
        match=r"progress_reward needs GoTo or Pickup missions; level "
        r"BabyAI-PutNextLocal-v0 \(task 0\) has 'put the",
    ):
        env.reset(0)
    BabyAI(levels="PutNextLocal").reset(0)  # without the option the level plays as ever
    with pytest.raises(TypeError, match="progress_reward must be true or false"):
        BabyAI(levels="GoToObj", progress_reward="yes")
