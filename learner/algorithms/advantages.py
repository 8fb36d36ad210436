"""Advantage estimators and reward placement for multi-turn episodes: pure torch functions.

    token_rewards = episode_rewards_to_tokens(rewards, loss_mask)          # reward on the last agent token
    adv = broadcast_sequence_advantages(grpo_advantages(rewards, group_index), loss_mask)   # GRPO / RLOO
    adv = turn_baseline_advantages(rewards, group_index, loss_mask)                          # ... a baseline per turn
    adv = reinforce_pp_advantages(token_rewards, loss_mask)                                  # REINFORCE++
    adv, returns = gae(token_rewards, values, loss_mask, gamma=1.0, lam=0.95)               # PPO + critic

Layout: [B, T] right-padded sequences; ``loss_mask`` is 1 on agent tokens (pass the 0/1 agent mask
here, not training weights). In a multi-turn episode the agent's tokens are interleaved with
environment tokens; only agent tokens are timesteps: discounting, bootstrapping and the "next
state" skip the environment tokens between turns. A reward must sit on an agent token; on any
other token the token-level estimators would lose it, so they refuse it (AgentGym-RL puts the
episode reward on a masked token, where its GAE and REINFORCE++ never see it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentgym.learner.algorithms.losses import masked_whiten


def _groups(fn: str, rewards: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
    """Check inputs; return (rewards as float64, group id in 0..G-1 per row, group sizes, G)."""
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(
            f"{fn}: rewards and group_index must be [B] tensors of one shape, got "
            f"{tuple(rewards.shape)} and {tuple(group_index.shape)}"
        )
    if group_index.dtype.is_floating_point or group_index.dtype == torch.bool:
        raise ValueError(f"{fn}: group_index must be an integer tensor, got {group_index.dtype}")
    bad = (~torch.isfinite(rewards)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"{fn}: rewards[{i}] = {float(rewards[i])} is not finite")
    _, inv = torch.unique(group_index, return_inverse=True)
    G = int(inv.max()) + 1 if inv.numel() else 0
    # float64: a group's mean is subtracted from its members, and float32 residue divided by a
    # tiny std would turn equal rewards into visible advantages.
    x = rewards.detach().double()
    count = x.new_zeros(G).index_add_(0, inv, torch.ones_like(x))
    return x, inv, count, G


def _group_std(x: Tensor, inv: Tensor, count: Tensor, G: int) -> Tensor:
    """[G] standard deviation of each group's rewards, with Bessel's correction (n_g − 1)."""
    dev = x - (x.new_zeros(G).index_add_(0, inv, x) / count)[inv]
    return torch.sqrt(x.new_zeros(G).index_add_(0, inv, dev**2) / (count - 1).clamp(min=1))


def _all_equal(x: Tensor, inv: Tensor, G: int) -> Tensor:
    """[B] True for the rows of a group whose rewards are all equal (no relative signal)."""
    hi = x.new_full((G,), -torch.inf).scatter_reduce(0, inv, x, "amax")
    lo = x.new_full((G,), torch.inf).scatter_reduce(0, inv, x, "amin")
    return (hi == lo)[inv]


def grpo_advantages(rewards: Tensor, group_index: Tensor, *, std_normalize: bool = True, eps: float = 1e-6) -> Tensor:
    """Group-relative advantages of episodes; [B] rewards and group ids (long) in, [B] out.

    "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models"
    (Shao et al., arXiv 2402.03300), outcome supervision: for episode i of group g (same task)::

        Â_i = (r_i − mean_g(r)) / (std_g(r) + ε)          std with Bessel's correction (n_g − 1)

    ``std_normalize=False`` drops the division (Dr. GRPO, "Understanding R1-Zero-Like Training:
    A Critical Perspective", Liu et al., arXiv 2503.20783): dividing by the std favours tasks that
    are almost always solved or failed. Groups may have any sizes and any ids; a group of one, or
    one whose rewards are all equal, gets exactly 0 (it carries no relative signal).
    """
    x, inv, count, G = _groups("grpo_advantages", rewards, group_index)
    dev = x - (x.new_zeros(G).index_add_(0, inv, x) / count)[inv]
    if std_normalize:
        dev = dev / (_group_std(x, inv, count, G)[inv] + eps)
    return torch.where(_all_equal(x, inv, G), 0.0, dev).to(rewards.dtype)


def rloo_advantages(rewards: Tensor, group_index: Tensor) -> Tensor:
    """REINFORCE leave-one-out advantages; [B] rewards and group ids (long) in, [B] out.

    "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in
    LLMs" (Ahmadian et al., arXiv 2402.14740): the baseline of episode i is the mean reward
    of the other n_g − 1 episodes of its group::

        Â_i = r_i − (1 / (n_g − 1)) Σ_{j ≠ i} r_j          (= n_g/(n_g − 1) · (r_i − mean_g(r)))

    A group of one has no baseline and gets 0.
    """
    x, inv, count, G = _groups("rloo_advantages", rewards, group_index)
    total = x.new_zeros(G).index_add_(0, inv, x)
    n = count[inv]
    adv = x - (total[inv] - x) / (n - 1).clamp(min=1)
    return torch.where(n > 1, adv, 0.0).to(rewards.dtype)


def agent_turn_index(loss_mask: Tensor) -> Tensor:
    """[B, T] index of the agent turn each token belongs to (0, 1, ...), -1 off the agent tokens.

    A turn is a run of agent tokens (loss_mask != 0); the environment's tokens between two runs
    end a turn. Derived from the mask alone, so it needs nothing the batch does not carry.
    """
    if loss_mask.dim() != 2:
        raise ValueError(f"agent_turn_index: loss_mask must be [B, T], got {tuple(loss_mask.shape)}")
    agent = loss_mask != 0
    before = torch.nn.functional.pad(agent[:, :-1], (1, 0), value=False)
    starts = agent & ~before
    return torch.where(agent, starts.long().cumsum(-1) - 1, -1)


def turn_baseline_advantages(
    rewards: Tensor,
    group_index: Tensor,
    loss_mask: Tensor,
    *,
    leave_one_out: bool = False,
    std_normalize: bool = True,
    eps: float = 1e-6,
    discount: float = 1.0,
) -> Tensor:
    """Group-relative advantages with a baseline per agent turn; [B] rewards, [B] group ids and
    [B, T] loss mask in, [B, T] out (0 off the agent tokens).

    The tokens of turn k of episode i are credited against the episodes of its group that reached
    turn k (its cohort C_{g,k}), not against the whole group::

        Â_{i,k} = (R_i − mean_{j ∈ C_{g,k}} R_j) / (std_g(R) + ε)        (grpo; std only with std_normalize)
        Â_{i,k} = R_i − mean_{j ∈ C_{g,k}, j ≠ i} R_j                     (rloo: leave one out)

    Turn 0's cohort is the whole group, so turn 0 is GRPO's (RLOO's) advantage. Whether an episode
    reached turn k depends on its earlier actions only, so this is a state-dependent baseline: the
    policy gradient stays what it was. What it changes in a multi-turn episode with an outcome
    reward: late turns are reached mostly by episodes that go on to fail, and under the whole
    group's mean every token of them is pushed down, which moves probability off the sampled
    actions onto everything else at those turns (tokens that are not actions among them, which no
    sample pushes back). Against its cohort, a turn's advantages sum to zero among the episodes
    that played it: a cohort that all fails gets 0, not a push. Like GiGPO's step-level groups
    (Feng et al., arXiv 2505.10978) with the turn number as the anchor state, used instead of the
    episode-level advantage rather than added to it. A cohort of one gets 0.

    ``discount`` γ < 1: the outcome, which arrives at an episode's last turn L_i, is worth
    γ^(L_i − 1 − k) at turn k, for the episode and for its cohort's baseline alike, so of two
    episodes that succeed the one that got there in fewer turns is credited more (a move that
    undoes the one before it costs two turns). The scale (group std) stays that of the outcome;
    a group whose outcomes are all equal still gets 0.
    """
    x, inv, count, G = _groups("turn_baseline_advantages", rewards, group_index)
    if not 0 < discount <= 1:
        raise ValueError(f"turn_baseline_advantages: discount must be in (0, 1], got {discount}")
    if loss_mask.dim() != 2 or loss_mask.shape[0] != x.shape[0]:
        raise ValueError(
            f"turn_baseline_advantages: loss_mask must be [B, T] with B = {x.shape[0]}, got {tuple(loss_mask.shape)}"
        )
    turn = agent_turn_index(loss_mask)
    played = turn.max(-1).values + 1  # turns per row (0 for a row without agent tokens)
    scale = torch.ones_like(x)
    if std_normalize and not leave_one_out:
        scale = 1.0 / (_group_std(x, inv, count, G)[inv] + eps)
    out = torch.zeros(loss_mask.shape, dtype=torch.float64, device=loss_mask.device)
    for k in range(int(played.max()) if played.numel() else 0):
        member = (played > k).double()
        xk = x if discount == 1 else x * discount ** (played - 1 - k).clamp(min=0).double()
        n = x.new_zeros(G).index_add_(0, inv, member)[inv]
        total = x.new_zeros(G).index_add_(0, inv, member * xk)[inv]
        if leave_one_out:
            adv = torch.where(n > 1, xk - (total - xk) / (n - 1).clamp(min=1), 0.0)
        else:
            adv = (xk - total / n.clamp(min=1)) * scale
        out = torch.where(turn == k, adv[:, None], out)
    return torch.where(_all_equal(x, inv, G)[:, None], 0.0, out).to(rewards.dtype)  # exactly 0, as in grpo


def _agent_mask(fn: str, token_rewards: Tensor, loss_mask: Tensor) -> Tensor:
    if token_rewards.dim() != 2 or loss_mask.shape != token_rewards.shape:
        raise ValueError(
            f"{fn}: token_rewards and loss_mask must be [B, T] of one shape, got "
            f"{tuple(token_rewards.shape)} and {tuple(loss_mask.shape)}"
        )
    agent = loss_mask != 0
    lost = ((token_rewards != 0) & ~agent).nonzero()
    if lost.numel():
        b, t = (int(v) for v in lost[0])
        raise ValueError(
            f"{fn}: token_rewards[{b}, {t}] = {float(token_rewards[b, t])} sits on a non-agent token "
            f"(loss_mask 0) and would be lost; put rewards on agent tokens "
            f"(episode_rewards_to_tokens, turn_rewards_to_tokens)"
        )
    return agent


def _gae_scan(rewards: Tensor, values: Tensor, agent: Tensor, gamma: float, lam: float, bootstrap: Tensor) -> Tensor:
    """Backward recursion over agent tokens only; 0 on every other token.

    The carry holds the value and advantage of the next *agent* token of each row, so environment
    tokens between turns are skipped instead of being treated as timesteps.
    """
    adv = torch.zeros_like(rewards)
    next_value = bootstrap
    next_adv = torch.zeros_like(bootstrap)
    # Only columns where some row has an agent token need a step (prompt columns are skipped).
    for t in reversed(agent.any(0).nonzero().flatten().tolist()):
        m = agent[:, t]
        a = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * next_adv
        adv[:, t] = torch.where(m, a, 0.0)
        next_value = torch.where(m, values[:, t], next_value)
        next_adv = torch.where(m, a, next_adv)
    return adv


def gae(
    token_rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    *,
    gamma: float,
    lam: float,
    bootstrap_value: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over the agent tokens; returns (advantages, returns), [B, T].

    "High-Dimensional Continuous Control Using Generalized Advantage Estimation" (Schulman et al.,
    arXiv 1506.02438), with t and t' consecutive agent tokens of one row::

        δ_t = r_t + γ V(s_t') − V(s_t)
        Â_t = δ_t + γλ Â_t'                   R_t = Â_t + V(s_t)   (the value target)

    After the last agent token V(s_t') is ``bootstrap_value[b]``: pass V of the state after the
    last turn for an episode cut at the turn limit (truncated) and 0 for one that ended (done);
    None means every episode is done. ``values[b, t]`` is V of the state in which token t is chosen
    (aligned like logprobs). γ and λ discount per agent token. Inputs are detached; both outputs
    are 0 off the agent tokens.
    """
    if not (0 <= gamma <= 1 and 0 <= lam <= 1):
        raise ValueError(f"gae needs 0 <= gamma <= 1 and 0 <= lam <= 1, got gamma={gamma} lam={lam}")
    agent = _agent_mask("gae", token_rewards, loss_mask)
    if values.shape != token_rewards.shape:
        raise ValueError(
            f"gae: values must have the shape of token_rewards {tuple(token_rewards.shape)}, got {tuple(values.shape)}"
        )
    dtype = torch.promote_types(token_rewards.dtype, torch.float32)
    B = token_rewards.shape[0]
    if bootstrap_value is None:
        boot = torch.zeros(B, dtype=dtype, device=token_rewards.device)
    elif bootstrap_value.shape != (B,):
        raise ValueError(f"gae: bootstrap_value must be [B] = ({B},), got {tuple(bootstrap_value.shape)}")
    else:
        boot = bootstrap_value.detach().to(dtype)
    v = torch.where(agent, values.detach().to(dtype), 0.0)
    adv = _gae_scan(token_rewards.detach().to(dtype), v, agent, gamma, lam, boot)
    return adv, torch.where(agent, adv + v, 0.0)


def reinforce_pp_advantages(
    token_rewards: Tensor, loss_mask: Tensor, *, gamma: float = 1.0, eps: float = 1e-8
) -> Tensor:
    """REINFORCE++ advantages: discounted return-to-go over agent tokens, whitened over the batch.

    "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models"
    (Hu, arXiv 2501.03262)::

        G_t = Σ_{k ≥ 0} γ^k r_{t+k}      (k counts agent tokens; environment tokens are skipped)
        Â_t = (G_t − mean(G)) / sqrt(var(G) + ε)     mean and var over all agent tokens of the batch

    A per-token KL penalty belongs in ``token_rewards`` (r_t − β·KL_t) before the call.
    [B, T] in and out, 0 off the agent tokens.
    """
    if not 0 <= gamma <= 1:
        raise ValueError(f"reinforce_pp_advantages needs 0 <= gamma <= 1, got {gamma}")
    agent = _agent_mask("reinforce_pp_advantages", token_rewards, loss_mask)
    dtype = torch.promote_types(token_rewards.dtype, torch.float32)
    r = token_rewards.detach().to(dtype)
    zero = r.new_zeros(r.shape[0])
    # The return-to-go is GAE with V = 0 and λ = 1: δ_t = r_t, Â_t = r_t + γ Â_t'.
    returns = _gae_scan(r, torch.zeros_like(r), agent, gamma, 1.0, zero)
    return masked_whiten(returns, agent.to(dtype), eps=eps)


def episode_rewards_to_tokens(rewards: Tensor, loss_mask: Tensor) -> Tensor:
    """[B] episode rewards to [B, T] token rewards: each on its episode's LAST agent token.

    The last token the agent chose is the last action the reward can be credited to; a row
    without agent tokens is an error (its reward would be lost).
    """
    if rewards.dim() != 1 or loss_mask.dim() != 2 or loss_mask.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"episode_rewards_to_tokens: need rewards [B] and loss_mask [B, T], got "
            f"{tuple(rewards.shape)} and {tuple(loss_mask.shape)}"
        )
    agent = loss_mask != 0
    empty = (~agent.any(-1)).nonzero().flatten()
    if empty.numel():
        raise ValueError(
            f"episode_rewards_to_tokens: row {int(empty[0])} has no agent token "
            f"(loss_mask all 0); its reward {float(rewards[empty[0]])} would be lost"
        )
    T = agent.shape[1]
    # argmax returns the first maximum, so on the flipped mask it finds the last agent token.
    last = T - 1 - agent.flip(-1).to(torch.int8).argmax(-1)
    out = torch.zeros(agent.shape, dtype=rewards.dtype, device=rewards.device)
    out[torch.arange(agent.shape[0], device=out.device), last] = rewards
    return out


def turn_rewards_to_tokens(
    turn_rewards: list[list[float]],
    turn_ends: list[list[int]],
    T: int,
    *,
    loss_mask: Tensor | None = None,
) -> Tensor:
    """Per-turn rewards to [B, T] token rewards: reward k of row b at position turn_ends[b][k].

    ``turn_ends[b][k]`` is the index of the last agent token of turn k (strictly increasing,
    within [0, T)). With ``loss_mask`` each of those positions is checked to be an agent token.
    """
    if len(turn_rewards) != len(turn_ends):
        raise ValueError(
            f"turn_rewards_to_tokens: {len(turn_rewards)} rows of rewards but {len(turn_ends)} rows of turn ends"
        )
    out = torch.zeros(len(turn_rewards), T, dtype=torch.float32)
    for b, (rs, ends) in enumerate(zip(turn_rewards, turn_ends)):
        if len(rs) != len(ends):
            raise ValueError(f"turn_rewards_to_tokens: row {b} has {len(rs)} rewards but {len(ends)} turn ends")
        for k, (r, t) in enumerate(zip(rs, ends)):
            if not 0 <= t < T or (k and t <= ends[k - 1]):
                raise ValueError(
                    f"turn_rewards_to_tokens: turn_ends[{b}][{k}] = {t} must be in [0, {T}) "
                    f"and after the previous turn's end"
                )
            if loss_mask is not None and loss_mask[b, t] == 0:
                raise ValueError(f"turn_rewards_to_tokens: turn_ends[{b}][{k}] = {t} is not an agent token")
            out[b, t] = r
    return out


def broadcast_sequence_advantages(adv: Tensor, loss_mask: Tensor) -> Tensor:
    """[B] per-episode advantages to [B, T]: Â_b on every agent token of row b, 0 elsewhere."""
    if adv.dim() != 1 or loss_mask.dim() != 2 or loss_mask.shape[0] != adv.shape[0]:
        raise ValueError(
            f"broadcast_sequence_advantages: need adv [B] and loss_mask [B, T], got "
            f"{tuple(adv.shape)} and {tuple(loss_mask.shape)}"
        )
    return torch.where(loss_mask != 0, adv[:, None], 0.0).to(adv.dtype)


def importance_recentred(adv: Tensor, weights: Tensor, group_index: Tensor) -> Tensor:
    """Group-relative advantages re-centred so that the importance weights add no net push.

    ``weights`` [B, T] is each agent token's effective weight in the loss (the truncated
    π_prox/μ times any staleness weight; 0 off the agent tokens). Per group g, with c_g =
    Σ_{b∈g,t} w·Â / Σ_{b∈g,t} w, returns Â − c_g on the agent tokens, so Σ_{b∈g,t} w·Â' = 0.

    Why: on fresh data (w = 1) a GRPO group's advantages sum to zero, so its update moves
    probability between the sampled answers. On stale data the weights break that sum: answers
    the policy has grown since sampling (w > 1) are usually the rewarded ones, the group then
    pushes up its sampled tokens as a whole and the policy sharpens step after step; with the
    sum negative it pushes them all down and the mass leaks to tokens nobody sampled. Subtracting
    c_g is the group baseline estimated under π_prox by self-normalised importance sampling (for
    one-token answers Â' = (R − Σ w R / Σ w) / σ), which leaves the expected gradient unchanged.
    """
    if adv.shape != weights.shape or group_index.shape != adv.shape[:1]:
        raise ValueError(
            f"importance_recentred: adv and weights must be [B, T] and group_index [B], got "
            f"{tuple(adv.shape)}, {tuple(weights.shape)}, {tuple(group_index.shape)}"
        )
    _, inv = torch.unique(group_index, return_inverse=True)
    G = int(inv.max()) + 1 if inv.numel() else 0
    on = weights != 0
    w = torch.where(on, weights, 0.0).double()
    wa = (w * torch.where(on, adv, 0.0).double()).sum(-1)
    num = torch.zeros(G, dtype=torch.float64, device=adv.device).index_add_(0, inv, wa)
    den = torch.zeros(G, dtype=torch.float64, device=adv.device).index_add_(0, inv, w.sum(-1))
    c = (num / torch.where(den > 0, den, 1.0)).to(adv.dtype)
    return torch.where(on, adv - c[inv].unsqueeze(-1), adv)
