"""What differs between the learner's algorithms: advantages, KL in the reward, and the LR schedule.

    adv, returns = compute_advantages("grpo", batch, std_normalize=True)
    adv, returns = compute_advantages("ppo", batch, values=v, bootstrap=b, gamma=1.0, lam=0.95)
    lr = base_lr * lr_factor(step, warmup_steps=10, total_steps=100, schedule="cosine")

Every algorithm then shares one loss, decoupled PPO with truncated importance weights
(learner/algorithms/losses.py); PPO adds a value loss. The estimators are the pure functions of
learner/algorithms/advantages.py; this module only chooses and feeds them. docs/off_policy.md has the
formulas, docs/adr/0007-learner-algorithms.md the choices. Each estimator below is registered
by name in agentgym/config/registries.py (``ALGORITHMS``), which ``learner.algorithm`` reads: a
new one is a function with the same keywords (here or in its own module) and one registration.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from agentgym.config.registries import ALGORITHMS as REGISTRY
from agentgym.learner.algorithms.advantages import (
    broadcast_sequence_advantages,
    gae,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    turn_baseline_advantages,
)
from agentgym.learner.algorithms.losses import masked_mean, masked_whiten
from agentgym.learner.algorithms.step_groups import state_step_advantages
from agentgym.learner.training.batch import Batch

Algorithm = str  # a name registered in agentgym/config/registries.py
ALGORITHMS = REGISTRY.names()


def compute_advantages(
    algorithm: Algorithm,
    batch: Batch,
    *,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
    std_normalize: bool = True,
    gamma: float = 1.0,
    lam: float = 0.95,
    values: Tensor | None = None,
    bootstrap: Tensor | None = None,
    whiten: bool = True,
    baseline: Literal["episode", "turn"] = "episode",
    turn_discount: float = 1.0,
    step_weight: float = 0.0,
) -> tuple[Tensor, Tensor | None]:
    """Advantages [B, T] (0 off the agent tokens) and, for PPO, the value targets [B, T].

    ``kl`` ([B, T], per-token KL(π_prox‖π_ref) estimate) with ``kl_coef`` > 0 is the "KL in the
    reward" mode: each agent token's reward gets −kl_coef·KL_t (token-level estimators), or each
    episode's reward −kl_coef·Σ_t KL_t (grpo, rloo, which see one reward per episode).

    - grpo: Â_b = (R_b − mean_g R) / (std_g R + ε) (std only with ``std_normalize``), on every
      agent token of row b (arXiv 2402.03300; without std: Dr. GRPO, arXiv 2503.20783).
    - rloo: Â_b = R_b − mean of the other episodes of the group (arXiv 2402.14740).
    - reinforce_pp: return-to-go of the token rewards, whitened over the batch (arXiv 2501.03262).
    - ppo: GAE over agent tokens with ``values`` [B, T] and ``bootstrap`` [B] (V after the last
      token for truncated rows, 0 for finished ones), whitened over the batch if ``whiten``;
      returns R_t = Â_t + V_t before whitening (arXiv 1506.02438, 1707.06347).

    ``baseline="turn"`` (grpo, rloo): turn k's tokens are credited against the episodes of the
    group that reached turn k (learner/algorithms/advantages.py: turn_baseline_advantages), the outcome
    discounted by ``turn_discount`` per turn between turn k and the episode's last turn.

    ``step_weight`` > 0 (grpo, rloo, reinforce_pp): plus ``step_weight`` times the step-relative
    advantage of the turns that acted on the same observation (learner/algorithms/step_groups.py; GiGPO,
    arXiv 2505.10978).
    """
    agent = batch.loss_mask != 0
    token_rewards, seq_rewards = batch.token_rewards, batch.rewards
    if kl is not None and kl_coef > 0:  # the KL in the reward: every term below sees it
        kl = torch.where(agent, kl, 0.0)
        token_rewards = token_rewards - kl_coef * kl
        seq_rewards = seq_rewards - kl_coef * kl.sum(-1)
    adv, returns = _advantages(
        algorithm,
        batch,
        token_rewards,
        seq_rewards,
        std_normalize=std_normalize,
        gamma=gamma,
        lam=lam,
        values=values,
        bootstrap=bootstrap,
        whiten=whiten,
        baseline=baseline,
        turn_discount=turn_discount,
    )
    if step_weight > 0:
        step_term = REGISTRY.with_("step_term")
        if algorithm not in step_term:
            raise ValueError(f"compute_advantages: step_weight needs one of {step_term}, not {algorithm!r}")
        adv = adv + step_weight * state_step_advantages(
            batch.input_ids,
            batch.loss_mask,
            token_rewards,
            batch.group_index,
            discount=turn_discount,
            std_normalize=std_normalize,
        )
    return adv, returns


def _advantages(
    algorithm: Algorithm,
    batch: Batch,
    token_rewards: Tensor,
    seq_rewards: Tensor,
    *,
    std_normalize: bool,
    gamma: float,
    lam: float,
    values: Tensor | None,
    bootstrap: Tensor | None,
    whiten: bool,
    baseline: str,
    turn_discount: float,
) -> tuple[Tensor, Tensor | None]:
    """The estimator of ``algorithm`` on these rewards (the KL in the reward already taken off)."""
    if baseline not in ("episode", "turn"):
        raise ValueError(f"compute_advantages: baseline must be 'episode' or 'turn', got {baseline!r}")
    if algorithm not in REGISTRY.entries:
        raise ValueError(f"learner.algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    estimate = REGISTRY.load(algorithm)
    return estimate(
        batch,
        token_rewards,
        seq_rewards,
        std_normalize=std_normalize,
        gamma=gamma,
        lam=lam,
        values=values,
        bootstrap=bootstrap,
        whiten=whiten,
        baseline=baseline,
        turn_discount=turn_discount,
    )


# The estimators, registered by name in agentgym/config/registries.py. Each takes the batch, its
# token and episode rewards and every option as keywords (``**_``: the ones it does not read).


def grpo(
    batch: Batch,
    token_rewards: Tensor,
    seq_rewards: Tensor,
    *,
    std_normalize: bool,
    baseline: str,
    turn_discount: float,
    **_: object,
) -> tuple[Tensor, None]:
    if baseline == "turn":
        return turn_baseline_advantages(
            seq_rewards,
            batch.group_index,
            batch.loss_mask,
            leave_one_out=False,
            std_normalize=std_normalize,
            discount=turn_discount,
        ), None
    seq = grpo_advantages(seq_rewards, batch.group_index, std_normalize=std_normalize)
    return broadcast_sequence_advantages(seq, batch.loss_mask), None


def rloo(
    batch: Batch,
    token_rewards: Tensor,
    seq_rewards: Tensor,
    *,
    std_normalize: bool,
    baseline: str,
    turn_discount: float,
    **_: object,
) -> tuple[Tensor, None]:
    if baseline == "turn":
        return turn_baseline_advantages(
            seq_rewards,
            batch.group_index,
            batch.loss_mask,
            leave_one_out=True,
            std_normalize=std_normalize,
            discount=turn_discount,
        ), None
    return broadcast_sequence_advantages(rloo_advantages(seq_rewards, batch.group_index), batch.loss_mask), None


def reinforce_pp(
    batch: Batch, token_rewards: Tensor, seq_rewards: Tensor, *, gamma: float, **_: object
) -> tuple[Tensor, None]:
    return reinforce_pp_advantages(token_rewards, batch.loss_mask, gamma=gamma), None


def ppo(
    batch: Batch,
    token_rewards: Tensor,
    seq_rewards: Tensor,
    *,
    gamma: float,
    lam: float,
    values: Tensor | None,
    bootstrap: Tensor | None,
    whiten: bool,
    **_: object,
) -> tuple[Tensor, Tensor]:
    if values is None or bootstrap is None:
        raise ValueError("compute_advantages: algorithm 'ppo' needs values [B, T] and bootstrap [B]")
    adv, returns = gae(token_rewards, values, batch.loss_mask, gamma=gamma, lam=lam, bootstrap_value=bootstrap)
    if whiten:
        adv = masked_whiten(adv, (batch.loss_mask != 0).to(adv.dtype))
    return adv, returns


def bootstrap_values(last_values: Tensor, truncated: Tensor) -> Tensor:
    """[B] value after each row's last token: V(s_end) for rows cut by a limit, 0 for finished ones."""
    return torch.where(truncated != 0, last_values, 0.0)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 − Var(R − V) / Var(R) over the mask: 1 is a perfect critic, 0 predicts the mean, < 0 worse.

    NaN when the returns are constant over the mask (nothing to explain).
    """
    var_r = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    err = returns - values
    var_e = masked_mean((err - masked_mean(err, mask)) ** 2, mask)
    if float(var_r) <= 1e-12:
        return float("nan")
    return float(1.0 - var_e / var_r)


def lr_factor(
    step: int,
    *,
    warmup_steps: int,
    total_steps: int,
    schedule: Literal["constant", "linear", "cosine"],
    min_ratio: float = 0.0,
) -> float:
    """Multiplier of the base LR at learner step ``step`` (0-based).

    Warm-up: (step + 1) / warmup_steps while step < warmup_steps. Then, with progress
    p = (step − warmup_steps) / max(1, total_steps − warmup_steps) clamped to [0, 1]:
    constant 1; linear 1 − (1 − min_ratio)·p; cosine min_ratio + (1 − min_ratio)·½(1 + cos πp).
    """
    if step < 0:
        raise ValueError(f"lr_factor: step must be >= 0, got {step}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    p = min(1.0, max(0.0, (step - warmup_steps) / max(1, total_steps - warmup_steps)))
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * p
    if schedule == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"learner.lr_schedule must be constant, linear or cosine, got {schedule!r}")
