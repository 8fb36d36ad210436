"""Per-token logprobs (and entropies) of sequences under a causal LM, as the losses need them.

    logp = sequence_logprobs(model, input_ids, attention_mask, temperature)       # [B, T]
    logp, ent = sequence_logprobs(model, ids, attn, temperature, return_entropy=True)
    logp = token_logprobs(logits, token_ids, temperature)                          # from logits

Position t holds log π(token_t | tokens_<t), read from the logits at t − 1; position 0 (no
context) holds 0, as do padding positions. The temperature divides the logits: the engine
sampled at temperature τ, so its behaviour logprobs are those of softmax(z/τ), and the learner
must evaluate the same distribution or every importance weight is off by the temperature.

Memory: a [B, T, V] logits tensor is large (V ~ 150k); the softmax normaliser is computed in
float32 chunks over T, so without autograd the float32 working set is one chunk. Under autograd
each chunk's float32 copy is kept for the backward pass (free when the logits are already float32
and τ = 1, since then the chunks are views).
"""

from __future__ import annotations

from typing import Literal, Protocol, overload

import torch
from torch import Tensor

# Elements of float32 working memory per chunk (64 MiB).
_CHUNK_ELEMENTS = 1 << 24


class _CausalLMOutput(Protocol):
    logits: Tensor


def _check(fn: str, logits: Tensor, token_ids: Tensor, temperature: float) -> None:
    if logits.dim() != 3 or token_ids.shape != logits.shape[:2]:
        raise ValueError(f"{fn}: need logits [B, T, V] and token_ids [B, T], got "
                         f"{tuple(logits.shape)} and {tuple(token_ids.shape)}")  # fmt: skip
    if not temperature > 0:
        raise ValueError(f"{fn}: temperature must be > 0, got {temperature}")
    V = logits.shape[-1]
    if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= V):
        raise ValueError(f"{fn}: token ids must be in [0, {V}) (the logits' vocabulary), got "
                         f"min {int(token_ids.min())} max {int(token_ids.max())}")  # fmt: skip


def _logprobs_and_entropy(
    logits: Tensor, token_ids: Tensor, temperature: float, want_entropy: bool, banned: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    B, T, V = logits.shape
    if T == 0:
        empty = logits.new_zeros((B, 0), dtype=torch.float32)
        return empty, empty if want_entropy else None
    zero = logits.new_zeros((B, 1), dtype=torch.float32)
    lp_chunks, ent_chunks = [zero], [zero]
    pred, target = logits[:, :-1], token_ids[:, 1:]
    step = max(1, _CHUNK_ELEMENTS // max(1, B * V))
    ban = None
    if banned is not None and banned.numel():
        ban = torch.zeros(V, dtype=torch.bool, device=logits.device)
        ban[banned] = True
    for s in range(0, T - 1, step):
        z = pred[:, s : s + step].float()
        if temperature != 1.0:
            z = z / temperature
        if ban is not None:
            # The policy without the banned ids (protocol/vocab.py), where the next token is not
            # one of them (a prompt's own <|im_start|> keeps a finite logprob; no loss reads it).
            # The float32 minimum, not -inf: its probability is exactly 0 and 0 * z stays 0.
            y = target[:, s : s + step]
            z = z.masked_fill(ban & ~ban[y][..., None], torch.finfo(z.dtype).min)
        lse = torch.logsumexp(z, dim=-1)
        # log softmax(z)[y] = z[y] − logsumexp(z): gathers one logit instead of normalising all V.
        lp_chunks.append(z.gather(-1, target[:, s : s + step, None]).squeeze(-1) - lse)
        if want_entropy:
            ent_chunks.append(lse - (torch.softmax(z, dim=-1) * z).sum(-1))
    logp = torch.cat(lp_chunks, dim=1)
    return logp, torch.cat(ent_chunks, dim=1) if want_entropy else None


def token_logprobs(logits: Tensor, token_ids: Tensor, temperature: float = 1.0, banned: Tensor | None = None) -> Tensor:
    """log softmax(z_{t−1}/τ)[y_t] for every position t ≥ 1, 0 at t = 0; float32 [B, T].

    ``logits`` [B, T, V] (any float dtype; upcast per chunk), ``token_ids`` [B, T] (long).
    ``banned``: ids at probability 0 where the next token is not banned (protocol/vocab.py).
    Differentiable with respect to the logits.
    """
    _check("token_logprobs", logits, token_ids, temperature)
    return _logprobs_and_entropy(logits, token_ids, temperature, False, banned)[0]


@overload
def sequence_logprobs(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float = ...,
    *, return_entropy: Literal[False] = ..., banned: Tensor | None = ...,
) -> Tensor: ...  # fmt: skip
@overload
def sequence_logprobs(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float = ...,
    *, return_entropy: Literal[True], banned: Tensor | None = ...,
) -> tuple[Tensor, Tensor]: ...  # fmt: skip
def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float = 1.0,
    *,
    return_entropy: bool = False,
    banned: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Per-token logprobs [B, T] of right-padded sequences under any HF causal LM.

    Runs ``model(input_ids=..., attention_mask=...).logits`` (with gradients unless the caller
    is in ``torch.no_grad``) and applies :func:`token_logprobs`; padding positions
    (attention_mask 0) get 0. With ``return_entropy=True`` also returns the entropy [B, T] of
    the temperature-τ distribution each token was drawn from (position 0 and padding: 0).
    ``banned``: token ids the policy gives probability 0 (protocol/vocab.py; the engine sampled
    without them), as a long tensor on the logits' device.
    """
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"sequence_logprobs: attention_mask {tuple(attention_mask.shape)} must have "
                         f"the shape of input_ids {tuple(input_ids.shape)}")  # fmt: skip
    out: _CausalLMOutput = model(input_ids=input_ids, attention_mask=attention_mask)
    _check("sequence_logprobs", out.logits, input_ids, temperature)
    logp, ent = _logprobs_and_entropy(out.logits, input_ids, temperature, return_entropy, banned)
    real = attention_mask != 0
    logp = torch.where(real, logp, 0.0)
    if ent is None:
        return logp
    return logp, torch.where(real, ent, 0.0)
