"""A group's shared prompt computed once: rows packed as a prefix tree, one packed row per group.

    packed = pack_groups(input_ids, lengths, group_index, ratio=attention_cost_ratio(model))
    if packed is not None:                       # None: packing would cost more than it saves
        logp = sequence_logprobs(model, ids, attn, temperature, needed=agent, packed=packed)

A GRPO group is G episodes of one task: they start with the same tokens (the system prompt, the
task's first observation), which are most of every episode in a short task and a large part of a
multi-turn one. Unpacked, the learner runs the transformer over those tokens G times. Packed, a
group becomes one row: its longest common prefix once, then each episode's remaining tokens
(its suffix) one after another. A 4-D attention mask lets each suffix token see the prefix and the
earlier tokens of its own suffix, and nothing else; position ids restart at the prefix's length
for every suffix. Each token then has exactly the context (and positions) it has in its own row,
so its hidden state is the same function of the weights: the logprobs match the unpacked
forward up to float rounding, and the gradient is the same sum (the prefix's activations gather
the gradient of every suffix that reads them).

What it costs: the linear layers run on ``P + sum(len_i - P)`` tokens instead of ``sum(len_i)``,
but the attention is dense over the packed row (``L_packed^2`` scores instead of
``sum(len_i^2) / 2`` for causal rows). ``pack_groups`` compares the two with the model's
attention-to-linear cost ratio and packs only when the total is lower; long multi-turn episodes
that share little stay unpacked.

Only the policy's logprobs (and the reference's) go through it: a critic's values at every
position would need the hidden states mapped back too, so PPO runs unpacked (learner/training/trainer.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["PackedRows", "attention_cost_ratio", "pack_groups"]


@dataclass(frozen=True)
class PackedRows:
    """Rows [B, T] laid out as packed rows [R, L]: every real token (b, t) sits at one packed
    position, shared with the other rows of its group while it is in their common prefix."""

    input_ids: Tensor
    """[R, L] long: the packed tokens (0 on padding)."""
    position_ids: Tensor
    """[R, L] long: each token's position in its own row (0 on padding)."""
    allowed: Tensor
    """[R, 1, L, L] bool: query i may attend to key j (padding attends only to itself)."""
    where: Tensor
    """[B, T] long: the flat index (into R * L) of token (b, t); -1 on padding."""
    unpacked_tokens: int
    """sum of the rows' lengths: the tokens an unpacked forward runs."""

    packed_tokens: int
    """the packed rows' real tokens: what the packed forward runs, padding aside."""

    def predecessors(self, needed: Tensor) -> Tensor:
        """The flat packed index of the token before each needed token, in row-major order of
        ``needed[:, 1:]``: the hidden state there is the one whose logits predict the token."""
        return self.where[:, :-1][needed[:, 1:]]


def attention_cost_ratio(model: torch.nn.Module) -> float:
    """FLOPs of attention per (query, key) pair over FLOPs of the linear layers per token, for
    a decoder: ``4 * hidden * layers`` (the scores and the weighted sum) over ``2 * params``
    (the parameters outside the embeddings; the LM head runs on the needed tokens only)."""
    cfg = getattr(model, "config", None)
    hidden = getattr(cfg, "hidden_size", None)
    layers = getattr(cfg, "num_hidden_layers", None)
    if not hidden or not layers:
        return 0.0
    params = sum(p.numel() for name, p in model.named_parameters() if "embed" not in name and "lm_head" not in name)
    return 2.0 * hidden * layers / max(params, 1)


def _common_prefix(rows: list[list[int]]) -> int:
    n = min(len(r) for r in rows)
    first = rows[0]
    for i in range(n):
        tok = first[i]
        if any(r[i] != tok for r in rows[1:]):
            return i
    return n


def pack_groups(
    input_ids: Tensor, lengths: Tensor, group_index: Tensor, *, ratio: float, min_prefix: int = 2
) -> PackedRows | None:
    """The packed layout of right-padded rows ``input_ids`` [B, T] (``lengths`` [B] real tokens,
    ``group_index`` [B]: rows of one group pack together), or None when no group shares at
    least ``min_prefix`` tokens or the packed forward would cost more (``ratio``: attention cost
    per pair over linear cost per token, ``attention_cost_ratio``). A row that is a whole
    prefix of another still gets its own copy of its last token's context (its suffix is empty,
    and its tokens are all in the shared part)."""
    B = input_ids.shape[0]
    if B < 2:
        return None
    lens = [int(x) for x in lengths.tolist()]
    ids = input_ids.tolist()
    order: dict[int, list[int]] = {}
    for b, g in enumerate(group_index.tolist()):
        order.setdefault(int(g), []).append(b)
    groups = list(order.values())
    layouts: list[tuple[list[int], int]] = []
    for rows in groups:
        toks = [ids[b][: lens[b]] for b in rows]
        # Keep one token of every row out of the prefix: a suffix is never empty, so every row's
        # last token has a position of its own (the prefix then ends at a shared token).
        p = min(_common_prefix(toks), min(lens[b] for b in rows) - 1) if len(rows) > 1 else lens[rows[0]]
        layouts.append((rows, max(p, 0)))
    if not any(len(rows) > 1 and p >= min_prefix for rows, p in layouts):
        return None
    packed_len = [p + sum(lens[b] - p for b in rows) for rows, p in layouts]
    L = max(packed_len)
    unpacked = sum(lens)
    cost_unpacked = unpacked + ratio * sum(n * n for n in lens) / 2
    cost_packed = len(groups) * L + ratio * len(groups) * L * L  # padded rows, dense attention
    if cost_packed >= cost_unpacked:
        return None

    R, T = len(groups), input_ids.shape[1]
    out_ids = torch.zeros(R, L, dtype=torch.long)
    pos = torch.zeros(R, L, dtype=torch.long)
    seg = torch.full((R, L), -2, dtype=torch.long)  # -1: the prefix; s >= 0: row s's suffix; -2: padding
    where = torch.full((B, T), -1, dtype=torch.long)
    for r, (rows, p) in enumerate(layouts):
        first = rows[0]
        out_ids[r, :p] = input_ids[first, :p]
        pos[r, :p] = torch.arange(p)
        seg[r, :p] = -1
        at = p
        for s, b in enumerate(rows):
            n = lens[b] - p
            out_ids[r, at : at + n] = input_ids[b, p : lens[b]]
            pos[r, at : at + n] = torch.arange(p, lens[b])
            seg[r, at : at + n] = s
            where[b, :p] = r * L + torch.arange(p)
            where[b, p : lens[b]] = r * L + torch.arange(at, at + n)
            at += n
    q, k = seg[:, :, None], seg[:, None, :]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    allowed = causal & ((k == -1) | (q == k)) & (q != -2) & (k != -2)
    allowed |= torch.eye(L, dtype=torch.bool)  # padding sees itself: no row of the softmax is empty
    dev = input_ids.device
    return PackedRows(out_ids.to(dev), pos.to(dev), allowed[:, None].to(dev), where.to(dev), unpacked, sum(packed_len))
