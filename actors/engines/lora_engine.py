"""Engines that serve the learner's LoRA adapters (Welcome.lora) on the unchanged base model.

    engine = VllmLoraEngine(model_dir, lora=welcome.lora, seed=0)     # or HfLoraEngine(...)
    await engine.start()
    await engine.update_weights({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": t, ...}, version=1)
    gen = await engine.generate(...)          # sampled with the base model + the version-1 adapter

Each weight version of a LoRA run is one adapter: its tensors under peft's names
(learner/model/lora.py). ``VllmLoraEngine`` writes them as a peft adapter directory (on ``/dev/shm``
when present), registers it as a new ``LoRARequest`` (vLLM started with ``enable_lora``) and
from then on every generate uses it; the previous adapter is removed once the switch is made.
Requests in flight follow the engine's update mode as with full weights (actors/engines/engine.py):
resumed under the new adapter or drained first, each token keeping the version that sampled it.
``HfLoraEngine`` merges the adapter into a copy of the base weights (W = W0 + alpha/r · B·A),
the reference the vLLM path is tested against. docs/adr/0012-lora-and-multinode-learner.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym.actors.engines.hf_engine import HfEngine
from agentgym.actors.engines.vllm_engine import VllmEngine
from agentgym.actors.engines.weight_files import save_safetensors, shm_dir
from agentgym.protocol.messages import LoraSpec

if TYPE_CHECKING:
    import torch

_PREFIX = "base_model.model."
_SUFFIXES = (".lora_A.weight", ".lora_B.weight")
_VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM can be started with (max_lora_rank); an adapter's rank is at most it."""


def check_adapter(where: str, tensors: Mapping[str, Any], spec: LoraSpec) -> None:
    """Raise unless ``tensors`` are LoRA A/B matrices of ``spec``'s rank under peft's names."""
    if not tensors:
        raise ValueError(f"{where}: no adapter tensors given")
    for name, t in tensors.items():
        if not (name.startswith(_PREFIX) and name.endswith(_SUFFIXES)):
            raise ValueError(
                f"{where}: {name!r} is not a LoRA adapter tensor (want {_PREFIX}<module>.lora_A.weight / "
                f".lora_B.weight); the learner sends full weights but the Welcome announced LoRA"
            )
        dim = 0 if name.endswith(".lora_A.weight") else 1
        if t.ndim != 2 or t.shape[dim] != spec.rank:
            raise ValueError(f"{where}: {name} has shape {tuple(t.shape)}, not rank {spec.rank}")


def write_adapter_dir(path: Path, tensors: Mapping[str, torch.Tensor], spec: LoraSpec, base: Path) -> Path:
    """A peft adapter directory (adapter_config.json + adapter_model.safetensors) at ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "target_modules": list(spec.target_modules),
        "lora_dropout": 0.0,
        "bias": "none",
        "base_model_name_or_path": str(base),
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (path / "adapter_config.json").write_text(json.dumps(config, indent=1))
    save_safetensors(tensors, path / "adapter_model.safetensors")
    return path


class VllmLoraEngine(VllmEngine):
    """``VllmEngine`` with LoRA enabled: each weight version is a new LoRARequest."""

    def __init__(self, model_dir: Path, *, lora: LoraSpec, **kwargs: Any) -> None:
        super().__init__(model_dir, **kwargs)
        self.lora = lora
        self._ids = itertools.count(1)
        self._dirs = itertools.count()
        self._root = Path(tempfile.mkdtemp(prefix="agentgym-lora-", dir=shm_dir()))

    def _engine_args(self) -> Any:
        rank = next((r for r in _VLLM_RANKS if r >= self.lora.rank), None)
        if rank is None:
            raise ValueError(f"VllmLoraEngine: LoRA rank {self.lora.rank} is above vLLM's largest ({_VLLM_RANKS[-1]})")
        # Two slots: the new adapter is added before the old one is removed.
        return dataclasses.replace(super()._engine_args(), enable_lora=True, max_lora_rank=rank, max_loras=2)

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            shutil.rmtree(self._root, ignore_errors=True)

    async def _prepare_weights(self, tensors: Mapping[str, torch.Tensor] | Path) -> Any:
        """The adapter directory, written before the gate is taken (generation goes on meanwhile)."""
        self._require()
        if isinstance(tensors, (str, Path)):
            return Path(tensors)  # a peft adapter directory written elsewhere
        check_adapter("VllmLoraEngine.update_weights", tensors, self.lora)
        path = self._root / f"adapter-{next(self._dirs)}"
        await asyncio.to_thread(write_adapter_dir, path, tensors, self.lora, self.model_dir)
        return path

    async def _load_weights(self, prepared: object) -> int:
        from vllm.lora.request import LoRARequest

        llm = self._require()
        path = Path(prepared)  # type: ignore[arg-type]  # what _prepare_weights returned: the adapter's directory
        n = next(self._ids)
        req = LoRARequest(f"agentgym-{n}", n, str(path))
        if not await llm.add_lora(req):
            raise RuntimeError(f"VllmLoraEngine.update_weights: vLLM refused the adapter in {path}")
        old, self._lora_request = self._lora_request, req
        if old is not None:
            await llm.remove_lora(old.lora_int_id)
            if Path(old.lora_path).parent == self._root:
                shutil.rmtree(old.lora_path, ignore_errors=True)
        return sum(1 for _ in path.glob("*.safetensors"))


class HfLoraEngine(HfEngine):
    """``HfEngine`` serving adapters merged into the base weights: W = W0 + alpha/r · B·A."""

    partial_updates = False  # each version merges a whole adapter (A and B), never a subset

    def __init__(self, model_dir: Path, *, lora: LoraSpec, **kwargs: Any) -> None:
        super().__init__(model_dir, **kwargs)
        self.lora = lora
        self._base: dict[str, torch.Tensor] = {}

    async def start(self) -> None:
        await super().start()
        # The base weights of the adapted layers, kept to merge each version into.
        state = self._require().state_dict()
        self._base = {k: v.detach().clone() for k, v in state.items() if self._targeted(k)}

    def _targeted(self, param: str) -> bool:
        parts = param.split(".")
        return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in self.lora.target_modules

    async def _prepare_weights(self, tensors: Mapping[str, torch.Tensor] | Path) -> object:
        if isinstance(tensors, (str, Path)):
            from safetensors.torch import load_file

            tensors = load_file(str(Path(tensors) / "adapter_model.safetensors"))
        check_adapter("HfLoraEngine.update_weights", tensors, self.lora)
        return await asyncio.to_thread(self._merge, tensors)

    def _merge(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        scale = self.lora.alpha / self.lora.rank
        merged = {}
        for name, a in tensors.items():
            if not name.endswith(".lora_A.weight"):
                continue
            module = name[len(_PREFIX) : -len(".lora_A.weight")]
            b = tensors.get(f"{_PREFIX}{module}.lora_B.weight")
            base = self._base.get(f"{module}.weight")
            if b is None or base is None:
                raise KeyError(
                    f"HfLoraEngine.update_weights: {module}: no lora_B, or no such adapted layer in the model"
                )
            delta = b.float() @ a.float()
            merged[f"{module}.weight"] = (base.float() + scale * delta).to(base.dtype)
        return merged
