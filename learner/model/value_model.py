"""PPO's critic V(s): a linear head on the policy's last hidden state, or a transformer of its own.

    critic = build_value_model("separate", policy_model)  # or "shared"; PPO only (learner.value_model)
    v_state = critic.state_values(hidden, ids, attn)    # [B, T]: V of the state after token t
    values, last_value = align_values(v_state, attn)    # [B, T] aligned like logprobs, [B]

``learner.value_model = "shared"`` (the default): ``ValueHead``, one linear layer on the policy's last
hidden state, so V shares the transformer with π and the value loss flows into the policy's body
at the policy's learning rate.

``learner.value_model = "separate"``: ``SeparateValueModel``, a copy of the policy's transformer body (the
causal LM without its output layer) with a ``ValueHead`` on top, as verl's separate critic
model. It starts from the weights the policy starts from (the same ``model.path``; a resume
loads the checkpoint's critic), learns only from the value loss, at ``learner.value_lr``, with
its gradient clipped on its own, and never leaves the learner (the actors get the policy's
weights only). It costs one more forward and backward of the body per micro-batch and the
memory of a second model with its optimizer state. Why it exists: docs/adr/0007's addendum.
"""

from __future__ import annotations

import copy
from typing import Literal

import structlog
import torch
from torch import Tensor

from agentgym.learner.model.logprobs import right_padded

log = structlog.get_logger(__name__)

ValueModelKind = Literal["shared", "separate"]


class ValueHead(torch.nn.Module):
    """V(s) = w·h + b on the last hidden state h; zero-initialised, so V starts at 0 everywhere
    (the GAE advantages of the first steps are then the returns themselves)."""

    own_body = False
    """Reads the policy's hidden states (the policy's forward must keep them)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1)

    def state_values(self, hidden: Tensor | None, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """[B, T] V of the state after each token, from the policy's last hidden state."""
        if hidden is None:
            raise ValueError("ValueHead.state_values needs the policy's last hidden state")
        return self(hidden)


class SeparateValueModel(torch.nn.Module):
    """V(s) from a transformer body of its own: ``head(body(ids).last_hidden_state)``."""

    own_body = True
    """Runs its own forward on the token ids; the policy's hidden states are not needed."""

    def __init__(self, body: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.body = body
        self.head = ValueHead(hidden_size)

    def state_values(self, hidden: Tensor | None, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """[B, T] V of the state after each token (``hidden`` is ignored)."""
        # the fused causal kernel (learner/model/logprobs.py)
        mask = None if right_padded(attention_mask) else attention_mask
        out = self.body(input_ids=input_ids, attention_mask=mask, use_cache=False)
        return self.head(out.last_hidden_state)


def policy_body(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer of an HF causal LM without its output layer (``model.model`` for Qwen2,
    Llama, Mistral: the attribute HF names ``base_model_prefix``)."""
    prefix = getattr(model, "base_model_prefix", "")
    body = getattr(model, prefix, None) if prefix else None
    if not isinstance(body, torch.nn.Module) or body is model:
        raise ValueError(
            f"learner.value_model = 'separate' needs a causal LM with a separate transformer body; "
            f"{type(model).__name__} has none under base_model_prefix={prefix!r}"
        )
    return body


def build_value_model(
    kind: ValueModelKind, model: torch.nn.Module, gradient_checkpointing: bool = False
) -> ValueHead | SeparateValueModel:
    """PPO's critic for ``learner.value_model``, in train mode; ``model`` is the policy as loaded
    (before LoRA or sharding), whose body a ``"separate"`` critic copies (recomputing activations
    in the backward pass with ``gradient_checkpointing``, as the policy does)."""
    hidden = int(model.config.hidden_size)  # type: ignore[union-attr, arg-type]  # an HF model's config, which torch.nn.Module's __getattr__ types as Tensor | Module
    critic: ValueHead | SeparateValueModel
    if kind == "shared":
        critic = ValueHead(hidden)
    elif kind == "separate":
        body = copy.deepcopy(policy_body(model))
        for p in body.parameters():
            p.requires_grad_(True)
        if gradient_checkpointing:  # non-reentrant, as the policy's (learner/training/trainer.py)
            body.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]  # an HF model's method, past torch.nn.Module's __getattr__
        critic = SeparateValueModel(body, hidden)
    else:
        raise ValueError(f"learner.value_model must be 'shared' or 'separate', got {kind!r}")
    log.info("value_model_built", kind=kind, params=sum(p.numel() for p in critic.parameters()))
    return critic.train()


def align_values(v_state: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Values aligned like logprobs and the bootstrap value, from [B, T] V of the state after
    each token: ``values[b, t]`` is V of the state in which token t is chosen (the state after
    t − 1; position 0 and padding: 0), ``last_value[b]`` V after the row's last real token."""
    real = attention_mask != 0
    values = torch.cat([v_state.new_zeros(v_state.shape[0], 1), v_state[:, :-1]], dim=1)
    values = torch.where(real, values, 0.0)
    last = (real.sum(-1) - 1).clamp(min=0)
    return values, v_state.gather(1, last[:, None]).squeeze(1)
