"""Step-relative advantages from repeated observations (learner/algorithms/step_groups.py), by hand."""

from __future__ import annotations

import math

import pytest
import torch

from agentgym.config import load_config
from agentgym.learner.algorithms.estimators import compute_advantages
from agentgym.learner.algorithms.step_groups import agent_runs, state_step_advantages
from agentgym.learner.training.batch import Batch

# Token ids: 1 = the prompt, 5/6 = two different observations, 8/9 = actions. Each row is
# prompt, action, observation, action, ... and the reward sits on the last agent token.
P, A, B, X, Y = 1, 5, 6, 8, 9


def rows(*seqs: list[tuple[int, bool]]) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    mask = torch.zeros(len(seqs), n)
    for b, s in enumerate(seqs):
        for t, (tok, agent) in enumerate(s):
            ids[b, t], mask[b, t] = tok, float(agent)
    return ids, mask


def ep(*parts: int | str) -> list[tuple[int, bool]]:
    """``ep(P, "X", A, "Y")``: ints are environment tokens, strings are agent tokens."""
    return [(X if p == "X" else Y, True) if isinstance(p, str) else (p, False) for p in parts]


def one_group(ids: torch.Tensor, mask: torch.Tensor, rew: torch.Tensor) -> Batch:
    """A training batch of these rows, all of one group."""
    n = ids.shape[0]
    return Batch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        loss_mask=mask,
        behav_logp=torch.zeros_like(mask),
        versions=torch.zeros_like(ids),
        token_rewards=rew,
        rewards=rew.sum(-1),
        group_index=torch.zeros(n, dtype=torch.long),
        success=rew.sum(-1),
        turns=torch.ones(n),
        truncated=torch.zeros(n),
        lengths=torch.full((n,), ids.shape[1]),
    )


def test_agent_runs_are_the_turns() -> None:
    import numpy as np

    assert agent_runs(np.array([0, 1, 1, 0, 0, 1, 0, 1])) == [(1, 3), (5, 6), (7, 8)]
    assert agent_runs(np.array([0, 0])) == []


def test_turns_on_the_same_observation_are_compared_by_their_discounted_returns() -> None:
    # Episode 0: from the prompt plays X, sees A, plays X, sees B, plays Y: success after 3 turns.
    # Episode 1: from the prompt plays X, sees A, plays Y: success after 2 turns.
    # Episode 2: from the prompt plays Y, sees B, plays X: failure.
    ids, mask = rows(ep(P, "X", A, "X", B, "Y"), ep(P, "X", A, "Y"), ep(P, "Y", B, "X"))
    rew = torch.zeros_like(mask)
    rew[0, 5], rew[1, 3] = 1.0, 1.0
    g = 0.5
    adv = state_step_advantages(ids, mask, rew, torch.tensor([0, 0, 0]), discount=g)
    # Turn 0 (anchor: the prompt): returns g^2, g, 0 for the three episodes.
    r0 = torch.tensor([g**2, g, 0.0], dtype=torch.float64)
    want0 = (r0 - r0.mean()) / r0.std()
    assert torch.allclose(adv[:, 1].double(), want0, atol=1e-5)
    # Observation A was seen by episodes 0 and 1: returns g (X, then Y) and 1 (Y at once).
    ra = torch.tensor([g, 1.0], dtype=torch.float64)
    wa = (ra - ra.mean()) / ra.std()
    assert adv[0, 3].item() == pytest.approx(wa[0].item(), abs=1e-5)
    assert adv[1, 3].item() == pytest.approx(wa[1].item(), abs=1e-5)
    assert adv[1, 3] > 0 > adv[0, 3]  # the shorter way from A is the better move
    # Observation B was seen by episode 0 (then Y: success, return 1) and episode 2 (X: failure,
    # return 0): centred ±0.5 over their std of √0.5.
    assert adv[0, 5].item() == pytest.approx(math.sqrt(0.5), abs=1e-5)
    assert adv[2, 3].item() == pytest.approx(-math.sqrt(0.5), abs=1e-5)
    # Environment tokens get nothing.
    assert torch.all(adv[mask == 0] == 0)


