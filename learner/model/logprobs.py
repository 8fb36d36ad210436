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

import contextlib
from typing import TYPE_CHECKING, Literal, Protocol, overload

import torch
from torch import Tensor

from agentgym.learner.model.shared_prefix import PackedRows

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

# Elements of float32 working memory per chunk (64 MiB).
_CHUNK_ELEMENTS = 1 << 24


class _CausalLMOutput(Protocol):
    logits: Tensor


def right_padded(attention_mask: Tensor) -> bool:
    """True when every row of ``attention_mask`` [B, T] is its real tokens then padding (1s, then
    0s). Such rows need no mask in a causal LM: a real token attends only to tokens before it, all
    real, and its position is its index either way, so its logits are the same with the mask or
    without, up to float rounding between the two kernels (tests/test_logprobs.py). Without it the attention runs as plain causal
    attention, which PyTorch's fused kernel takes (a padding mask sends it to the unfused path: a
    [T, T] score matrix per head); that halved the learner's forward and backward on 16 rows of
    950 tokens of agent-tiny (docs/results-log.md, 2026-12-01). Padding positions get other values
    without the mask; every caller reads real positions only."""
    if attention_mask.dim() != 2:
        return False
    real = attention_mask != 0
    lengths = real.sum(-1, keepdim=True)
    return bool((real == (torch.arange(real.shape[1], device=real.device) < lengths)).all())


def _check(fn: str, logits: Tensor, token_ids: Tensor, temperature: float) -> None:
    if logits.dim() != 3 or token_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"{fn}: need logits [B, T, V] and token_ids [B, T], got {tuple(logits.shape)} and {tuple(token_ids.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"{fn}: temperature must be > 0, got {temperature}")
    V = logits.shape[-1]
    if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= V):
        raise ValueError(
            f"{fn}: token ids must be in [0, {V}) (the logits' vocabulary), got "
            f"min {int(token_ids.min())} max {int(token_ids.max())}"
        )


def _ban_mask(banned: Tensor | None, V: int, device: torch.device) -> Tensor | None:
    if banned is None or not banned.numel():
        return None
    ban = torch.zeros(V, dtype=torch.bool, device=device)
    ban[banned] = True
    return ban


