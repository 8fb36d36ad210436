"""Engines serving LoRA adapters (actors/engines/lora_engine.py): ``hf`` (merged weights) and ``vllm``
(a LoRARequest per version). The reference for every logprob is the learner's recomputation with
the peft model holding the same adapter; the adapters here are random and large enough that the
base model's logprobs are far from them, so a dropped adapter cannot pass."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
import uvloop

from agentgym.actors.engines.engine import SamplingSpec
from agentgym.config import LoraConfig
from agentgym.learner.model.logprobs import sequence_logprobs
from agentgym.learner.model.lora import adapter_state, lora_spec, wrap_lora
from agentgym.learner.model.policy import load_causal_lm
from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model

try:
    import vllm  # noqa: F401

    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False

PROMPTS = [[1, 5, 6, 7, 8, 9, 2, 1], [1, 20, 21, 22, 2, 1, 30], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
TOL = 1e-3  # float32 on both sides, as tests/test_engines.py
ENGINES = ["hf", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.skipif(not HAVE_VLLM, reason="no vLLM")])]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, list[dict[str, torch.Tensor]]]:
    """The base model directory, a peft model on it, and two random adapters (versions 1, 2)."""
    model_dir = make_tiny_model(tmp_path_factory.mktemp("lora_engines") / "m", corpus=FALLBACK_CORPUS, seed=0)
    lc = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"])
    peft_model = wrap_lora(load_causal_lm(str(model_dir), torch.float32), lc).eval()
    adapters = []
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        adapters.append({k: torch.randn(v.shape, generator=g) * 0.3 for k, v in adapter_state(peft_model).items()})
    return model_dir, peft_model, adapters


def reference(
    peft_model: Any, adapter: dict[str, torch.Tensor], prompt: list[int], tokens: list[int], t: float
) -> torch.Tensor:
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(peft_model, adapter)
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        return sequence_logprobs(peft_model, ids, torch.ones_like(ids), t)[0, len(prompt) :]


@pytest.mark.parametrize("kind", ENGINES)
def test_engine_logprobs_under_the_adapter_match_the_learner(setup, kind: str) -> None:
    from agentgym.actors.engines.lora_engine import HfLoraEngine, VllmLoraEngine
    from agentgym.config import load_config

    model_dir, peft_model, adapters = setup
    spec = lora_spec(
        load_config(
            None,
            [
                "learner.lora.rank=4",
                "learner.lora.alpha=8",
                'learner.lora.target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]',
            ],
        )
    )
    assert spec is not None
    if kind == "hf":
        engine: Any = HfLoraEngine(model_dir, lora=spec, seed=0)
    else:
        engine = VllmLoraEngine(model_dir, lora=spec, seed=0, kv_cache_gib=0.25, max_model_len=512, enforce_eager=True)
    no_adapter = {k: v if ".lora_A." in k else torch.zeros_like(v) for k, v in adapters[0].items()}  # B = 0
    loop = uvloop.new_event_loop()
    run = lambda coro: loop.run_until_complete(asyncio.wait_for(coro, 600))  # noqa: E731

    async def sample(tag: str, t: float, n: int = 24) -> list[Any]:
        s = SamplingSpec(max_tokens=n, temperature=t, seed=3)
        return await asyncio.gather(*(engine.generate(f"{tag}-{i}", p, s) for i, p in enumerate(PROMPTS)))

    def check(gens: list[Any], t: float) -> None:
        """Every token's logprob is that of the adapter its version names (base: version 0)."""
        by_version = {0: no_adapter, 1: adapters[0], 2: adapters[1]}
        for p, g in zip(PROMPTS, gens, strict=True):
            assert g.versions == sorted(g.versions) and len(g.versions) == len(g.token_ids)
            for v in set(g.versions):
                idx = [i for i, x in enumerate(g.versions) if x == v]
                ref = reference(
                    peft_model, by_version[v], p + g.token_ids[: idx[0]], g.token_ids[idx[0] : idx[-1] + 1], t
                )
                d = (ref - torch.tensor(g.logprobs[idx[0] : idx[-1] + 1])).abs().max()
                print(f"\n{kind} lora logprob parity T={t} version={v}: max={float(d):.3g} n={len(idx)}")
                assert d < TOL

    try:
        run(engine.start())
        with pytest.raises(ValueError, match="not a LoRA adapter tensor"):
            run(engine.update_weights({"model.embed_tokens.weight": torch.zeros(3, 3)}, 1))
        run(engine.update_weights(adapters[0], 1))
        gens = run(sample("v1", 0.7))  # T != 1: the temperature is applied to the adapted logits
        assert all(g.versions == [1] * len(g.token_ids) for g in gens)
        check(gens, 0.7)
        # The adapter really acts: the base model gives these tokens other logprobs.
        base_lp = reference(peft_model, no_adapter, PROMPTS[0], gens[0].token_ids, 0.7)
        assert (base_lp - torch.tensor(gens[0].logprobs)).abs().max() > 0.05

        async def in_flight() -> list[Any]:  # the next adapter lands while requests run (resume mode)
            task = asyncio.ensure_future(sample("switch", 1.0, 64))
            await asyncio.sleep(0.2)
            await engine.update_weights(adapters[1], 2)
            return await task

        gens = run(in_flight())
        check(gens, 1.0)
        gens = run(sample("v2", 1.0))
        assert all(set(g.versions) <= {2} for g in gens)
        check(gens, 1.0)
    finally:
        run(engine.close())
        loop.close()
