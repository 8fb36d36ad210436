"""learner/model/logprobs.py: hand values, chunking, temperature, and a tiny real transformers model."""

from __future__ import annotations

import math

import pytest
import torch

from agentgym.learner.model import logprobs as lp_mod
from agentgym.learner.model.logprobs import sequence_logprobs, token_logprobs


def reference(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The direct computation: full log_softmax at t-1, gather token t, 0 at position 0."""
    lsm = torch.log_softmax(logits.float() / temperature, dim=-1)
    out = lsm[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros(ids.shape[0], 1), out], dim=1)


def test_token_logprobs_by_hand() -> None:
    # vocabulary of 3; the logits at t predict token t + 1
    logits = torch.tensor([[[0.0, 0.0, 0.0], [0.0, math.log(2), 0.0], [5.0, 5.0, 5.0]]])
    ids = torch.tensor([[2, 0, 1]])
    # t1: uniform -> ln 1/3; t2: p = (1, 2, 1)/4 for token 1 -> ln 1/2
    out = token_logprobs(logits, ids)
    assert out[0].tolist() == pytest.approx([0.0, math.log(1 / 3), math.log(1 / 2)])
    # τ = 2: z/τ = (0, ln 2 / 2, 0) -> p(1) = √2 / (2 + √2)
    out = token_logprobs(logits, ids, temperature=2.0)
    assert out[0, 2].item() == pytest.approx(math.log(math.sqrt(2) / (2 + math.sqrt(2))))
    assert out[0, 1].item() == pytest.approx(math.log(1 / 3))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_elements", [1 << 24, 1, 200])
def test_token_logprobs_match_log_softmax_in_every_chunking(
    temperature: float, chunk_elements: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a budget of 1 element forces one position per chunk; 200 gives chunks of 2 positions
    monkeypatch.setattr(lp_mod, "_CHUNK_ELEMENTS", chunk_elements)
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(3, 9, 50, generator=g)).requires_grad_()
    ids = torch.randint(0, 50, (3, 9), generator=g)
    out = token_logprobs(logits, ids, temperature)
    ref = reference(logits, ids, temperature)
    torch.testing.assert_close(out, ref, rtol=0, atol=2e-6)
    (grad,) = torch.autograd.grad(out.sum(), logits)
    (grad_ref,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(grad, grad_ref, rtol=0, atol=1e-6)
    assert torch.equal(grad[:, -1], torch.zeros_like(grad[:, -1]))  # the last logits predict nothing


def test_bfloat16_logits_are_evaluated_in_float32() -> None:
    g = torch.Generator().manual_seed(1)
    logits = (4 * torch.randn(2, 6, 1000, generator=g)).to(torch.bfloat16)
    ids = torch.randint(0, 1000, (2, 6), generator=g)
    out = token_logprobs(logits, ids)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, reference(logits.float(), ids), rtol=0, atol=2e-6)


def test_bad_ids_and_temperature_are_named() -> None:
    logits = torch.zeros(1, 3, 5)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 5\).*max 5"):
        token_logprobs(logits, torch.tensor([[0, 1, 5]]))
    with pytest.raises(ValueError, match="temperature must be > 0, got 0"):
        token_logprobs(logits, torch.zeros(1, 3, dtype=torch.long), temperature=0)
    with pytest.raises(ValueError, match=r"\(1, 3, 5\) and \(1, 4\)"):
        token_logprobs(logits, torch.zeros(1, 4, dtype=torch.long))


@pytest.fixture(scope="module")
def tiny_qwen2() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=50,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(cfg).eval()


def test_sequence_logprobs_on_a_tiny_qwen2_match_log_softmax_and_ignore_padding(tiny_qwen2: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 50, (2, 10), generator=g)
    attn = torch.ones(2, 10, dtype=torch.long)
    ids[1, 6:] = 0  # row 1 is 6 tokens long, right-padded
    attn[1, 6:] = 0
    tau = 0.8
    with torch.no_grad():
        logp, ent = sequence_logprobs(tiny_qwen2, ids, attn, tau, return_entropy=True)
        logits = tiny_qwen2(input_ids=ids, attention_mask=attn).logits
        alone = sequence_logprobs(tiny_qwen2, ids[1:, :6], attn[1:, :6], tau)
    ref = reference(logits, ids, tau) * attn
    torch.testing.assert_close(logp, ref, rtol=0, atol=2e-6)
    # padding gets 0; the padded row's real tokens have the logprobs of the same sequence alone
    assert torch.equal(logp[1, 6:], torch.zeros(4)) and torch.equal(ent[1, 6:], torch.zeros(4))
    torch.testing.assert_close(logp[1:, :6], alone, rtol=0, atol=2e-6)
    ent_ref = torch.distributions.Categorical(logits=logits[:, :-1] / tau).entropy()
    torch.testing.assert_close(ent[:, 1:] * attn[:, 1:], ent_ref * attn[:, 1:], rtol=0, atol=2e-5)
    assert torch.equal(ent[:, 0], torch.zeros(2))
    # temperature matters: the same tokens under τ = 1 have other logprobs
    with torch.no_grad():
        assert not torch.allclose(sequence_logprobs(tiny_qwen2, ids, attn), logp)


def test_sequence_logprobs_backpropagate_into_the_model(tiny_qwen2: torch.nn.Module) -> None:
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(3))
    attn = torch.ones_like(ids)
    tiny_qwen2.zero_grad(set_to_none=True)
    sequence_logprobs(tiny_qwen2, ids, attn).sum().backward()
    grad = tiny_qwen2.get_input_embeddings().weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    tiny_qwen2.zero_grad(set_to_none=True)


def test_only_the_needed_tokens_get_logits_and_the_same_values_and_gradients(tiny_qwen2: torch.nn.Module) -> None:
    """``needed`` (the agent's tokens): the LM head runs on those positions only, and their
    logprobs, entropies and gradients are those of the full pass; every other position is 0."""
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 50, (3, 12), generator=g)
    attn = torch.ones_like(ids)
    attn[2, 7:] = 0
    needed = torch.rand(3, 12, generator=g) < 0.3
    needed[0, 0] = needed[2, 9] = True  # position 0 (no context) and padding: never computed
    banned = torch.tensor([5, 7])
    seen: list[tuple[int, ...]] = []
    hook = tiny_qwen2.get_output_embeddings().register_forward_hook(lambda _m, a, _o: seen.append(tuple(a[0].shape)))
    try:
        runs = {}
        for name, want in (("full", None), ("needed", needed)):
            tiny_qwen2.zero_grad(set_to_none=True)
            logp, ent = sequence_logprobs(tiny_qwen2, ids, attn, 0.7, return_entropy=True, banned=banned, needed=want)
            (logp.sum() + ent.sum()).backward()  # the full pass: masked below to the needed tokens
            runs[name] = (logp, ent)
        real = needed & (attn != 0)
        real[:, 0] = False
        full_logp, full_ent = runs["full"]
        logp, ent = runs["needed"]
        torch.testing.assert_close(logp, torch.where(real, full_logp, 0.0), rtol=0, atol=2e-6)
        torch.testing.assert_close(ent, torch.where(real, full_ent, 0.0), rtol=0, atol=2e-5)
        assert seen[0] == (3, 12, 64) and seen[1] == (1, int(real.sum()), 64)  # logits of N rows, not B·T
        # gradients: the needed pass's equal the full pass's restricted to the needed tokens
        grads = {}
        for name, want in (("full", None), ("needed", needed)):
            tiny_qwen2.zero_grad(set_to_none=True)
            lp, en = sequence_logprobs(tiny_qwen2, ids, attn, 0.7, return_entropy=True, banned=banned, needed=want)
            (torch.where(real, lp + en, 0.0)).sum().backward()
            grads[name] = [p.grad.clone() for p in tiny_qwen2.parameters()]
        for a, b in zip(grads["full"], grads["needed"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    finally:
        hook.remove()
        tiny_qwen2.zero_grad(set_to_none=True)
    # a "model" without an output-embeddings module gets the full pass, then the same masking
    logits = torch.randn(3, 12, 50, generator=g)
    full = sequence_logprobs(_Fixed(logits), ids, attn, needed=None)
    part = sequence_logprobs(_Fixed(logits), ids, attn, needed=needed)
    assert torch.equal(part, torch.where(needed & (attn != 0), full, 0.0))
    with pytest.raises(ValueError, match="needed"):
        sequence_logprobs(tiny_qwen2, ids, attn, needed=needed[:, :5])


def test_banned_ids_get_probability_zero_where_an_action_could_hold_them() -> None:
    from agentgym.actors.engines.hf_engine import sample

    # vocabulary of 4, id 3 banned (a special token): at t1 the next token (1) is allowed, so the
    # distribution is renormalised over {0, 1, 2}; at t2 the next token IS 3 (a prompt's own
    # special token): its logprob stays the unmasked one, finite.
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(2), 0.0, 9.0], [1.0, 1.0, 1.0, 1.0]]])
    ids = torch.tensor([[2, 1, 3]])
    banned = torch.tensor([3])
    out = token_logprobs(logits, ids, banned=banned)
    assert out[0, 1].item() == pytest.approx(math.log(1 / 3))
    assert out[0, 2].item() == pytest.approx(math.log(math.exp(9.0) / (4 + math.exp(9.0))), abs=1e-6)
    # With a logit of 9 on the banned id the unbanned policy would pick it ~98% of the time.
    gen = torch.Generator().manual_seed(0)
    picks = [sample(logits[0, 1], 1.0, 1.0, gen, (3,)) for _ in range(200)]
    assert {t for t, _ in picks} <= {0, 1, 2}
    assert all(lp == pytest.approx(math.log((2 if t == 1 else 1) / 4)) for t, lp in picks)
    # Entropy stays finite and is that of the renormalised distribution.
    model = _Fixed(logits)
    logp, ent = sequence_logprobs(model, ids, torch.ones_like(ids), return_entropy=True, banned=banned)
    assert ent[0, 1].item() == pytest.approx(math.log(3), rel=1e-5)  # uniform over the 3 allowed
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all()


class _Fixed(torch.nn.Module):
    """A "model" whose logits are given: the logprob functions' only input from a model."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        return type("Out", (), {"logits": self.logits})()


def test_right_padded_rows_run_without_a_mask_and_give_the_same_logprobs(tmp_path) -> None:  # noqa: ANN001
    """learner/model/logprobs.right_padded: rows that are real tokens then padding need no attention
    mask in a causal LM, so sequence_logprobs runs them without one (the fused causal kernel);
    their logprobs and gradients are those of the masked forward. A row padded on the left is
    not right-padded and keeps its mask."""
    from transformers import AutoModelForCausalLM

    from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model

    model = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "m", corpus=FALLBACK_CORPUS, seed=0))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 150, (3, 12), generator=g)
    mask = torch.tensor([[1] * 12, [1] * 7 + [0] * 5, [1] * 3 + [0] * 9])
    assert lp_mod.right_padded(mask) and lp_mod.right_padded(torch.ones(2, 4))
    assert not lp_mod.right_padded(torch.tensor([[0, 1, 1], [1, 1, 1]])) and not lp_mod.right_padded(
        torch.tensor([[1, 0, 1]])
    )
    ours = sequence_logprobs(model, ids, mask, 1.0)
    ours.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    masked = model(input_ids=ids, attention_mask=mask).logits  # what it ran before: the masked forward
    ref = torch.where(mask != 0, reference(masked, ids), 0.0)
    ref.sum().backward()
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    for a, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)
