"""The policy's forward pass as the losses need it: per-token logprobs, entropies and values.

    head = ValueHead(model.config.hidden_size)             # PPO only
    out = forward_tokens(model, ids, attn, temperature, value_head=head)
    out.logp, out.entropy, out.values, out.last_value      # [B, T], [B, T], [B, T], [B]

The value head is one linear layer on the policy's last hidden state (post final norm), so
V shares the transformer with π (docs/adr/0007-learner-algorithms.md says why). Values are
aligned like logprobs: ``values[b, t]`` is V of the state in which token t is chosen, read from
the hidden state at t − 1 (position 0 and padding: 0); ``last_value[b]`` is V after the row's
last real token, the bootstrap of a truncated episode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from agentgym.learner.logprobs import sequence_logprobs


class ValueHead(torch.nn.Module):
    """V(s) = w·h + b on the last hidden state h; zero-initialised, so V starts at 0 everywhere
    (the GAE advantages of the first steps are then the returns themselves)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1)


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

    def forward(self, input_ids: Tensor, attention_mask: Tensor):  # type: ignore[no-untyped-def]
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        self.hidden = out.hidden_states[-1]
        return out


def forward_tokens(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float,
    *,
    value_head: ValueHead | None = None,
) -> Forward:
    """One forward pass of right-padded rows: logprobs and entropies at ``temperature``, values."""
    if value_head is None:
        logp, ent = sequence_logprobs(model, input_ids, attention_mask, temperature, return_entropy=True)
        return Forward(logp, ent, None, None)
    keep = _KeepHidden(model)
    logp, ent = sequence_logprobs(keep, input_ids, attention_mask, temperature, return_entropy=True)
    assert keep.hidden is not None
    v_state = value_head(keep.hidden)  # [B, T]: V of the state after token t
    real = attention_mask != 0
    values = torch.cat([v_state.new_zeros(v_state.shape[0], 1), v_state[:, :-1]], dim=1)
    values = torch.where(real, values, 0.0)
    last = (real.sum(-1) - 1).clamp(min=0)
    last_value = v_state.gather(1, last[:, None]).squeeze(1)
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
