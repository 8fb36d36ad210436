"""One maker for every model shape the project knows, by name: ``tiny`` (agentgym/models/tiny.py),
the agent family (agent.py) and the real architectures' shapes (shapes.py), random weights, seeded.

    make_model("qwen2.5-0.5b", Path("models/qwen0.5b-shape"))     # returns the directory

``agentgym make-model --arch`` (agentgym/cli/make_model.py) and the benches call it.
"""

from __future__ import annotations

import time
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)


def make_model(arch: str, out_dir: Path, *, seed: int = 0, dtype: str | None = None) -> Path:
    """Write the model of shape ``arch`` to ``out_dir``; returns ``out_dir``."""
    from agentgym.models.shapes import SHAPES
    from agentgym.models.tiny import FALLBACK_CORPUS, default_corpus, make_default_tiny_model

    if arch == "tiny":
        return make_default_tiny_model(out_dir, seed=seed)
    from agentgym.models.agent import SIZES, make_agent_model

    if arch in SIZES:
        return make_agent_model(out_dir, arch, seed=seed)
    if arch not in SHAPES:
        raise ValueError(f"make-model: unknown --arch {arch!r}; known: tiny, {', '.join(SHAPES)}")
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    shape = SHAPES[arch]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer, eos, pad = _tokenizer(default_corpus() + FALLBACK_CORPUS, shape.max_position_embeddings)
    if tokenizer.vocab_size > shape.vocab_size:
        raise ValueError(
            f"make-model: tokenizer has {tokenizer.vocab_size} tokens, more than {arch}'s {shape.vocab_size}"
        )
    tokenizer.save_pretrained(out_dir)
    config = shape.hf_config(eos=eos, pad=pad)
    tdtype = getattr(torch, dtype or shape.torch_dtype)
    t0 = time.monotonic()
    with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's RNG
        torch.manual_seed(seed)
        # Built directly in the target dtype: a float32 1.5B would need 6 GiB for a moment.
        model = AutoModelForCausalLM.from_config(config, dtype=tdtype)
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(eos_token_id=[eos], pad_token_id=pad, do_sample=True).save_pretrained(out_dir)
    log.info("model_made", arch=arch, path=str(out_dir), params=sum(p.numel() for p in model.parameters()),
             dtype=str(tdtype), seconds=round(time.monotonic() - t0, 1))  # fmt: skip
    return out_dir


def _tokenizer(corpus: list[str], max_length: int):
    from transformers import PreTrainedTokenizerFast

    from agentgym.models.tiny import train_tokenizer
    from agentgym.protocol.chat_template import CHATML_TEMPLATE, ENDOFTEXT, IM_END, IM_START

    raw = train_tokenizer(corpus, 512)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token=IM_END, pad_token=ENDOFTEXT, additional_special_tokens=[IM_START],
        chat_template=CHATML_TEMPLATE, model_max_length=max_length, clean_up_tokenization_spaces=False,
    )  # fmt: skip
    return tok, raw.token_to_id(IM_END), raw.token_to_id(ENDOFTEXT)
