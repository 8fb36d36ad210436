"""The policy's forward pass as the losses need it: per-token logprobs, entropies and values.

    critic = build_value_model("shared", model)            # PPO only (learner/model/value_model.py)
    out = forward_tokens(model, ids, attn, temperature, value_head=critic)
    out.logp, out.entropy, out.values, out.last_value      # [B, T], [B, T], [B, T], [B]

With ``learner.value_model = "shared"`` the value head is one linear layer on the policy's last
hidden state (post final norm), so V shares the transformer with π; with ``"separate"`` the
critic runs its own transformer on the same tokens (learner/model/value_model.py; docs/adr/0007 says
why). Values are aligned like logprobs: ``values[b, t]`` is V of the state in which token t is
chosen, read from the hidden state at t − 1 (position 0 and padding: 0); ``last_value[b]`` is V
after the row's last real token, the bootstrap of a truncated episode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from agentgym.learner.model.logprobs import sequence_logprobs
from agentgym.learner.model.shared_prefix import PackedRows
from agentgym.learner.model.value_model import SeparateValueModel, ValueHead, align_values

__all__ = ["Forward", "ValueHead", "forward_tokens", "load_causal_lm", "load_reference"]


@dataclass
class Forward:
    logp: Tensor
    entropy: Tensor
    values: Tensor | None
    last_value: Tensor | None


class _KeepHidden(torch.nn.Module):
    """Calls the causal LM asking for hidden states and keeps the last one for the value head."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.hidden: Tensor | None = None

    def forward(self, input_ids: Tensor, attention_mask: Tensor):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        self.hidden = out.hidden_states[-1]
        return out

    def get_output_embeddings(self) -> torch.nn.Module | None:
        get = getattr(self.model, "get_output_embeddings", None)
        return get() if callable(get) else None


def forward_tokens(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float,
    *,
    value_head: ValueHead | SeparateValueModel | None = None,
    banned: Tensor | None = None,
    needed: Tensor | None = None,
    packed: PackedRows | None = None,
) -> Forward:
    """One forward pass of right-padded rows: logprobs and entropies at ``temperature`` (without
    the ``banned`` ids: protocol/vocab.py), values. ``needed``: the tokens whose logprob and entropy
    are read (the others are 0; learner/model/logprobs.py). ``packed``: the rows packed by group
    (learner/model/shared_prefix.py), for a policy without a value head."""
    if packed is not None and value_head is not None:
        raise ValueError("forward_tokens: packed rows are for the policy alone (a critic reads every position)")
    if value_head is None:
        logp, ent = sequence_logprobs(
            model,
            input_ids,
            attention_mask,
            temperature,
            return_entropy=True,
            banned=banned,
            needed=needed,
            packed=packed,
        )
        return Forward(logp, ent, None, None)
    if value_head.own_body:
        logp, ent = sequence_logprobs(
            model, input_ids, attention_mask, temperature, return_entropy=True, banned=banned, needed=needed
        )
        v_state = value_head.state_values(None, input_ids, attention_mask)
    else:
        keep = _KeepHidden(model)
        logp, ent = sequence_logprobs(
            keep, input_ids, attention_mask, temperature, return_entropy=True, banned=banned, needed=needed
        )
        v_state = value_head.state_values(keep.hidden, input_ids, attention_mask)  # [B, T]: V after token t
    values, last_value = align_values(v_state, attention_mask)
    return Forward(logp, ent, values, last_value)


def load_causal_lm(path: Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)


def load_reference(path: Path, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """The frozen reference policy π_ref (the initial model): eval mode, no gradients."""
    ref = load_causal_lm(path, dtype).to(device).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
