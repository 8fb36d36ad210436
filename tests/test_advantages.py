"""learner/algorithms/advantages.py: hand-computed values, group normalisation, multi-turn masking semantics."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym.learner.algorithms.advantages import (
    agent_turn_index,
    broadcast_sequence_advantages,
    episode_rewards_to_tokens,
    gae,
    grpo_advantages,
    importance_recentred,
    reinforce_pp_advantages,
    rloo_advantages,
    turn_baseline_advantages,
    turn_rewards_to_tokens,
)

# Two episodes, right-padded to 6. Row 0: prompt, agent, agent, env, agent, pad.
# Row 1: prompt, prompt, agent, agent, pad, pad.
MASK = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 0, 0]], dtype=torch.float32)


def close(t: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(t, torch.tensor(expected, dtype=t.dtype), rtol=1e-6, atol=1e-6)


def test_grpo_advantages_by_hand() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.5, 3.0])
    groups = torch.tensor([5, 5, 5, 2, 2, 9])  # any ids, any sizes
    # group 5: mean 2/3, deviations (1/3, -2/3, 1/3), Bessel std sqrt((1/9 + 4/9 + 1/9) / 2) = sqrt(1/3)
    s = math.sqrt(1 / 3)
    adv = grpo_advantages(rewards, groups, eps=0.0)
    assert adv.tolist() == pytest.approx([(1 / 3) / s, (-2 / 3) / s, (1 / 3) / s, 0.0, 0.0, 0.0])
    # the equal group and the singleton are exactly 0
    assert adv[3:].tolist() == [0.0, 0.0, 0.0]
    # Dr. GRPO: no division by the std
    dr = grpo_advantages(rewards, groups, std_normalize=False)
    assert dr.tolist() == pytest.approx([1 / 3, -2 / 3, 1 / 3, 0.0, 0.0, 0.0])
    # equal rewards whose float32 mean is inexact still give exactly 0, not residue / eps
    assert torch.equal(grpo_advantages(torch.full((3,), 0.1), torch.zeros(3, dtype=torch.long)), torch.zeros(3))


def test_rloo_advantages_by_hand() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 2.0, 4.0, 7.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 2])
    # group 0: 1 - (0+1)/2 = 0.5, 0 - (1+1)/2 = -1, 0.5; group 1: 2 - 4, 4 - 2; singleton: 0
    assert rloo_advantages(rewards, groups).tolist() == [0.5, -1.0, 0.5, -2.0, 2.0, 0.0]


@given(st.lists(st.tuples(st.integers(0, 4), st.floats(-100, 100)), min_size=1, max_size=30), st.randoms())
@settings(max_examples=80, deadline=None)
def test_group_advantages_sum_to_zero_and_follow_their_rows(rows: list[tuple[int, float]], rnd) -> None:
    groups = torch.tensor([g for g, _ in rows])
    rewards = torch.tensor([r for _, r in rows], dtype=torch.float64)
    perm = list(range(len(rows)))
    rnd.shuffle(perm)
    p = torch.tensor(perm)
    for fn in (grpo_advantages, rloo_advantages, lambda r, g: grpo_advantages(r, g, std_normalize=False)):
        adv = fn(rewards, groups)
        for g in groups.unique():
            assert abs(float(adv[groups == g].sum())) < 1e-9 * max(1.0, float(rewards.abs().max()))
        # shuffling rows and renaming groups shuffles the advantages (sums may round differently)
        assert torch.allclose(fn(rewards[p], groups[p] * 7 + 3), adv[p], rtol=1e-12, atol=1e-12)


def test_group_advantages_refuse_bad_inputs_by_name() -> None:
    with pytest.raises(ValueError, match=r"rewards\[1\] = nan"):
        grpo_advantages(torch.tensor([0.0, float("nan")]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="integer tensor"):
        rloo_advantages(torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match=r"\(2,\) and \(3,\)"):
        grpo_advantages(torch.zeros(2), torch.zeros(3, dtype=torch.long))


def test_episode_rewards_go_on_the_last_agent_token() -> None:
    tr = episode_rewards_to_tokens(torch.tensor([1.0, 2.0]), MASK)
    assert tr.tolist() == [[0, 0, 0, 0, 1.0, 0], [0, 0, 0, 2.0, 0, 0]]
    with pytest.raises(ValueError, match=r"row 1 has no agent token.*reward 2.0"):
        episode_rewards_to_tokens(torch.tensor([1.0, 2.0]), torch.tensor([[0, 1], [0, 0]]))


def test_turn_rewards_go_on_each_turns_last_token() -> None:
    tr = turn_rewards_to_tokens([[0.5, 1.0], [2.0]], [[2, 4], [3]], 6, loss_mask=MASK)
    assert tr.tolist() == [[0, 0, 0.5, 0, 1.0, 0], [0, 0, 0, 2.0, 0, 0]]
    with pytest.raises(ValueError, match=r"turn_ends\[0\]\[1\] = 3 is not an agent token"):
        turn_rewards_to_tokens([[0.5, 1.0], [2.0]], [[2, 3], [3]], 6, loss_mask=MASK)
    with pytest.raises(ValueError, match=r"turn_ends\[0\]\[1\] = 2 must be in \[0, 6\) and after"):
        turn_rewards_to_tokens([[0.5, 1.0]], [[2, 2]], 6)
    with pytest.raises(ValueError, match="row 0 has 2 rewards but 1 turn ends"):
        turn_rewards_to_tokens([[0.5, 1.0]], [[2]], 6)


def test_broadcast_sequence_advantages() -> None:
    out = broadcast_sequence_advantages(torch.tensor([0.5, -1.0]), MASK * 0.25)  # weights count as agent
    assert out.tolist() == [[0, 0.5, 0.5, 0, 0.5, 0], [0, 0, -1.0, -1.0, 0, 0]]


def test_gae_by_hand_skips_environment_tokens() -> None:
    rewards = episode_rewards_to_tokens(torch.tensor([1.0, 2.0]), MASK)
    values = torch.tensor([[9.0, 0.5, 0.5, 9.0, 0.5, 9.0], [9.0, 9.0, 1.0, 0.0, 9.0, 9.0]])  # 9 = ignored
    # γ = 0.9, λ = 0.8, done (next value 0 after the last agent token)
    # row 0, agent tokens t = 1, 2, 4 (t = 3 is an environment token: skipped):
    #   t4: δ = 1 + 0 - 0.5 = 0.5                  A = 0.5
    #   t2: δ = 0 + 0.9·0.5 - 0.5 = -0.05          A = -0.05 + 0.72·0.5  = 0.31
    #   t1: δ = -0.05                              A = -0.05 + 0.72·0.31 = 0.1732
    # row 1, t = 2, 3: t3: δ = 2 - 0 = 2, A = 2; t2: δ = 0.9·0 - 1 = -1, A = -1 + 0.72·2 = 0.44
    adv, ret = gae(rewards, values, MASK, gamma=0.9, lam=0.8)
    close(adv, [[0, 0.1732, 0.31, 0, 0.5, 0], [0, 0, 0.44, 2.0, 0, 0]])
    close(ret, [[0, 0.6732, 0.81, 0, 1.0, 0], [0, 0, 1.44, 2.0, 0, 0]])
    # truncated row 0 with V(next) = 1: t4: δ = 1 + 0.9 - 0.5 = 1.4 -> t2: -0.05 + 0.72·1.4 = 0.958
    adv_t, _ = gae(rewards, values, MASK, gamma=0.9, lam=0.8, bootstrap_value=torch.tensor([1.0, 0.0]))
    assert adv_t[0, 4].item() == pytest.approx(1.4) and adv_t[0, 2].item() == pytest.approx(0.958)
    assert torch.equal(adv_t[1], adv[1])


def test_gae_with_lambda_1_and_zero_values_is_the_return_to_go() -> None:
    rewards = torch.tensor([[0.0, 1.0, 0.0, 0.0, 2.0, 0.0]])
    adv, ret = gae(rewards, torch.zeros(1, 6), MASK[:1], gamma=0.5, lam=1.0)
    # agent tokens 1, 2, 4: G4 = 2, G2 = 0 + 0.5·2 = 1, G1 = 1 + 0.5·1 = 1.5
    assert adv.tolist() == [[0, 1.5, 1.0, 0, 2.0, 0]] and torch.equal(adv, ret)


def test_token_estimators_refuse_a_reward_on_a_masked_token() -> None:
    lost = torch.zeros(2, 6)
    lost[0, 5] = 1.0  # AgentGym-RL's placement: after the last agent token
    with pytest.raises(ValueError, match=r"token_rewards\[0, 5\] = 1.0 sits on a non-agent token"):
        gae(lost, torch.zeros(2, 6), MASK, gamma=1.0, lam=1.0)
    with pytest.raises(ValueError, match=r"token_rewards\[0, 5\]"):
        reinforce_pp_advantages(lost, MASK)


def test_reinforce_pp_by_hand() -> None:
    rewards = episode_rewards_to_tokens(torch.tensor([1.0, 2.0]), MASK)
    # γ = 0.5 returns: row 0 (t1, t2, t4) = (0.25, 0.5, 1), row 1 (t2, t3) = (1, 2)
    # batch mean 0.95, population variance (0.49 + 0.2025 + 0.0025 + 0.0025 + 1.1025) / 5 = 0.36
    adv = reinforce_pp_advantages(rewards, MASK, gamma=0.5, eps=0.0)
    z = [(g - 0.95) / 0.6 for g in (0.25, 0.5, 1.0, 1.0, 2.0)]
    expect = [[0, z[0], z[1], 0, z[2], 0], [0, 0, z[3], z[4], 0, 0]]
    close(adv, expect)


def _episode(rnd, turns: int) -> tuple[list[float], list[float], list[int]]:
    """A random multi-turn episode: rewards, values, mask (prompt, then agent turns and env replies)."""
    mask = [0] * rnd.randint(1, 3)
    for k in range(turns):
        mask += [1] * rnd.randint(1, 4)
        if k < turns - 1:
            mask += [0] * rnd.randint(1, 3)  # environment tokens between turns
    rewards = [rnd.choice([0.0, 0.0, 1.0, -0.5]) if m else 0.0 for m in mask]
    values = [rnd.uniform(-1, 1) if m else rnd.choice([0.0, 1e6]) for m in mask]
    return rewards, values, mask


def _rows(rows: list[list[float]], T: int) -> torch.Tensor:
    return torch.tensor([x + [0.0] * (T - len(x)) for x in rows], dtype=torch.float64)


@given(st.randoms(use_true_random=False), st.integers(1, 3), st.integers(0, 3))
@settings(max_examples=60, deadline=None)
def test_environment_and_padding_tokens_do_not_change_token_advantages(rnd, episodes: int, pad: int) -> None:
    eps = [_episode(rnd, rnd.randint(1, 4)) for _ in range(episodes)]
    boot = torch.tensor([rnd.choice([0.0, rnd.uniform(-1, 1)]) for _ in eps], dtype=torch.float64)  # done / truncated
    T = max(len(e[2]) for e in eps) + pad
    r, v, m = (_rows([e[i] for e in eps], T) for i in range(3))
    keep = m != 0
    # the same episodes with every non-agent token removed: plain single-turn sequences
    comp = [[[x for x, k in zip(e[i], e[2]) if k] for e in eps] for i in range(3)]
    Tc = max(len(c) for c in comp[2])
    rc, vc, mc = (_rows(c, Tc) for c in comp)
    keep_c = mc != 0
    adv, ret = gae(r, v, m, gamma=0.95, lam=0.9, bootstrap_value=boot)
    adv_c, ret_c = gae(rc, vc, mc, gamma=0.95, lam=0.9, bootstrap_value=boot)
    # boolean indexing walks rows in order, so agent tokens line up with their compacted copies
    assert torch.allclose(adv[keep], adv_c[keep_c]) and torch.allclose(ret[keep], ret_c[keep_c])
    assert torch.equal(adv[~keep], torch.zeros_like(adv[~keep]))
    rpp = reinforce_pp_advantages(r, m, gamma=0.9, eps=1e-12)
    assert torch.allclose(rpp[keep], reinforce_pp_advantages(rc, mc, gamma=0.9, eps=1e-12)[keep_c])
    assert torch.equal(rpp[~keep], torch.zeros_like(rpp[~keep]))
    if int(keep.sum()) > 1 and float(rpp[keep].var(unbiased=False)) > 0:
        # global whitening: mean 0 and (population) variance 1 over the agent tokens of the batch
        assert abs(float(rpp[keep].mean())) < 1e-9
        assert float(rpp[keep].var(unbiased=False)) == pytest.approx(1.0, abs=1e-6)


def test_gae_batch_rows_are_independent() -> None:
    rewards = episode_rewards_to_tokens(torch.tensor([1.0, 2.0]), MASK)
    values = torch.rand(2, 6)
    adv, _ = gae(rewards, values, MASK, gamma=0.99, lam=0.95)
    for b in range(2):
        one, _ = gae(rewards[b : b + 1], values[b : b + 1], MASK[b : b + 1], gamma=0.99, lam=0.95)
        assert torch.equal(one[0], adv[b])


# ---------------------------------------------------------------- a baseline per turn
# One group of four: prompt tokens, then agent turns separated by env tokens. Rows 1 and 3 solve
# the task (at turn 0 and turn 1), rows 0 and 2 fail after 3 turns.
TURNS = torch.tensor(
    [
        [0, 0, 1, 0, 0, 1, 1, 0, 1, 0],  # turns 0, 1 (two tokens), 2
        [0, 0, 1, 0, 0, 0, 0, 0, 0, 0],  # turn 0
        [0, 0, 1, 0, 1, 0, 1, 0, 0, 0],  # turns 0, 1, 2
        [0, 0, 1, 0, 1, 0, 0, 0, 0, 0],  # turns 0, 1
    ]
)
SOLVED = torch.tensor([0.0, 1.0, 0.0, 1.0])
ONE_GROUP = torch.zeros(4, dtype=torch.long)


def test_agent_turn_index_numbers_runs_of_agent_tokens() -> None:
    assert agent_turn_index(TURNS)[0].tolist() == [-1, -1, 0, -1, -1, 1, 1, -1, 2, -1]
    assert agent_turn_index(TURNS)[2].tolist() == [-1, -1, 0, -1, 1, -1, 2, -1, -1, -1]
    assert agent_turn_index(torch.zeros(1, 3)).tolist() == [[-1, -1, -1]]


def test_turn_baseline_credits_each_turn_against_the_episodes_that_reached_it() -> None:
    adv = turn_baseline_advantages(SOLVED, ONE_GROUP, TURNS)
    std = math.sqrt(sum((r - 0.5) ** 2 for r in SOLVED.tolist()) / 3) + 1e-6  # the whole group's (Bessel), + eps
    # Turn 0: all four played it, mean 1/2: GRPO's advantage.
    assert adv[:, 2].tolist() == pytest.approx(grpo_advantages(SOLVED, ONE_GROUP).tolist())
    # Turn 1: rows 0, 2, 3 reached it (rewards 0, 0, 1), mean 1/3.
    assert adv[0, 5].item() == adv[0, 6].item() == pytest.approx(-1 / 3 / std)
    assert adv[2, 4].item() == pytest.approx(-1 / 3 / std) and adv[3, 4].item() == pytest.approx(2 / 3 / std)
    # Turn 2: rows 0 and 2, both failed: nothing to push.
    assert adv[0, 8].item() == 0.0 and adv[2, 6].item() == 0.0
    # Each turn's advantages sum to zero over the episodes that played it (one token a turn here).
    assert adv[[0, 2, 3], [5, 4, 4]].sum().item() == pytest.approx(0.0, abs=1e-6)
    assert (adv[TURNS == 0] == 0).all()


def test_turn_discount_credits_the_shorter_success_more_by_hand() -> None:
    # gamma = 0.5 per turn. Row 1 succeeds at its turn 0 (last turn 0: worth 1 there), row 3 at its
    # turn 1 (worth 0.5 at turn 0, 1 at turn 1); rows 0 and 2 fail (0 everywhere).
    adv = turn_baseline_advantages(SOLVED, ONE_GROUP, TURNS, discount=0.5)
    std = math.sqrt(sum((r - 0.5) ** 2 for r in SOLVED.tolist()) / 3) + 1e-6  # the outcome's scale
    # Turn 0, all four: discounted returns 0, 1, 0, 0.5, mean 3/8.
    assert adv[:, 2].tolist() == pytest.approx([-3 / 8 / std, 5 / 8 / std, -3 / 8 / std, 1 / 8 / std])
    # Turn 1, rows 0, 2, 3: 0, 0, 1 (row 3 succeeds at this turn), mean 1/3: as without discount.
    assert adv[3, 4].item() == pytest.approx(2 / 3 / std) and adv[0, 5].item() == pytest.approx(-1 / 3 / std)
    # The shorter success gets more at turn 0 than the longer one; each turn still sums to zero.
    assert adv[1, 2] > adv[3, 2] > 0
    assert adv[:, 2].sum().item() == pytest.approx(0.0, abs=1e-6)
    # discount 1 is the undiscounted baseline exactly; outside (0, 1] is refused.
    assert torch.equal(
        turn_baseline_advantages(SOLVED, ONE_GROUP, TURNS, discount=1.0),
        turn_baseline_advantages(SOLVED, ONE_GROUP, TURNS),
    )
    with pytest.raises(ValueError, match="discount must be in"):
        turn_baseline_advantages(SOLVED, ONE_GROUP, TURNS, discount=0.0)


def test_turn_baseline_with_rloo_leaves_one_out_per_turn() -> None:
    adv = turn_baseline_advantages(SOLVED, ONE_GROUP, TURNS, leave_one_out=True)
    assert adv[:, 2].tolist() == pytest.approx(rloo_advantages(SOLVED, ONE_GROUP).tolist())
    assert adv[3, 4].item() == pytest.approx(1.0)  # the others at turn 1: rows 0, 2, both 0
    assert adv[0, 5].item() == pytest.approx(-0.5)  # the others: rows 2 (0) and 3 (1)
    assert adv[0, 8].item() == 0.0


def test_turn_baseline_is_grpo_when_every_episode_plays_the_same_turns_and_zero_without_a_signal() -> None:
    mask = torch.tensor([[1, 0, 1], [1, 0, 1], [1, 0, 1], [1, 0, 1]])
    r, groups = torch.tensor([0.3, 1.0, 0.1, 0.1]), torch.tensor([0, 0, 1, 1])
    expected = broadcast_sequence_advantages(grpo_advantages(r, groups), mask)
    torch.testing.assert_close(turn_baseline_advantages(r, groups, mask), expected)
    assert (turn_baseline_advantages(r, groups, mask)[2:] == 0).all()  # all-equal group: exactly 0
    alone = turn_baseline_advantages(torch.tensor([1.0]), torch.tensor([0]), torch.tensor([[1, 0, 1]]))
    assert (alone == 0).all()  # a group of one has no baseline


def test_importance_recentred_by_hand_and_the_zero_sum_it_restores() -> None:
    # Group 0: one-token answers with rewards 1, 0, 0, 0 (GRPO, no std: Â = 0.75, -0.25 x 3) and
    # weights 2, 1, 1, 0 (the rewarded answer grew since sampling, one token rejected). The
    # weighted baseline is Σ w R / Σ w = 2/4, so Â' = R - 0.5 on the weighted tokens. Group 1
    # keeps its own baseline; padding and zero-weight tokens keep their advantage untouched.
    adv = torch.tensor([[0.75, 0.0], [-0.25, 0.0], [-0.25, 0.0], [-0.25, 0.0], [0.5, 0.5], [-0.5, 0.0]])
    w = torch.tensor([[2.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [2.0, 0.0]])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    out = importance_recentred(adv, w, groups)
    # group 1: c = (0.5 + 0.5 - 1.0) / 4 = 0, nothing moves
    assert torch.allclose(
        out, torch.tensor([[0.5, 0.0], [-0.5, 0.0], [-0.5, 0.0], [-0.25, 0.0], [0.5, 0.5], [-0.5, 0.0]])
    )
    # Σ w·Â' = 0 in every group, whatever the weights
    g = torch.Generator().manual_seed(0)
    adv, w = torch.randn(12, 5, generator=g), torch.rand(12, 5, generator=g) * 3
    w[w < 0.5] = 0.0
    out = importance_recentred(adv, w, torch.arange(12) // 4)
    for k in range(3):
        assert abs(float((w * out)[4 * k : 4 * k + 4].sum())) < 1e-5
    # with all weights 1 on a group-centred GRPO advantage, nothing changes
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    a = grpo_advantages(r, torch.tensor([0, 0, 0, 1, 1, 1]))[:, None].repeat(1, 3)
    assert torch.allclose(importance_recentred(a, torch.ones(6, 3), torch.tensor([0, 0, 0, 1, 1, 1])), a, atol=1e-6)
    with pytest.raises(ValueError, match="importance_recentred"):
        importance_recentred(adv, w[:, :2], torch.arange(12))
