"""The engine an actor uses, chosen by ``actor.engine`` in the config.

    engine = make_engine(cfg, model_dir)     # VllmEngine | RemoteEngine | HfEngine | SimEngine, not started
    engine = make_engine(cfg, model_dir, lora=welcome.lora)   # serving the learner's LoRA adapters

    engine = build_engine("hf", EngineRequest(Path(model), seed=0))   # a critic's engine, its defaults

Each engine module imports its heavy library (vLLM, transformers, httpx) only when used. The
names ``actor.engine`` accepts are registered in agentgym/config/registries.py (``ENGINES``), each
with its builder: a new engine is its module, a builder (``EngineRequest`` -> engine) and one
registration. The actor's engine and a critic's engine (actors/play/critic.py) are both built here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from agentgym.actors.engines.engine import GatedEngine
from agentgym.config import Config
from agentgym.config.registries import ENGINES
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


@dataclass(frozen=True)
class EngineRequest:
    """What an engine builder reads. ``cfg``: the actor's config, whose ``[actor]`` settings the
    policy's engine takes; None for a critic's engine (actors/play/critic.py), which takes the engine's
    own defaults and ``model``/``url`` from the critic's spec."""

    model_dir: Path | None
    seed: int = 0
    cfg: Config | None = None
    lora: LoraSpec | None = None
    url: str | None = None
    model: str | None = None

    def local_dir(self) -> Path:
        """``model_dir``, which the engines that load the model here (vllm, hf) need."""
        if self.model_dir is None:
            raise ValueError("EngineRequest: a local engine needs model_dir, got None")
        return self.model_dir


def make_engine(cfg: Config, model_dir: Path, lora: LoraSpec | None = None) -> GatedEngine:
    """The policy's engine, by ``actor.engine``."""
    return build_engine(cfg.actor.engine, EngineRequest(model_dir, seed=cfg.run.seed, cfg=cfg, lora=lora))


def build_engine(name: str, req: EngineRequest) -> GatedEngine:
    """The engine registered as ``name`` (agentgym/config/registries.py: ``ENGINES``), not started."""
    entry = ENGINES.get(name)
    if req.lora is not None and not entry.lora:
        raise ValueError(
            f"actor.engine = {name!r} cannot serve the learner's LoRA adapters (learner.lora); "
            f"use the {' or '.join(ENGINES.with_('lora'))} engine"
        )
    return ENGINES.load(name)(req)


# The builders, registered by name in agentgym/config/registries.py. Each imports its engine's
# module (and so its heavy library) only when called.


def build_vllm(req: EngineRequest) -> GatedEngine:
    if req.cfg is None:
        from agentgym.actors.engines.vllm_engine import VllmEngine

        return VllmEngine(Path(req.local_dir()), seed=req.seed)  # a critic's
    cfg, a = req.cfg, req.cfg.actor
    model_dir = req.local_dir()
    ctx = context_length(cfg, model_dir)
    if req.lora is not None:
        from agentgym.actors.engines.lora_engine import VllmLoraEngine

        return VllmLoraEngine(
            model_dir,
            lora=req.lora,
            seed=cfg.run.seed,
            dtype=cfg.model.dtype,
            kv_cache_gib=a.kv_cache_gib,
            gpu_memory_utilization=a.gpu_memory_utilization,
            update_mode=a.weight_update,
            max_model_len=ctx,
        )
    from agentgym.actors.engines.vllm_engine import VllmEngine

    return VllmEngine(
        model_dir,
        seed=cfg.run.seed,
        dtype=cfg.model.dtype,
        kv_cache_gib=a.kv_cache_gib,
        gpu_memory_utilization=a.gpu_memory_utilization,
        update_mode=a.weight_update,
        max_model_len=ctx,
        enforce_eager=a.enforce_eager,
    )


def build_hf(req: EngineRequest) -> GatedEngine:
    if req.cfg is None:
        from agentgym.actors.engines.hf_engine import HfEngine

        return HfEngine(Path(req.local_dir()), seed=req.seed)  # a critic's
    cfg, a = req.cfg, req.cfg.actor
    model_dir = req.local_dir()
    ctx = context_length(cfg, model_dir)
    if req.lora is not None:
        from agentgym.actors.engines.lora_engine import HfLoraEngine

        return HfLoraEngine(
            model_dir,
            lora=req.lora,
            seed=cfg.run.seed,
            dtype=cfg.model.dtype,
            device=a.device,
            update_mode=a.weight_update,
            max_model_len=ctx,
        )
    from agentgym.actors.engines.hf_engine import HfEngine

    return HfEngine(
        model_dir,
        seed=cfg.run.seed,
        dtype=cfg.model.dtype,
        device=a.device,
        update_mode=a.weight_update,
        max_model_len=ctx,
    )


def build_remote(req: EngineRequest) -> GatedEngine:
    from agentgym.actors.engines.remote_engine import RemoteEngine

    if req.cfg is None:
        return RemoteEngine(req.url, model=req.model or None)  # type: ignore[arg-type]  # the critic checked the url
    cfg, a = req.cfg, req.cfg.actor
    context_length(cfg, req.model_dir)  # type: ignore[arg-type]  # as every engine: the model's config must be readable
    r = a.remote
    key = os.environ.get(r.api_key_env) if r.api_key_env else None
    if r.api_key_env and not key:
        raise KeyError(f"actor.remote.api_key_env names {r.api_key_env!r}, which is not set in the environment")
    return RemoteEngine(
        r.url,
        server=r.server,
        model=r.model or None,
        weights_dir=Path(r.weights_dir) if r.weights_dir else None,
        api_key=key,
        update_mode=a.weight_update,
    )


def build_sim(req: EngineRequest) -> GatedEngine:
    from agentgym.actors.engines.sim_engine import SimEngine

    if req.cfg is None:
        raise ValueError("the sim engine has no critic form (critic.engine: hf, vllm, remote or policy)")
    cfg, a = req.cfg, req.cfg.actor
    context_length(cfg, req.model_dir)  # type: ignore[arg-type]  # as every engine: the model's config must be readable
    vocab = a.sim.vocab_size or _vocab_size(req.model_dir)  # type: ignore[arg-type]  # without sim.vocab_size the policy's model dir is read
    return SimEngine(
        vocab_size=vocab,
        tokens_per_s=a.sim.tokens_per_s,
        latency_s=a.sim.latency_s,
        stop_p=a.sim.stop_p,
        seed=cfg.run.seed,
        update_mode=a.weight_update,
    )


def _vocab_size(model_dir: Path) -> int:
    path = Path(model_dir) / "config.json"
    try:
        return int(json.loads(path.read_text())["vocab_size"])
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"actor.sim.vocab_size is unset and {path} has no vocab_size: {exc}") from None
