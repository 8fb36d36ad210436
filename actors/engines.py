"""The engine an actor uses, chosen by ``actor.engine`` in the config.

    engine = make_engine(cfg, model_dir)     # VllmEngine | RemoteEngine | HfEngine | SimEngine, not started
    engine = make_engine(cfg, model_dir, lora=welcome.lora)   # serving the learner's LoRA adapters

Each engine module imports its heavy library (vLLM, transformers, httpx) only when used.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from agentgym.actors.engine import GatedEngine
from agentgym.config import Config
from agentgym.protocol.messages import LoraSpec


def load_tokenizer(model_dir: Path):
    """The model directory's tokenizer (transformers imported here, when first needed)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def context_length(cfg: Config, model_dir: Path) -> int:
    """The engine's context length: ``actor.max_model_len``, or the model's
    ``max_position_embeddings`` capped by ``rollout.max_episode_tokens``."""
    if cfg.actor.max_model_len is not None:
        return cfg.actor.max_model_len
    path = Path(model_dir) / "config.json"
    try:
        n = json.loads(path.read_text()).get("max_position_embeddings")
    except (OSError, ValueError) as exc:
        raise ValueError(f"actor: cannot read max_position_embeddings from {path}: {exc}") from None
    return min(int(n), cfg.rollout.max_episode_tokens) if n else cfg.rollout.max_episode_tokens


def make_engine(cfg: Config, model_dir: Path, lora: LoraSpec | None = None) -> GatedEngine:
    a = cfg.actor
    ctx = context_length(cfg, model_dir)
    if lora is not None:
        from agentgym.actors.lora_engine import HfLoraEngine, VllmLoraEngine

        if a.engine == "vllm":
            return VllmLoraEngine(
                model_dir, lora=lora, seed=cfg.run.seed, dtype=cfg.model.dtype, kv_cache_gib=a.kv_cache_gib,
                gpu_memory_utilization=a.gpu_memory_utilization, update_mode=a.weight_update, max_model_len=ctx,
            )  # fmt: skip
        if a.engine == "hf":
            return HfLoraEngine(model_dir, lora=lora, seed=cfg.run.seed, dtype=cfg.model.dtype, device=a.device,
                                update_mode=a.weight_update, max_model_len=ctx)
        raise ValueError(f"actor.engine = {a.engine!r} cannot serve the learner's LoRA adapters (learner.lora); "
                         "use the vllm or hf engine")  # fmt: skip
    if a.engine == "vllm":
        from agentgym.actors.vllm_engine import VllmEngine

        return VllmEngine(
            model_dir, seed=cfg.run.seed, dtype=cfg.model.dtype, kv_cache_gib=a.kv_cache_gib,
            gpu_memory_utilization=a.gpu_memory_utilization, update_mode=a.weight_update, max_model_len=ctx,
            enforce_eager=a.enforce_eager,
        )  # fmt: skip
    if a.engine == "hf":
        from agentgym.actors.hf_engine import HfEngine

        return HfEngine(model_dir, seed=cfg.run.seed, dtype=cfg.model.dtype, device=a.device,
                        update_mode=a.weight_update, max_model_len=ctx)
    if a.engine == "remote":
        from agentgym.actors.remote_engine import RemoteEngine

        r = a.remote
        key = os.environ.get(r.api_key_env) if r.api_key_env else None
        if r.api_key_env and not key:
            raise KeyError(f"actor.remote.api_key_env names {r.api_key_env!r}, which is not set in the environment")
        return RemoteEngine(
            r.url, server=r.server, model=r.model or None, weights_dir=Path(r.weights_dir) if r.weights_dir else None, api_key=key,
            update_mode=a.weight_update,
        )  # fmt: skip
    if a.engine == "sim":
        from agentgym.actors.sim_engine import SimEngine

        vocab = a.sim.vocab_size or _vocab_size(model_dir)
        return SimEngine(vocab_size=vocab, tokens_per_s=a.sim.tokens_per_s, latency_s=a.sim.latency_s,
                         stop_p=a.sim.stop_p, seed=cfg.run.seed, update_mode=a.weight_update)  # fmt: skip
    raise ValueError(f"actor.engine: unknown engine {a.engine!r} (vllm, remote, hf, sim)")


def _vocab_size(model_dir: Path) -> int:
    path = Path(model_dir) / "config.json"
    try:
        return int(json.loads(path.read_text())["vocab_size"])
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"actor.sim.vocab_size is unset and {path} has no vocab_size: {exc}") from None
