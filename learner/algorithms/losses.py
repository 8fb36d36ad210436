"""Policy-gradient losses and their helpers: pure torch functions, no I/O, no state.

    logp = sequence_logprobs(model, input_ids, attention_mask, temperature)     # learner/model/logprobs.py
    loss, metrics = decoupled_ppo_loss(logp, prox_logp, behav_logp, advantages, loss_mask)
    loss = loss + beta * masked_mean(kl_penalty(logp, ref_logp, "k3"), loss_mask)

Layout: B sequences right-padded to length T, every per-token tensor is ``[B, T]`` and position t
holds the quantity of token t (its logprob given the tokens before it). ``loss_mask`` is 1 on agent
tokens and 0 on prompt, environment and padding tokens. It may also carry per-token weights in
(0, 1] (staleness down-weighting, :func:`staleness_weights`): a weight scales its token's term while
the loss normaliser counts tokens with a nonzero weight, so a down-weighted token really weighs less
instead of being renormalised back to 1. Masked positions never reach a loss or its gradient, even
when they hold inf or NaN (inputs are selected with ``torch.where`` before any arithmetic).

Symbols follow the papers: μ the behaviour policy (the inference engine that sampled the tokens),
π_prox the proximal policy (the learner's weights at the start of the step), π_θ the policy being
optimised, A the advantage. docs/off_policy.md explains when to use which setting.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Agg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def _same_shape(fn: str, **tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"{fn}: tensors must have one shape, got {shapes}")


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·m / Σ m over ``dim`` (all elements if None); 0 where the mask is empty, never NaN.

    ``mask`` (bool or float weights) has the shape of ``x``; values of ``x`` where the mask is 0
    are ignored, including inf and NaN.
    """
    _same_shape("masked_mean", x=x, mask=mask)
    m = mask.to(x.dtype)
    num = torch.where(mask != 0, x, 0.0) * m
    num = num.sum() if dim is None else num.sum(dim)
    den = m.sum() if dim is None else m.sum(dim)
    # Dividing by a placeholder 1 where the mask is empty keeps both the value and the gradient finite.
    return num / torch.where(den != 0, den, 1.0)


def masked_whiten(x: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x − mean) / sqrt(var + eps) with mean and (population) variance over the mask; 0 off the mask.

    With ``shift_mean=False`` the mean is added back: (x − mean)/sqrt(var + eps) + mean. The result has mean 0 and
    variance var/(var + eps) ≈ 1 over the mask; a constant input gives 0.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(mask != 0, out, 0.0)


def _aggregate(per_token: Tensor, loss_mask: Tensor, agg: str, norm_const: float | None) -> Tensor:
    """Reduce a [B, T] per-token loss to a scalar (see decoupled_ppo_loss for the three modes)."""
    keep = loss_mask != 0
    contrib = torch.where(keep, per_token, 0.0) * loss_mask.to(per_token.dtype)
    n_tok = keep.sum(-1)  # tokens per sequence
    if agg == "token_mean":
        return contrib.sum() / n_tok.sum().clamp(min=1)
    n_seq = (n_tok > 0).sum().clamp(min=1)  # sequences without tokens (pure padding) do not count
    if agg == "seq_mean_token_mean":
        return (contrib.sum(-1) / n_tok.clamp(min=1)).sum() / n_seq
    if agg == "seq_mean_token_sum_norm":
        if norm_const is None or not norm_const > 0:
            raise ValueError(
                f"agg='seq_mean_token_sum_norm' needs norm_const > 0 (Dr. GRPO's constant, e.g. the "
                f"token budget of an episode), got norm_const={norm_const!r}"
            )
        return (contrib.sum(-1) / norm_const).sum() / n_seq
    raise ValueError(f"agg must be one of {_AGGS}, got {agg!r}")


def aggregate(per_token: Tensor, loss_mask: Tensor, agg: Agg, norm_const: float | None = None) -> Tensor:
    """A [B, T] per-token term (KL, entropy) reduced like the policy loss: the three ``agg``
    modes of :func:`decoupled_ppo_loss`, weights and normalisers included."""
    _same_shape("aggregate", per_token=per_token, loss_mask=loss_mask)
    return _aggregate(per_token, loss_mask, agg, norm_const)


def truncated_weights(ratio: Tensor, cap: float | None, reject_above: float | None) -> Tensor:
    """The behaviour weight of each token from its ratio π_prox/μ: min(ratio, cap), and 0 where
    the ratio exceeds ``reject_above`` (None: no cap, no rejection)."""
    w = ratio if cap is None else ratio.clamp(max=cap)
    return w if reject_above is None else torch.where(ratio > reject_above, 0.0, w)