def test_anchors_stay_inside_their_group_and_lone_or_equal_anchors_get_zero() -> None:
    ids, mask = rows(ep(P, "X", A, "Y"), ep(P, "Y", A, "X"))
    rew = torch.zeros_like(mask)
    rew[0, 3] = 1.0
    # Two groups of one: no comparison anywhere.
    assert torch.all(state_step_advantages(ids, mask, rew, torch.tensor([0, 1])) == 0)
    # One group, equal returns (both fail): zero.
    assert torch.all(state_step_advantages(ids, mask, torch.zeros_like(mask), torch.tensor([0, 0])) == 0)
    # Without the std, the centred returns themselves.
    adv = state_step_advantages(ids, mask, rew, torch.tensor([0, 0]), std_normalize=False)
    assert adv[0, 1].item() == pytest.approx(0.5) and adv[1, 1].item() == pytest.approx(-0.5)


def test_bad_inputs_are_refused_by_name() -> None:
    ids, mask = rows(ep(P, "X"))
    with pytest.raises(ValueError, match="discount must be in"):
        state_step_advantages(ids, mask, torch.zeros_like(mask), torch.tensor([0]), discount=0.0)
    with pytest.raises(ValueError, match="of one shape"):
        state_step_advantages(ids, mask[:, :1], torch.zeros_like(mask), torch.tensor([0]))


def test_compute_advantages_adds_the_weighted_step_term_to_grpo() -> None:
    ids, mask = rows(ep(P, "X", A, "X", B, "Y"), ep(P, "X", A, "Y"), ep(P, "Y", B, "X"))
    rew = torch.zeros_like(mask)
    rew[0, 5], rew[1, 3] = 1.0, 1.0
    batch = one_group(ids, mask, rew)
    base, _ = compute_advantages("grpo", batch, baseline="episode", turn_discount=0.9)
    both, _ = compute_advantages("grpo", batch, baseline="episode", turn_discount=0.9, step_weight=0.5)
    step = state_step_advantages(ids, mask, rew, batch.group_index, discount=0.9)
    assert step.abs().sum() > 0
    assert torch.allclose(both, base + 0.5 * step)
    with pytest.raises(ValueError, match="step_weight needs"):
        compute_advantages("ppo", batch, step_weight=0.5, values=torch.zeros_like(rew), bootstrap=torch.zeros(3))


def test_reinforce_pp_gets_the_step_term_as_a_baseline_of_the_state() -> None:
    # Two episodes of one task act on the same first observation; the one that took A was paid
    # at once, the one that took B never: from that state A was the better move.
    ids, mask = rows(ep(P, "X", A, "X"), ep(P, "Y", B, "Y"))
    rew = torch.zeros_like(mask)
    rew[0, 1] = 1.0
    batch = one_group(ids, mask, rew)
    base, _ = compute_advantages("reinforce_pp", batch, gamma=0.5)
    both, _ = compute_advantages("reinforce_pp", batch, gamma=0.5, turn_discount=0.9, step_weight=1.0)
    step = state_step_advantages(ids, mask, rew, batch.group_index, discount=0.9)
    assert step[0, 1] > 0 > step[1, 1]  # the first turns share the prompt: an anchor group of two
    assert torch.allclose(both, base + step)
    cfg = load_config(None, ['learner.algorithm="reinforce_pp"', "learner.step_advantage_weight=1.0"])
    assert cfg.learner.step_advantage_weight == 1.0


def test_config_refuses_the_step_term_for_algorithms_that_credit_tokens_already() -> None:
    with pytest.raises(Exception, match="step_advantage_weight needs learner.algorithm"):
        load_config(None, ['learner.algorithm="ppo"', "learner.step_advantage_weight=1.0"])


def test_the_step_term_sees_the_kl_in_the_reward() -> None:
    ids, mask = rows(ep(P, "X", A, "X"), ep(P, "X", A, "Y"))
    rew = torch.zeros_like(mask)
    rew[0, 3], rew[1, 3] = 1.0, 1.0  # equal outcomes: no step signal without the KL
    batch = one_group(ids, mask, rew)
    kl = torch.zeros_like(mask)
    kl[1, 3] = 0.5  # episode 1's second move strayed from the reference
    base, _ = compute_advantages("grpo", batch, baseline="episode", kl=kl, kl_coef=0.1)
    both, _ = compute_advantages("grpo", batch, baseline="episode", kl=kl, kl_coef=0.1, step_weight=1.0)
    step = both - base
    assert step[0, 3] > 0 > step[1, 3]  # from observation A, the move without the KL cost is the better one
