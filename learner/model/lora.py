"""LoRA on the learner (peft): adapters to train, the base model as KL reference, adapter export.

    model = wrap_lora(model, cfg.learner.lora)     # peft model: only the adapters require grad
    ref = BaseModelView(model)                     # the same weights with the adapters disabled
    tensors = export_adapter(model)                # RawTensors, peft names, for the weight broadcast
    save_adapter(model, path); load_adapter(model, path)   # inside a checkpoint directory
    spec = lora_spec(cfg)                          # what the Welcome tells actors (None: no LoRA)

With ``learner.lora.rank > 0`` the trainer wraps the policy with peft's LoRA, so the optimizer
(and its AdamW state) holds only the adapters; the KL reference is the base model, i.e. the same
module with the adapters disabled, so no second copy of the model exists. A weight version is the
adapter's tensors under peft's names (``base_model.model.<module>.lora_A.weight``), which is what
actors write as a peft adapter directory and vLLM loads as a LoRA adapter. B starts at zero, so
version 0 behaves exactly like the base model. docs/adr/0012-lora-and-multinode-learner.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import structlog
import torch

from agentgym.config import Config, LoraConfig
from agentgym.protocol.messages import LoraSpec
from agentgym.protocol.weights import RawTensor, tensor_nbytes

log = structlog.get_logger(__name__)

ADAPTER_FILE = "adapter_model.safetensors"


def wrap_lora(model: torch.nn.Module, lc: LoraConfig) -> torch.nn.Module:
    """``model`` with LoRA adapters on ``lc.target_modules`` (peft); the base weights frozen."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in lc.target_modules if t not in names]
    if missing:
        raise ValueError(
            f"learner.lora.target_modules: the model has no modules named {missing} "
            f"(its linear layers include {sorted(n for n in names if n.endswith('proj'))[:10]})"
        )
    # peft annotates lora_alpha as int; it only scales by alpha / r, so a float alpha works.
    alpha: Any = lc.alpha
    pc = PeftLoraConfig(
        r=lc.rank,
        lora_alpha=alpha,
        lora_dropout=lc.dropout,
        target_modules=list(lc.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, pc)


class BaseModelView(torch.nn.Module):
    """Calls a peft model with its adapters disabled: the base model, as the KL reference.

    The peft model is held outside the module tree (not a submodule), so this view has no
    parameters of its own and nothing iterating over it can freeze or copy the policy's."""

    def __init__(self, peft_model: torch.nn.Module) -> None:
        super().__init__()
        self._peft = [peft_model]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        peft_model = self._peft[0]
        with peft_model.disable_adapter():  # type: ignore[operator]  # a peft model's method, past torch.nn.Module's __getattr__
            return peft_model(*args, **kwargs)


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors under peft's saved names (``...lora_A.weight``, no adapter name)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def export_adapter(model: torch.nn.Module, dtype: str = "float32") -> list[RawTensor]:
    """The adapter as raw named tensors for the weight broadcast (any float dtype of TensorMeta)."""
    t0 = time.perf_counter()
    tdtype = getattr(torch, dtype)
    out = []
    for name, t in adapter_state(model).items():
        t = t.detach().to(tdtype).contiguous().cpu()
        raw = t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)
        out.append(RawTensor(name, dtype, tuple(t.shape), raw.numpy().tobytes()))
    log.info(
        "adapter_exported",
        tensors=len(out),
        bytes=sum(tensor_nbytes(t.dtype, t.shape) for t in out),
        dtype=dtype,
        seconds=round(time.perf_counter() - t0, 4),
    )
    return out


def save_adapter(model: torch.nn.Module, path: Path) -> None:
    """Write the adapter (adapter_config.json + adapter_model.safetensors) into ``path``."""
    model.save_pretrained(str(path), safe_serialization=True)  # type: ignore[operator]  # a peft model's method, past torch.nn.Module's __getattr__


def load_adapter(model: torch.nn.Module, path: Path) -> None:
    """Load the adapter saved by :func:`save_adapter` into ``model``; every adapter tensor must
    be there with its shape (a checkpoint of another rank or target set is refused)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    f = Path(path) / ADAPTER_FILE
    if not f.is_file():
        raise FileNotFoundError(
            f"{path}: no {ADAPTER_FILE}; this checkpoint was not written with learner.lora "
            f"(resume it with learner.lora.rank = 0)"
        )
    state = load_file(str(f))
    want = adapter_state(model)
    if state.keys() != want.keys() or any(state[k].shape != want[k].shape for k in want):
        odd = sorted(state.keys() ^ want.keys())[:4] or [k for k in want if state[k].shape != want[k].shape][:4]
        raise ValueError(f"{f}: the adapter does not match learner.lora (rank, target_modules): differs at {odd}")
    set_peft_model_state_dict(model, state)


def lora_spec(cfg: Config) -> LoraSpec | None:
    """The adapter shape actors must serve, for the Welcome; None without LoRA."""
    lc = cfg.learner.lora
    if lc.rank == 0:
        return None
    return LoraSpec(rank=lc.rank, alpha=lc.alpha, target_modules=list(lc.target_modules))
