"""Step-level credit from repeated states: the turns of a group that acted on the same observation.

    adv = adv + weight * state_step_advantages(batch.input_ids, batch.loss_mask, batch.token_rewards,
                                               batch.group_index, discount=0.95)

An outcome reward says how an episode ended, not which of its moves helped: every turn of a
success is pushed up, the detour with the rest. In a multi-turn env the episodes of a group (one
task, one start) come back to the same states again and again (a maze cell, a room, a shop page).
The turns that acted on one state are an "anchor group": their discounted returns from that turn
on can be compared directly, and the comparison says which action was better *from that state*.
This is GiGPO's step-relative advantage (Feng et al., "Group-in-Group Policy Optimization for LLM
Agent Training", arXiv 2505.10978), added to the episode-level advantage with a weight:

    G_{i,k}  = Σ_{j ≥ k} γ^(j−k) r_{i,j}                  (turn rewards; the outcome on the last turn)
    A^S_{i,k} = (G_{i,k} − mean_{anchor} G) / (std_{anchor} G + ε)   (std only with ``std_normalize``)

The anchor of turn k is the exact token sequence the environment put between the agent's turn
k−1 and turn k (for turn 0, the whole prompt), so it needs nothing the batch does not carry and
no env cooperation: equal observations are equal states as far as the policy can tell. Anchors
are grouped within a rollout group only. An anchor group of one, or whose returns are all equal,
gets 0. With γ < 1 the shorter way to the same outcome has the larger return, so two actions from
one state that both end in a success are still told apart.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def agent_runs(mask_row: np.ndarray) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of agent tokens (mask != 0) of one row: its turns."""
    on = np.concatenate(([0], (mask_row != 0).astype(np.int8), [0]))
    edges = np.flatnonzero(np.diff(on))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


def state_step_advantages(
    input_ids: Tensor,
    loss_mask: Tensor,
    token_rewards: Tensor,
    group_index: Tensor,
    *,
    discount: float = 1.0,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """[B, T] step-relative advantages (module docstring), 0 off the agent tokens."""
    if not 0 < discount <= 1:
        raise ValueError(f"state_step_advantages: discount must be in (0, 1], got {discount}")
    if not (input_ids.shape == loss_mask.shape == token_rewards.shape) or input_ids.dim() != 2:
        raise ValueError(
            f"state_step_advantages: input_ids, loss_mask and token_rewards must be [B, T] of one shape, "
            f"got {tuple(input_ids.shape)}, {tuple(loss_mask.shape)}, {tuple(token_rewards.shape)}"
        )
    ids = input_ids.detach().cpu().numpy()
    mask = loss_mask.detach().cpu().numpy()
    rew = token_rewards.detach().cpu().double().numpy()
    groups = group_index.detach().cpu().numpy()
    anchors: dict[tuple[int, bytes], list[tuple[int, int, int, float]]] = {}
    for b in range(ids.shape[0]):
        runs = agent_runs(mask[b])
        returns = np.zeros(len(runs))
        carry = 0.0
        for k in range(len(runs) - 1, -1, -1):
            s, e = runs[k]
            carry = float(rew[b, s:e].sum()) + discount * carry
            returns[k] = carry
        prev_end = 0
        for k, (s, e) in enumerate(runs):
            key = (int(groups[b]), ids[b, prev_end:s].tobytes())
            anchors.setdefault(key, []).append((b, s, e, float(returns[k])))
            prev_end = e
    out = np.zeros(mask.shape, dtype=np.float64)
    for members in anchors.values():
        if len(members) < 2:
            continue
        g = np.array([m[3] for m in members])
        if np.all(g == g[0]):
            continue
        adv = g - g.mean()
        if std_normalize:
            adv = adv / (g.std(ddof=1) + eps)
        for (b, s, e, _), a in zip(members, adv.tolist()):
            out[b, s:e] = a
    out *= mask != 0
    return torch.from_numpy(out).to(device=token_rewards.device, dtype=token_rewards.dtype)
