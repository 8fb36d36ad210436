"""learner/algorithms/losses.py: hand-computed values, the on-policy / PPO equalities, gradients, masking."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym.learner.algorithms.losses import (
    decoupled_ppo_loss,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    masked_whiten,
    policy_gradient_loss,
    staleness_weights,
    value_loss,
)

NAN = float("nan")
L = math.log


def test_masked_mean_by_hand_ignores_nan_and_empty_rows_give_zero() -> None:
    x = torch.tensor([[1.0, 2.0, NAN], [torch.inf, 5.0, 6.0], [7.0, 8.0, 9.0]], requires_grad=True)
    m = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    # (1 + 2 + 5) / 3
    assert masked_mean(x, m).item() == pytest.approx(8 / 3)
    assert masked_mean(x, m, dim=-1).tolist() == [1.5, 5.0, 0.0]
    masked_mean(x, m).backward()
    assert torch.equal(x.grad, m / 3)  # finite, and exactly 0 where masked
    # weights: (1·1 + 0.5·3) / 1.5
    w = torch.tensor([1.0, 0.5])
    assert masked_mean(torch.tensor([1.0, 3.0]), w).item() == pytest.approx(2.5 / 1.5)


def test_masked_whiten_by_hand() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    m = torch.tensor([1, 1, 1, 0])
    # mean 2, population variance 2/3 -> (x - 2) / sqrt(2/3); masked entry 0
    s = math.sqrt(2 / 3)
    assert torch.allclose(masked_whiten(x, m), torch.tensor([-1 / s, 0.0, 1 / s, 0.0]), atol=1e-6)
    # shift_mean=False keeps the mean: (x - 2) / s + 2
    assert torch.allclose(
        masked_whiten(x, m, shift_mean=False), torch.tensor([2 - 1 / s, 2.0, 2 + 1 / s, 0.0]), atol=1e-6
    )
    assert torch.equal(masked_whiten(torch.full((3,), 4.0), torch.ones(3)), torch.zeros(3))


@given(
    st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=40),
    st.lists(st.booleans(), min_size=2, max_size=40),
)
@settings(max_examples=60, deadline=None)
def test_whitening_gives_mean_0_and_variance_1_over_the_mask(xs: list[float], keep: list[bool]) -> None:
    n = min(len(xs), len(keep))
    x = torch.tensor(xs[:n], dtype=torch.float64)
    m = torch.tensor(keep[:n])
    sel = x[m]
    if sel.numel() < 2 or float(sel.var(unbiased=False)) < 1e-3:
        return  # variance too small for eps not to matter
    out = masked_whiten(x, m, eps=1e-12)
    assert abs(float(out[m].mean())) < 1e-9
    assert float(out[m].var(unbiased=False)) == pytest.approx(1.0, abs=1e-9)
    assert torch.equal(out[~m], torch.zeros_like(out[~m]))


def _hand_batch() -> tuple[torch.Tensor, ...]:
    """Three agent tokens a, b (row 0) and c (row 1); position 0 and row 1's last are not agent tokens.

    a: π_prox 0.5, π_θ 0.7 -> r 1.4; μ 0.25 -> w 2;            A +1
    b: π_prox 0.5, π_θ 0.3 -> r 0.6; μ 0.5  -> w 1;            A +1
    c: π_prox 0.5, π_θ 0.3 -> r 0.6; μ 0.05 -> w 10 (cap 5);   A -1
    """
    logp = torch.tensor([[NAN, L(0.7), L(0.3)], [NAN, L(0.3), NAN]], requires_grad=True)
    prox = torch.tensor([[NAN, L(0.5), L(0.5)], [torch.inf, L(0.5), NAN]])
    behav = torch.tensor([[NAN, L(0.25), L(0.5)], [NAN, L(0.05), -torch.inf]])
    adv = torch.tensor([[NAN, 1.0, 1.0], [NAN, -1.0, 123.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    return logp, prox, behav, adv, mask


def test_decoupled_ppo_by_hand() -> None:
    logp, prox, behav, adv, mask = _hand_batch()
    # a: min(1.4·1, clip(1.4, .8, 1.2)·1) = 1.2 (clipped)   -> ℓ = -2 · 1.2  = -2.4
    # b: min(0.6·1, clip(0.6)·1 = 0.8)     = 0.6             -> ℓ = -1 · 0.6  = -0.6
    # c: min(0.6·-1, 0.8·-1)               = -0.8 (clipped)  -> ℓ = -5 · -0.8 = 4.0
    loss, m = decoupled_ppo_loss(logp, prox, behav, adv, mask, clip_low=0.2, clip_high=0.2, behav_weight_cap=5.0)
    assert loss.item() == pytest.approx((-2.4 - 0.6 + 4.0) / 3)
    assert m["is_weight_mean"].item() == pytest.approx((2 + 1 + 10) / 3)
    assert m["is_weight_max"].item() == pytest.approx(10.0)
    assert m["is_truncated_frac"].item() == pytest.approx(1 / 3)
    assert m["is_rejected_frac"].item() == 0.0
    assert m["clip_frac"].item() == pytest.approx(2 / 3)
    # k3 = (r - 1) - log r per token
    kl = ((0.4 - L(1.4)) + 2 * (-0.4 - L(0.6))) / 3
    assert m["approx_kl"].item() == pytest.approx(kl, rel=1e-5)
    assert m["num_tokens"].item() == 3.0
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    # a and c are clipped (no gradient); b: dℓ/dlogp = -w·r·A / 3 = -0.6 / 3; NaN padding gets 0
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0, -0.2], [0.0, 0.0, 0.0]]))


def test_dual_clip_bounds_negative_advantage_tokens_by_hand() -> None:
    # ratios 5, 2, 5 (w = 1): with A = -1, PPO's term is max(r, clip(r)) = r; the dual clip caps it
    # at c = 3 and takes its gradient; with A = +1 the dual clip never acts (the clip already does).
    logp = torch.tensor([[L(5.0), L(2.0), L(5.0)]], requires_grad=True)
    zeros = torch.zeros(1, 3)
    adv, mask = torch.tensor([[-1.0, -1.0, 1.0]]), torch.ones(1, 3)
    loss, m = decoupled_ppo_loss(logp, zeros, zeros, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    assert loss.item() == pytest.approx((3.0 + 2.0 - 1.2) / 3)
    assert m["dual_clip_frac"].item() == pytest.approx(1 / 3)
    loss.backward()
    # token a: capped (no gradient); b: dℓ/dlogp = -r·A / 3 = 2/3; c: clipped above (no gradient)
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 2 / 3, 0.0]]))
    plain, m0 = decoupled_ppo_loss(logp, zeros, zeros, adv, mask, clip_low=0.2, clip_high=0.2)
    assert plain.item() == pytest.approx((5.0 + 2.0 - 1.2) / 3) and m0["dual_clip_frac"].item() == 0.0
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        decoupled_ppo_loss(logp, zeros, zeros, adv, mask, dual_clip=1.0)


def test_behav_clip_zeroes_tokens_already_moved_their_advantages_way_by_hand() -> None:
    # π_prox/μ per token: 1.5, 1.5, 0.5, 0.5, 1.1 with A = +1, -1, -1, +1, -1 (clip 0.2 / 0.28).
    # a (A > 0, already up past 1.28) and c (A < 0, already down past 0.8) have done what their
    # advantage asks: behav_clip zeroes them; b and d ask for the way back, e is inside the range.
    prox = torch.tensor([[L(1.5), L(1.5), L(0.5), L(0.5), L(1.1)]])
    logp = prox.clone().requires_grad_(True)  # one optimizer step per batch: π_θ = π_prox, r = 1
    behav, mask = torch.zeros(1, 5), torch.ones(1, 5)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, -1.0]])
    kw = {"clip_low": 0.2, "clip_high": 0.28, "behav_weight_cap": None}
    loss, m = decoupled_ppo_loss(logp, prox, behav, adv, mask, behav_clip=True, **kw)
    # ℓ = −w·r·A with w = π_prox/μ: b +1.5, d −0.5, e +1.1; a and c contribute 0, counted in the mean
    assert loss.item() == pytest.approx((1.5 - 0.5 + 1.1) / 5)
    assert m["behav_clip_frac"].item() == pytest.approx(2 / 5)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 1.5, 0.0, -0.5, 1.1]]) / 5)
    off, m_off = decoupled_ppo_loss(logp, prox, behav, adv, mask, **kw)
    assert off.item() == pytest.approx((-1.5 + 1.5 + 0.5 - 0.5 + 1.1) / 5)
    assert m_off["behav_clip_frac"].item() == pytest.approx(2 / 5)  # reported even when off
    # fresh data (π_prox = μ): it never binds
    fresh, m_fresh = decoupled_ppo_loss(logp, prox, prox, adv, mask, behav_clip=True, **kw)
    assert fresh.item() == pytest.approx(-adv.mean().item()) and m_fresh["behav_clip_frac"].item() == 0.0


def test_decoupled_ppo_clip_higher_rejection_and_aggregations_by_hand() -> None:
    logp, prox, behav, adv, mask = _hand_batch()
    # clip-higher: a -> min(1.4, 1.28) = 1.28 -> -2.56
    loss, _ = decoupled_ppo_loss(logp, prox, behav, adv, mask, clip_high=0.28)
    assert loss.item() == pytest.approx((-2.56 - 0.6 + 4.0) / 3)
    # rejection above 5: c's weight becomes 0, it still counts in the normaliser
    loss, m = decoupled_ppo_loss(logp, prox, behav, adv, mask, behav_reject_above=5.0)
    assert loss.item() == pytest.approx((-2.4 - 0.6 + 0.0) / 3)
    assert m["is_rejected_frac"].item() == pytest.approx(1 / 3)
    # no cap: c -> -10 · -0.8 = 8
    loss, _ = decoupled_ppo_loss(logp, prox, behav, adv, mask, behav_weight_cap=None)
    assert loss.item() == pytest.approx((-2.4 - 0.6 + 8.0) / 3)
    # per sequence: row 0 mean (-2.4 - 0.6) / 2 = -1.5, row 1: 4.0
    loss, _ = decoupled_ppo_loss(logp, prox, behav, adv, mask, agg="seq_mean_token_mean")
    assert loss.item() == pytest.approx((-1.5 + 4.0) / 2)
    # Dr. GRPO: row sums / 4, mean over rows
    loss, _ = decoupled_ppo_loss(logp, prox, behav, adv, mask, agg="seq_mean_token_sum_norm", norm_const=4)
    assert loss.item() == pytest.approx((-3.0 / 4 + 4.0 / 4) / 2)
    with pytest.raises(ValueError, match="norm_const"):
        decoupled_ppo_loss(logp, prox, behav, adv, mask, agg="seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="agg must be one of"):
        decoupled_ppo_loss(logp, prox, behav, adv, mask, agg="sum")  # type: ignore[arg-type]  # a wrong value on purpose: the error is what is tested
    # a fractional mask entry is a weight; the normaliser still counts the token once
    half = mask.clone()
    half[1, 1] = 0.5
    loss, _ = decoupled_ppo_loss(logp, prox, behav, adv, half)
    assert loss.item() == pytest.approx((-2.4 - 0.6 + 0.5 * 4.0) / 3)


def _random_batch(seed: int, B: int = 4, T: int = 7) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g) * 3
    prox = logp + 0.3 * torch.randn(B, T, generator=g)
    behav = prox + 0.5 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    mask[:, 0] = 0
    return logp, prox, behav, adv, mask


def _plain_ppo_clip(logp, old, adv, mask, eps_low, eps_high):
    r = torch.exp(logp - old)
    per_token = -torch.min(r * adv, r.clamp(1 - eps_low, 1 + eps_high) * adv)
    return (per_token * mask).sum() / mask.sum()


@pytest.mark.parametrize("seed", range(5))
def test_without_staleness_decoupled_ppo_is_exactly_ppo_clip(seed: int) -> None:
    logp, prox, _, adv, mask = _random_batch(seed)
    loss, m = decoupled_ppo_loss(logp, prox, prox, adv, mask, clip_low=0.2, clip_high=0.28)
    assert torch.equal(loss, _plain_ppo_clip(logp, prox, adv, mask, 0.2, 0.28))
    assert m["is_weight_mean"].item() == 1.0 and m["is_weight_max"].item() == 1.0
    assert m["clip_frac"].item() > 0  # the comparison exercised the clip


@pytest.mark.parametrize("seed", range(5))
def test_all_policies_equal_gives_the_on_policy_gradient_exactly(seed: int) -> None:
    logp0, _, _, adv, mask = _random_batch(seed)
    logp = logp0.clone().requires_grad_()
    loss, m = decoupled_ppo_loss(logp, logp0, logp0, adv, mask)
    # value: -mean(A) over agent tokens; gradient: that of the REINFORCE surrogate -mean(A·logp)
    assert torch.equal(loss, (-adv * mask).sum() / mask.sum())
    loss.backward()
    ref = logp0.clone().requires_grad_()
    (-(adv * ref) * mask).sum().div(mask.sum()).backward()
    assert torch.equal(logp.grad, ref.grad)
    assert m["clip_frac"].item() == 0.0 and m["approx_kl"].item() == 0.0


def test_policy_gradient_loss_gradient_is_minus_truncated_weight_times_advantage() -> None:
    logp0, _, behav, adv, mask = _random_batch(7)
    logp = logp0.clone().requires_grad_()
    loss, m = policy_gradient_loss(logp, behav, adv, mask, behav_weight_cap=2.0)
    w = torch.exp(logp0 - behav).clamp(max=2.0)
    assert loss.item() == pytest.approx(float((-w * adv * mask).sum() / mask.sum()), rel=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, -w * adv * mask / mask.sum(), atol=1e-7)
    assert m["is_truncated_frac"].item() > 0 and m["clip_frac"].item() == 0.0


@given(
    seed=st.integers(0, 10_000),
    garbage=st.sampled_from([NAN, torch.inf, -torch.inf, 1e30, 0.0]),
    pad=st.integers(1, 5),
    agg=st.sampled_from(["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]),
)
@settings(max_examples=60, deadline=None)
def test_masked_and_padding_tokens_never_change_the_loss_or_its_gradient(
    seed: int, garbage: float, pad: int, agg: str
) -> None:
    logp, prox, behav, adv, mask = _random_batch(seed)
    off = mask == 0
    kw = dict(agg=agg, norm_const=16.0)

    def run(lp, px, bh, ad, mk):
        lp = lp.clone().requires_grad_()
        loss, metrics = decoupled_ppo_loss(lp, px, bh, ad, mk, **kw)
        loss.backward()
        return loss, lp.grad, metrics

    base, grad, metrics = run(logp, prox, behav, adv, mask)
    # garbage under the mask: bit-identical loss, gradient and metrics
    dirty = [torch.where(off, garbage, t) for t in (logp, prox, behav, adv)]
    loss2, grad2, metrics2 = run(*dirty, mask)
    assert torch.equal(base, loss2) and torch.equal(grad[~off], grad2[~off])
    assert torch.equal(grad2[off], torch.zeros_like(grad2[off]))
    assert all(torch.equal(metrics[k], metrics2[k]) for k in metrics)

    # extra padding columns and an all-padding row: the same loss (summation order may differ)
    def widen(t: torch.Tensor, fill: float) -> torch.Tensor:
        t = torch.cat([t, torch.full((t.shape[0], pad), fill)], dim=1)
        return torch.cat([t, torch.full((1, t.shape[1]), fill)], dim=0)

    loss3, grad3, _ = run(*(widen(t, garbage) for t in (logp, prox, behav, adv)), widen(mask, 0.0))
    assert torch.allclose(base, loss3, rtol=1e-6, atol=1e-7)
    assert torch.allclose(grad, grad3[:-1, : grad.shape[1]], rtol=1e-6, atol=1e-9)


def test_kl_penalty_estimators_by_hand_and_the_k3_clamp() -> None:
    logp, ref = torch.tensor([L(0.5)]), torch.tensor([L(0.25)])
    # log ρ = log(0.25/0.5) = -ln 2
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(L(2))
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * L(2) ** 2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + L(2))  # ρ - 1 - log ρ
    # log ρ = 40, -40 (both clamped to 10), -5: e^-5 - 1 + 5 (below the clamp)
    big = kl_penalty(torch.tensor([-40.0, 0.0, 0.0]), torch.tensor([0.0, -40.0, -5.0]), "k3")
    assert big.tolist() == pytest.approx([10.0, 10.0, math.exp(-5) + 4])
    x = torch.randn(1000, dtype=torch.float64)
    assert (kl_penalty(x, torch.randn(1000, dtype=torch.float64), "k3") >= 0).all()
    # k3's gradient w.r.t. logp is 1 - π_ref/π_θ
    lp = torch.tensor([L(0.5)], requires_grad=True)
    kl_penalty(lp, ref, "k3").sum().backward()
    assert lp.grad.item() == pytest.approx(1 - 0.5)
    with pytest.raises(ValueError, match="'k4'"):
        kl_penalty(logp, ref, "k4")  # type: ignore[arg-type]  # a wrong value on purpose: the error is what is tested


def test_value_loss_clipping_by_hand() -> None:
    v = torch.tensor([[0.5, 1.0, NAN]], requires_grad=True)
    old = torch.tensor([[0.0, 1.0, NAN]])
    ret = torch.tensor([[1.0, 0.0, NAN]])
    mask = torch.tensor([[1, 1, 0]])
    # token 0: (0.5-1)^2 = 0.25; clipped V = 0 + 0.2 -> (0.2-1)^2 = 0.64; max -> 0.64
    # token 1: (1-0)^2 = 1 both ways
    loss = value_loss(v, old, ret, mask, 0.2)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 1.0) / 2)
    loss.backward()
    # token 0's max is the clipped term, whose V-gradient is 0 outside the clip range
    assert torch.allclose(v.grad, torch.tensor([[0.0, 0.5, 0.0]]))
    assert value_loss(v, old, ret, mask, None).item() == pytest.approx(0.5 * (0.25 + 1.0) / 2)


def test_entropy_from_logits_by_hand_and_against_categorical() -> None:
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, L(3), -1e4, -1e4]])
    # uniform over 4: ln 4; p = (1/4, 3/4): -(1/4 ln 1/4 + 3/4 ln 3/4)
    h = entropy_from_logits(logits)
    assert h.tolist() == pytest.approx([L(4), -(0.25 * L(0.25) + 0.75 * L(0.75))], rel=1e-6)
    z = torch.randn(3, 5, 50, dtype=torch.bfloat16)
    ref = torch.distributions.Categorical(logits=z.float()).entropy()
    assert entropy_from_logits(z).dtype == torch.float32
    assert torch.allclose(entropy_from_logits(z), ref, atol=1e-5)


def test_staleness_weights_drop_and_downweight_by_hand() -> None:
    versions = torch.tensor([[-1, 0, 1, 2, 3, 5]])
    # current 5, K = 2: staleness (-, 5, 4, 3, 2, 0); over the bound by (-, 3, 2, 1, 0, 0)
    assert staleness_weights(versions, 5, 2, "drop").tolist() == [[1.0, 0.0, 0.0, 0.0, 1.0, 1.0]]
    down = staleness_weights(versions, 5, 2, "downweight", decay=0.5)
    assert down.tolist() == [[1.0, 0.125, 0.25, 0.5, 1.0, 1.0]]
    assert staleness_weights(versions, 5, 0, "downweight", decay=1.0).tolist() == [[1.0] * 6]
    assert staleness_weights(torch.tensor([0]), 10_000, 0, "downweight").tolist() == [0.0]  # underflows cleanly
    with pytest.raises(ValueError, match="token version 5 is newer than current_version 4"):
        staleness_weights(versions, 4, 2, "drop")
    with pytest.raises(ValueError, match="'keep'"):
        staleness_weights(versions, 5, 2, "keep")  # type: ignore[arg-type]  # a wrong value on purpose: the error is what is tested
    with pytest.raises(ValueError, match="decay"):
        staleness_weights(versions, 5, 2, "downweight", decay=1.5)


def test_bad_inputs_are_named() -> None:
    a, b = torch.zeros(2, 3), torch.zeros(2, 4)
    with pytest.raises(ValueError, match=r"advantages.*\(2, 4\)"):
        decoupled_ppo_loss(a, a, a, b, a)
    with pytest.raises(ValueError, match="clip_low=1.5"):
        decoupled_ppo_loss(a, a, a, a, a, clip_low=1.5)
    with pytest.raises(ValueError, match="behav_weight_cap must be > 0 or None, got 0"):
        decoupled_ppo_loss(a, a, a, a, a, behav_weight_cap=0)