def _chunk(
    z: Tensor, y: Tensor, temperature: float, ban: Tensor | None, want_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """log softmax(z/τ)[y] and the entropy of softmax(z/τ), over the last dim of ``z`` [..., V]."""
    z = z.float()
    if temperature != 1.0:
        z = z / temperature
    if ban is not None:
        # The policy without the banned ids (protocol/vocab.py), where the next token is not
        # one of them (a prompt's own <|im_start|> keeps a finite logprob; no loss reads it).
        # The float32 minimum, not -inf: its probability is exactly 0 and 0 * z stays 0.
        z = z.masked_fill(ban & ~ban[y][..., None], torch.finfo(z.dtype).min)
    lse = torch.logsumexp(z, dim=-1)
    # log softmax(z)[y] = z[y] − logsumexp(z): gathers one logit instead of normalising all V.
    lp = z.gather(-1, y[..., None]).squeeze(-1) - lse
    return lp, (lse - (torch.softmax(z, dim=-1) * z).sum(-1)) if want_entropy else None


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
    ban = _ban_mask(banned, V, logits.device)
    for s in range(0, T - 1, step):
        lp, ent = _chunk(pred[:, s : s + step], target[:, s : s + step], temperature, ban, want_entropy)
        lp_chunks.append(lp)
        if ent is not None:
            ent_chunks.append(ent)
    logp = torch.cat(lp_chunks, dim=1)
    return logp, torch.cat(ent_chunks, dim=1) if want_entropy else None


def _needed_logprobs(
    rows: Tensor, token_ids: Tensor, needed: Tensor, temperature: float, want_entropy: bool, banned: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """[B, T] logprobs (and entropies) from ``rows`` [N, V], the logits of the needed tokens only
    (in row-major order of ``needed[:, 1:]``); 0 everywhere else."""
    B, T = token_ids.shape
    sel = needed[:, 1:]
    y = token_ids[:, 1:][sel]
    ban = _ban_mask(banned, rows.shape[-1], rows.device)
    step = max(1, _CHUNK_ELEMENTS // max(1, rows.shape[-1]))
    parts = [
        _chunk(rows[s : s + step], y[s : s + step], temperature, ban, want_entropy) for s in range(0, len(y), step)
    ]
    zero = rows.new_zeros((B, 1), dtype=torch.float32)

    def place(vals: list[Tensor]) -> Tensor:
        flat = torch.cat(vals) if vals else rows.new_zeros((0,), dtype=torch.float32)
        return torch.cat([zero, torch.zeros_like(sel, dtype=torch.float32).masked_scatter(sel, flat)], dim=1)

    logp = place([p[0] for p in parts])
    return logp, place([p[1] for p in parts if p[1] is not None]) if want_entropy else None


class _OnlyNeededRows:
    """While open, the model's output embeddings (its LM head) see only the hidden states at
    t − 1 of the needed tokens t, as one [1, N, H] row: logits of N positions instead of B·T.
    The LM head and the softmax over the vocabulary are most of a small model's step, and only
    the agent's tokens (a few percent of an episode) have a loss. A model whose forward calls
    its head some other way is left alone: ``hit`` stays False and the full logits come back."""

    def __init__(self, model: torch.nn.Module, needed: Tensor, packed: PackedRows | None = None) -> None:
        get = getattr(model, "get_output_embeddings", None)
        self.head = get() if callable(get) else None
        self.sel = needed[:, 1:]
        self.packed = packed
        """Rows packed by group (learner/model/shared_prefix.py): the hidden states come as [R, L, H]
        and the needed tokens' predecessors are gathered by their flat packed index."""
        self.index = packed.predecessors(needed) if packed is not None else None
        self.hit = False
        self.handle: RemovableHandle | None = None
        self.own_forward: object = None

    def _pre(self, _module: torch.nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...] | None:
        h = args[0] if args else None
        if self.hit or h is None or h.dim() != 3:
            return None
        if self.packed is not None and self.index is not None:
            if h.shape[:2] != self.packed.input_ids.shape:
                return None
            self.hit = True
            return (h.reshape(-1, h.shape[-1])[self.index][None], *args[1:])
        if h.shape[:2] != (self.sel.shape[0], self.sel.shape[1] + 1):
            return None
        self.hit = True
        return (h[:, :-1][self.sel][None], *args[1:])

    def __enter__(self) -> _OnlyNeededRows:
        head = self.head
        if isinstance(head, torch.nn.Module):
            self.handle = head.register_forward_pre_hook(self._pre)
            self.own_forward = head.__dict__.get("forward")  # an instance's own forward, if it has one
            own = head.forward

            def full_precision(x: Tensor, *args: object, **kwargs: object) -> Tensor:
                """The head's matmul outside autocast, in the weights' dtype: the few needed
                rows cost little, and bfloat16 logits (3 significant digits: about 0.06 on a
                logit of 20) would put that error into every logprob and importance weight."""
                if not torch.is_autocast_enabled(x.device.type):
                    return own(x, *args, **kwargs)
                with torch.autocast(x.device.type, enabled=False):
                    return own(x.to(next(head.parameters()).dtype), *args, **kwargs)

            head.forward = full_precision  # this instance, while open
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.handle.remove()
            assert self.head is not None
            if self.own_forward is not None:
                self.head.forward = self.own_forward
            else:
                del self.head.forward


def _packed_mask(model: torch.nn.Module, packed: PackedRows) -> Tensor:
    """The packed rows' 4-D mask as the model's attention takes it: boolean (True: attend) for
    torch's fused attention, additive (0 or the dtype's minimum) for the eager implementation."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", "sdpa")
    if impl == "eager":
        dtype = next(model.parameters()).dtype
        return torch.zeros(packed.allowed.shape, dtype=dtype, device=packed.allowed.device).masked_fill(
            ~packed.allowed, torch.finfo(dtype).min
        )
    return packed.allowed


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
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float = ...,
    *,
    return_entropy: Literal[False] = ...,
    banned: Tensor | None = ...,
    needed: Tensor | None = ...,
    packed: PackedRows | None = ...,
) -> Tensor: ...
@overload
def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float = ...,
    *,
    return_entropy: Literal[True],
    banned: Tensor | None = ...,
    needed: Tensor | None = ...,
    packed: PackedRows | None = ...,
) -> tuple[Tensor, Tensor]: ...
def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float = 1.0,
    *,
    return_entropy: bool = False,
    banned: Tensor | None = None,
    needed: Tensor | None = None,
    packed: PackedRows | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Per-token logprobs [B, T] of right-padded sequences under any HF causal LM.

    Runs ``model(input_ids=..., attention_mask=...).logits`` (with gradients unless the caller
    is in ``torch.no_grad``) and applies :func:`token_logprobs`; padding positions
    (attention_mask 0) get 0. With ``return_entropy=True`` also returns the entropy [B, T] of
    the temperature-τ distribution each token was drawn from (position 0 and padding: 0).
    ``banned``: token ids the policy gives probability 0 (protocol/vocab.py; the engine sampled
    without them), as a long tensor on the logits' device. ``needed`` [B, T] (bool): the tokens
    whose logprob (and entropy) the caller reads, e.g. the agent's; the others get 0 and the LM
    head computes logits for the needed ones only (``_OnlyNeededRows``). ``packed``: the same
    rows packed by group (learner/model/shared_prefix.py ``pack_groups``; needs ``needed``): the
    model runs once over each group's shared prefix, with the same logprobs up to rounding.
    """
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"sequence_logprobs: attention_mask {tuple(attention_mask.shape)} must have "
            f"the shape of input_ids {tuple(input_ids.shape)}"
        )
    if needed is not None and needed.shape != input_ids.shape:
        raise ValueError(
            f"sequence_logprobs: needed {tuple(needed.shape)} must have the shape of input_ids {tuple(input_ids.shape)}"
        )
    if packed is not None and needed is None:
        raise ValueError("sequence_logprobs: packed rows need `needed` (the tokens whose logprobs are read)")
    only = None
    if needed is not None and input_ids.shape[1] > 0:
        needed = needed.bool() & (attention_mask != 0)
        only = _OnlyNeededRows(model, needed, packed)
    with only or contextlib.nullcontext():
        if packed is not None:
            out: _CausalLMOutput = model(
                input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=_packed_mask(model, packed)
            )
        else:
            out = model(input_ids=input_ids, attention_mask=None if right_padded(attention_mask) else attention_mask)
    if packed is not None and needed is not None:
        # The head saw the needed rows only, or (a model whose head the hook did not see: a
        # wrapper such as the LoRA reference view) the full packed logits, gathered here.
        assert only is not None and only.index is not None  # built above for every packed call
        rows = out.logits[0] if only.hit else out.logits.reshape(-1, out.logits.shape[-1])[only.index]
        _check("sequence_logprobs", rows[None], input_ids[:, 1:][needed[:, 1:]][None], temperature)
        logp, ent = _needed_logprobs(rows, input_ids, needed, temperature, return_entropy, banned)
    elif only is not None and only.hit and needed is not None:
        _check("sequence_logprobs", out.logits, input_ids[:, 1:][needed[:, 1:]][None], temperature)
        logp, ent = _needed_logprobs(out.logits[0], input_ids, needed, temperature, return_entropy, banned)
    else:  # the full logits (no ``needed``, or a model whose head the hook did not see)
        _check("sequence_logprobs", out.logits, input_ids, temperature)
        logp, ent = _logprobs_and_entropy(out.logits, input_ids, temperature, return_entropy, banned)
        if needed is not None:
            logp = torch.where(needed, logp, 0.0)
            ent = torch.where(needed, ent, 0.0) if ent is not None else None
    real = attention_mask != 0
    logp = torch.where(real, logp, 0.0)
    if ent is None:
        return logp
    return logp, torch.where(real, ent, 0.0)