def _check_ppo_bounds(
    clip_low: float,
    clip_high: float,
    behav_weight_cap: float | None,
    behav_reject_above: float | None,
    dual_clip: float | None,
) -> None:
    """``ValueError`` naming the first of ``decoupled_ppo_loss``'s bounds that is out of range."""
    if not 0 <= clip_low < 1 or not clip_high >= 0:
        raise ValueError(
            f"clip range must satisfy 0 <= clip_low < 1 and clip_high >= 0, got "
            f"clip_low={clip_low} clip_high={clip_high}"
        )
    if behav_weight_cap is not None and not behav_weight_cap > 0:
        raise ValueError(f"behav_weight_cap must be > 0 or None, got {behav_weight_cap}")
    if behav_reject_above is not None and not behav_reject_above > 0:
        raise ValueError(f"behav_reject_above must be > 0 or None, got {behav_reject_above}")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip must be > 1 or None, got {dual_clip}")


def decoupled_ppo_loss(
    logp: Tensor,
    prox_logp: Tensor,
    behav_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    behav_weight_cap: float | None = 5.0,
    behav_reject_above: float | None = None,
    agg: Agg = "token_mean",
    norm_const: float | None = None,
    dual_clip: float | None = None,
    behav_clip: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Decoupled PPO-clip with a truncated behaviour importance weight; returns (loss, metrics).

    AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning
    (Fu et al., arXiv 2505.24298); the decoupling is from "Batch size-invariance for policy
    optimization" (Hilton et al., arXiv 2110.00641); the clip from "Proximal Policy Optimization
    Algorithms" (Schulman et al., arXiv 1707.06347); clip_high > clip_low is DAPO's "clip-higher"
    (arXiv 2503.14476); the cap is truncated importance sampling (IMPALA's ρ̄, arXiv 1802.01561).
    Per agent token t::

        r_t = π_θ(a_t|s_t) / π_prox(a_t|s_t)                      = exp(logp − prox_logp)
        w_t = min(π_prox(a_t|s_t) / μ(a_t|s_t), C)   (no gradient) = min(exp(prox_logp − behav_logp), C)
        ℓ_t = −w_t · min(r_t·A_t, clip(r_t, 1 − ε_low, 1 + ε_high)·A_t)

    ``behav_weight_cap`` is C (None: no cap). ``behav_reject_above``: tokens whose uncapped
    π_prox/μ exceeds it get w = 0 (AReaL's rejection) but still count in the normaliser.
    ``dual_clip`` is c > 1 of dual-clip PPO ("Mastering Complex Control in MOBA Games with Deep
    Reinforcement Learning", Ye et al., arXiv 1912.09729; verl's and AReaL's ``c_clip``, 3 there):
    for A_t < 0 the term is also bounded, ℓ_t = −w_t·max(min(r_t·A_t, clip(r_t)·A_t), c·A_t), so a
    token whose ratio has run far above 1 + ε_high cannot push with an unbounded −r_t·A_t
    (None: off). It acts only where r_t > c, i.e. with several minibatches per batch.
    ``behav_clip``: a token whose π_prox/μ has already left the clip range in the direction its
    advantage asks for (A_t > 0 and π_prox/μ > 1 + ε_high, or A_t < 0 and π_prox/μ < 1 − ε_low) gets
    ℓ_t = 0: the updates made since it was sampled already did what it asks, and pushing again
    compounds a delayed gradient (the same test PPO's clip makes against the sampling policy; it
    still counts in the normaliser). With fresh data (π_prox = μ) it never binds.
    With prox_logp == behav_logp, w = 1 exactly and this is plain PPO-clip; with
    logp == prox_logp == behav_logp its value is −mean(A) and its gradient −A·∇logp per token,
    the on-policy policy gradient.

    Aggregation of ℓ (m = loss_mask, n_b = agent tokens of sequence b, S = sequences with tokens):
      "token_mean":               Σ_bt m·ℓ / Σ_b n_b                (every token weighs the same)
      "seq_mean_token_mean":      (1/|S|) Σ_b (Σ_t m·ℓ / n_b)       (GRPO as in DeepSeekMath)
      "seq_mean_token_sum_norm":  (1/|S|) Σ_b (Σ_t m·ℓ / norm_const) (Dr. GRPO, arXiv 2503.20783)

    Metrics (means over agent tokens, detached): is_weight_mean / is_weight_max of the uncapped
    π_prox/μ, is_truncated_frac (above C), is_rejected_frac, clip_frac (the clipped term binds,
    so the token has no gradient), dual_clip_frac (the dual clip binds), behav_clip_frac (tokens
    ``behav_clip`` zeroes, or would zero when off), approx_kl (k3 estimate of KL(π_prox‖π_θ)), num_tokens.
    """
    _same_shape(
        "decoupled_ppo_loss",
        logp=logp,
        prox_logp=prox_logp,
        behav_logp=behav_logp,
        advantages=advantages,
        loss_mask=loss_mask,
    )
    _check_ppo_bounds(clip_low, clip_high, behav_weight_cap, behav_reject_above, dual_clip)
    keep = loss_mask != 0
    # Select before any arithmetic so that garbage in padding can't become NaN in value or gradient.
    logp = torch.where(keep, logp, 0.0)
    prox = torch.where(keep, prox_logp.detach(), 0.0)
    behav = torch.where(keep, behav_logp.detach(), 0.0)
    adv = torch.where(keep, advantages.detach(), 0.0)

    ratio = torch.exp(logp - prox)
    surr = ratio * adv
    surr_clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    pg = -torch.minimum(surr, surr_clipped)
    dual = torch.zeros_like(keep)
    if dual_clip is not None:
        # −c·A is the largest a negative-advantage token's term may be; with A ≥ 0 nothing changes.
        dual = (adv < 0) & (pg > -dual_clip * adv)
        pg = torch.where(dual, -dual_clip * adv, pg)
    behav_ratio = torch.exp(prox - behav)
    w = truncated_weights(behav_ratio, behav_weight_cap, behav_reject_above)
    moved = ((adv > 0) & (behav_ratio > 1.0 + clip_high)) | ((adv < 0) & (behav_ratio < 1.0 - clip_low))
    if behav_clip:
        w = torch.where(moved, 0.0, w)
    loss = _aggregate(w * pg, loss_mask, agg, norm_const)
    metrics = _ppo_metrics(
        logp, prox, keep, behav_ratio, surr, surr_clipped, dual, moved, behav_weight_cap, behav_reject_above
    )
    return loss, metrics


def _ppo_metrics(
    logp: Tensor,
    prox: Tensor,
    keep: Tensor,
    behav_ratio: Tensor,
    surr: Tensor,
    surr_clipped: Tensor,
    dual: Tensor,
    moved: Tensor,
    behav_weight_cap: float | None,
    behav_reject_above: float | None,
) -> dict[str, Tensor]:
    """decoupled_ppo_loss's metrics (see its docstring), detached, from its masked intermediates."""
    with torch.no_grad():
        agent = keep.to(logp.dtype)
        n = keep.sum()
        cap = float("inf") if behav_weight_cap is None else behav_weight_cap
        reject = float("inf") if behav_reject_above is None else behav_reject_above
        log_r = logp - prox
        return {
            "is_weight_mean": masked_mean(behav_ratio, agent),
            "is_weight_max": behav_ratio[keep].max() if n > 0 else behav_ratio.new_zeros(()),
            "is_truncated_frac": masked_mean((behav_ratio > cap).to(agent.dtype), agent),
            "is_rejected_frac": masked_mean((behav_ratio > reject).to(agent.dtype), agent),
            "clip_frac": masked_mean((surr_clipped < surr).to(agent.dtype), agent),
            "dual_clip_frac": masked_mean(dual.to(agent.dtype), agent),
            "behav_clip_frac": masked_mean(moved.to(agent.dtype), agent),
            "approx_kl": masked_mean(torch.expm1(log_r) - log_r, agent),
            "num_tokens": n.to(agent.dtype),
        }


def policy_gradient_loss(
    logp: Tensor,
    behav_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    behav_weight_cap: float | None = 5.0,
    behav_reject_above: float | None = None,
    agg: Agg = "token_mean",
    norm_const: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """REINFORCE with truncated importance sampling: one gradient step per batch, no clip.

    "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in
    LLMs" (Ahmadian et al., arXiv 2402.14740) for the estimator; the weight is IMPALA's truncated
    ρ (Espeholt et al., arXiv 1802.01561). Per agent token::

        w_t = min(π_θ(a_t|s_t) / μ(a_t|s_t), C)   (no gradient)
        ℓ_t = −w_t · A_t · π_θ(a_t|s_t) / sg(π_θ(a_t|s_t))   → value −w_t·A_t, gradient −w_t·A_t·∇log π_θ

    This is :func:`decoupled_ppo_loss` with the proximal policy set to the current one
    (prox_logp = logp.detach()), so r_t = 1 and the clip never binds; it is what a single
    optimizer step per batch computes. Arguments and metrics are those of decoupled_ppo_loss.
    """
    return decoupled_ppo_loss(
        logp,
        logp.detach(),
        behav_logp,
        advantages,
        loss_mask,
        behav_weight_cap=behav_weight_cap,
        behav_reject_above=behav_reject_above,
        agg=agg,
        norm_const=norm_const,
    )


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: Literal["k1", "k2", "k3"]) -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from tokens sampled by π_θ; [B, T] in, [B, T] out.

    John Schulman, "Approximating KL Divergence" (blog post, 2020), with log ρ = log π_ref − log π_θ::

        k1 = −log ρ                 unbiased, high variance, can be negative
        k2 = ½ (log ρ)²             biased, low variance
        k3 = (ρ − 1) − log ρ        unbiased, low variance, ≥ 0 ("low_var_kl")

    k3 clamps log ρ to [−20, 20] before the exponential and the result to at most 10, as verl's
    low_var_kl does, so one token whose probabilities disagree wildly cannot dominate the loss.
    Masking is the caller's: ``masked_mean(kl_penalty(...), loss_mask)``.
    """
    _same_shape("kl_penalty", logp=logp, ref_logp=ref_logp)
    if kind == "k1":
        return logp - ref_logp
    if kind == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    if kind == "k3":
        log_rho = (ref_logp - logp).clamp(-20.0, 20.0)
        return (torch.exp(log_rho) - 1.0 - log_rho).clamp(max=10.0)
    raise ValueError(f"kl_penalty kind must be 'k1', 'k2' or 'k3', got {kind!r}")


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, loss_mask: Tensor, clip: float | None) -> Tensor:
    """PPO's clipped value loss, mean over agent tokens (normaliser as ``token_mean``).

    From OpenAI Baselines' PPO2, discussed in "Implementation Matters in Deep Policy Gradients"
    (Engstrom et al., arXiv 2005.12729), with V the value head, V_old its values at rollout time and
    R the GAE returns::

        V_clip = V_old + clip(V − V_old, −ε_v, ε_v)
        ℓ_t    = ½ · max((V − R)², (V_clip − R)²)        (clip=None: ℓ_t = ½ (V − R)²)
    """
    _same_shape("value_loss", values=values, old_values=old_values, returns=returns, loss_mask=loss_mask)
    keep = loss_mask != 0
    v = torch.where(keep, values, 0.0)
    ret = torch.where(keep, returns.detach(), 0.0)
    err = (v - ret) ** 2
    if clip is not None:
        if not clip > 0:
            raise ValueError(f"value_loss clip must be > 0 or None, got {clip}")
        old = torch.where(keep, old_values.detach(), 0.0)
        v_clip = old + (v - old).clamp(-clip, clip)
        err = torch.maximum(err, (v_clip - ret) ** 2)
    return _aggregate(0.5 * err, loss_mask, "token_mean", None)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy H = logsumexp(z) − Σ_v softmax(z)_v · z_v of each position's distribution.

    [..., V] logits in (finite values), [...] float32 entropies out (upcast first: bf16 sums over
    a large vocabulary lose several digits). Divide the logits by the sampling temperature first
    to get the entropy of the distribution the engine sampled from.
    """
    z = logits.float()
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1)


def staleness_weights(
    token_versions: Tensor,
    current_version: int,
    max_staleness: int,
    mode: Literal["drop", "downweight"],
    decay: float = 0.5,
) -> Tensor:
    """Per-token weight from staleness s = current_version − version of the token's weights.

    With K = max_staleness: weight 1 if s ≤ K, else 0 ("drop") or decay^(s − K) ("downweight").
    Staleness bounds are AReaL's η (arXiv 2505.24298); here they act per token, because one
    multi-turn episode can span several weight versions. Tokens with a negative version
    (prompt/environment tokens, which no policy produced) get 1: masking them is loss_mask's job.
    Multiply the result into loss_mask. A version newer than ``current_version`` is an error
    (the learner lost track of its own version, e.g. after resuming from an older checkpoint).
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    if mode not in ("drop", "downweight"):
        raise ValueError(f"staleness mode must be 'drop' or 'downweight', got {mode!r}")
    if mode == "downweight" and not 0 < decay <= 1:
        raise ValueError(f"staleness decay must be in (0, 1], got {decay}")
    if token_versions.dtype.is_floating_point:
        raise ValueError(f"token_versions must be an integer tensor, got {token_versions.dtype}")
    if token_versions.numel() and int(token_versions.max()) > current_version:
        raise ValueError(
            f"token version {int(token_versions.max())} is newer than current_version "
            f"{current_version}: versions must come from the learner that is training on them"
        )
    excess = (current_version - token_versions) - max_staleness
    over = (excess > 0) & (token_versions >= 0)
    if mode == "drop":
        return torch.where(over, 0.0, 1.0)
    w = torch.pow(decay, excess.clamp(min=0).float())
    return torch.where(over, w, 1.0)
