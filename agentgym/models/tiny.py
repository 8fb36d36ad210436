"""A tiny random causal LM made from scratch: the stand-in for a real checkpoint on CPU machines.

    from agentgym.models.tiny import make_tiny_model
    make_tiny_model(Path("models/tiny"), corpus=texts, seed=0)

    python scripts/make_tiny_model.py --out models/tiny --seed 0     # or: agentgym make-model --arch tiny DIR

The result is an ordinary Hugging Face model directory (``config.json``, ``model.safetensors``,
``generation_config.json``, tokenizer files with a ChatML chat template) that
``transformers.AutoModelForCausalLM/AutoTokenizer.from_pretrained`` and vLLM load like any
checkpoint, so every loading path in the project is the real one. The architecture is Qwen2
(grouped-query attention, RoPE, SwiGLU); the weights are random (seeded, float32); the
tokenizer is a byte-pair encoding trained with ``tokenizers`` on ``corpus`` so that the
corpus's words and numbers are one or two tokens. Same arguments, same files (byte for byte).

Tokenizer choices: byte-level BPE split the way Qwen2's tokenizer splits (digits one by one),
because transformers loads any ``model_type=qwen2`` tokenizer with that pre-tokenizer. A couple
of hundred entries leave no room for all 256 bytes, so the alphabet is the bytes of printable
ASCII, newline and tab; text in that alphabet round-trips exactly, other bytes are dropped
(fine for the environments' texts, which are ASCII).
"""

from __future__ import annotations

import string
from pathlib import Path

from agentgym.protocol.chat_template import CHATML_TEMPLATE, ENDOFTEXT, IM_END, IM_START, SPECIAL_TOKENS  # noqa: F401 (re-exported)

# Head sizes vLLM's CPU attention supports (16 is not among them).
_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# Printable ASCII, newline and tab: what the environments write and the template needs.
_ALPHABET = "".join(sorted(set(string.printable) - set("\r\x0b\x0c")))
# The split that transformers' Qwen2Tokenizer applies before byte-level encoding (digits alone).
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Used when the built-in environment's corpus cannot be imported (a checkout without envpool).
FALLBACK_CORPUS: list[str] = [
    *(str(n) for n in range(0, 101)),
    "guess a number from 1 to 8",
    "higher",
    "lower",
    "correct",
    "invalid, say a number from 1 to 8",
    "You are playing a game. Answer with one number.",
]


def train_tokenizer(corpus: list[str], vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` over ``corpus``, ChatML special tokens at ids 0-2."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if not corpus:
        raise ValueError("make_tiny_model: corpus is empty; pass the texts the tokenizer should cover")
    # transformers loads every model_type=qwen2 tokenizer as its Qwen2Tokenizer, which rebuilds
    # the normalizer, pre-tokenizer and decoder itself: train with exactly those, or the saved
    # tokenizer would split text differently once loaded.
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    alphabet = sorted({c for piece, _ in byte_level.pre_tokenize_str(_ALPHABET) for c in piece})
    floor = len(alphabet) + len(SPECIAL_TOKENS)
    if vocab_size < floor:
        raise ValueError(f"make_tiny_model: vocab_size={vocab_size} is below the alphabet + special tokens ({floor})")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            byte_level,
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    # The chat template's role names and separators are part of every prompt: train on them too.
    texts = [*corpus, "system\n", "user\n", "assistant\n"]
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def make_tiny_model(
    out_dir: Path,
    *,
    corpus: list[str],
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 192,
    vocab_size: int = 192,
    max_position: int = 2048,
) -> Path:
    """Write a random Qwen2-style model and its tokenizer to ``out_dir``; returns ``out_dir``.

    ``vocab_size`` is an upper bound: the model's vocabulary is exactly the tokenizer's, which
    is smaller when the corpus has fewer distinct merges (so no token id is undecodable).
    """
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    if hidden_size % num_heads:
        raise ValueError(f"make_tiny_model: hidden_size={hidden_size} is not divisible by num_heads={num_heads}")
    head_dim = hidden_size // num_heads
    if head_dim not in _HEAD_SIZES:
        raise ValueError(
            f"make_tiny_model: head_dim={head_dim} (hidden_size={hidden_size} / num_heads={num_heads}) "
            f"is not one vLLM's CPU attention supports {_HEAD_SIZES}"
        )
    if num_heads % num_kv_heads:
        raise ValueError(f"make_tiny_model: num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = train_tokenizer(corpus, vocab_size)
    eos_id, pad_id = raw.token_to_id(IM_END), raw.token_to_id(ENDOFTEXT)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START],
        chat_template=CHATML_TEMPLATE,
        model_max_length=max_position,
        clean_up_tokenization_spaces=False,  # exact round trips: never touch spaces on decode
    )
    tokenizer.save_pretrained(out_dir)

    config = Qwen2Config(
        vocab_size=raw.get_vocab_size(),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position,
        max_window_layers=num_layers,
        use_sliding_window=False,
        # Untied, like the larger Qwen2 models: every parameter has one name in the state dict.
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's RNG
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)  # type: ignore[arg-type]  # transformers' wrapper on .to hides torch's signature
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(eos_token_id=[eos_id], pad_token_id=pad_id, do_sample=True).save_pretrained(out_dir)
    return out_dir


def default_corpus() -> list[str]:
    """The built-in environment's texts, or a fallback list when that env is not importable."""
    try:
        from agentgym.envpool.envs.guess_number import CORPUS
    except ImportError:
        return list(FALLBACK_CORPUS)
    return list(CORPUS)


def make_default_tiny_model(out_dir: Path, *, seed: int = 0) -> Path:
    """The quickstart's model: the default sizes, a tokenizer trained on ``default_corpus()``."""
    return make_tiny_model(out_dir, corpus=default_corpus() + FALLBACK_CORPUS, seed=seed)
