"""The published shapes of a few real architectures, to build same-shaped random models locally.

    from agentgym.models.shapes import SHAPES
    SHAPES["qwen2.5-0.5b"].hf_config(vocab_size=151936, eos=2, pad=0)   # a transformers config

Sources (the checkpoints' own ``config.json`` files on the Hugging Face hub, as transformers'
``Qwen2Config`` / ``LlamaConfig`` read them):
- Qwen/Qwen2.5-0.5B(-Instruct)/config.json: hidden 896, 24 layers, 14 heads, 2 KV heads,
  intermediate 4864, vocab 151936, tie_word_embeddings true, rope_theta 1e6, rms eps 1e-6,
  max_position_embeddings 32768, torch_dtype bfloat16.
- Qwen/Qwen2.5-1.5B(-Instruct)/config.json: hidden 1536, 28 layers, 12 heads, 2 KV heads,
  intermediate 8960, vocab 151936, tied, rope_theta 1e6, rms eps 1e-6, 32768 positions, bfloat16.
- meta-llama/Llama-3.2-1B/config.json: hidden 2048, 16 layers, 32 heads, 8 KV heads, head_dim
  64, intermediate 8192, vocab 128256, tied, rope_theta 5e5, rope_scaling llama3 (factor 32,
  low 1, high 4, original 8192), rms eps 1e-5, 131072 positions, bfloat16.
Parameter counts (tests/test_make_model.py checks them without allocating): 494,032,768,
1,543,714,304 and 1,235,814,400 (the published 0.49B, 1.54B and 1.24B).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict


class _CommonConfig(TypedDict):
    """The keyword arguments that ``Qwen2Config`` and ``LlamaConfig`` take alike here."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rope_parameters: dict[str, Any]
    rms_norm_eps: float
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_id: int
    pad_token_id: int


@dataclass(frozen=True)
class ArchShape:
    name: str
    model_type: str  # "qwen2" | "llama"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    torch_dtype: str = "bfloat16"
    rope_scaling: dict[str, Any] | None = field(default=None)

    def hf_config(self, *, eos: int, pad: int) -> Any:
        """The transformers config of this shape, with the project tokenizer's special ids."""
        from transformers import LlamaConfig, Qwen2Config

        # transformers 5 takes rope_theta and the published rope_scaling as one rope_parameters.
        rope = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}
        common = _CommonConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters=rope,
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=self.tie_word_embeddings,
            bos_token_id=None,
            eos_token_id=eos,
            pad_token_id=pad,
        )
        cfg: Qwen2Config | LlamaConfig
        if self.model_type == "qwen2":
            cfg = Qwen2Config(**common, use_sliding_window=False, max_window_layers=self.num_layers)
            cfg.architectures = ["Qwen2ForCausalLM"]
        elif self.model_type == "llama":
            cfg = LlamaConfig(**common, head_dim=self.hidden_size // self.num_heads)
            cfg.architectures = ["LlamaForCausalLM"]
        else:
            raise ValueError(f"ArchShape {self.name}: unknown model_type {self.model_type!r}")
        return cfg

    def num_params(self) -> int:
        """Parameters of the model (tied embeddings counted once), computed from the shape."""
        h, hd = self.hidden_size, self.hidden_size // self.num_heads
        kv = self.num_kv_heads * hd
        qkv_bias = h + 2 * kv if self.model_type == "qwen2" else 0  # Qwen2 has q/k/v biases
        attn = h * h + 2 * h * kv + h * h + qkv_bias
        mlp = 3 * h * self.intermediate_size
        layer = attn + mlp + 2 * h  # two RMSNorm weights
        emb = self.vocab_size * h
        return self.num_layers * layer + emb * (1 if self.tie_word_embeddings else 2) + h


SHAPES: dict[str, ArchShape] = {
    s.name: s
    for s in (
        ArchShape("qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 4864, 151936, True, 32768, 1e6, 1e-6),
        ArchShape("qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 8960, 151936, True, 32768, 1e6, 1e-6),
        ArchShape(
            "llama-3.2-1b",
            "llama",
            2048,
            16,
            32,
            8,
            8192,
            128256,
            True,
            131072,
            5e5,
            1e-5,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
    )
}
