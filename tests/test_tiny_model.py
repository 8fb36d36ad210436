"""The tiny model maker: a real HF directory, an exact tokenizer, the same bytes for the same seed."""

from __future__ import annotations

import hashlib
import json
import string
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym.models.tiny import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    default_corpus,
    make_default_tiny_model,
    make_tiny_model,
)

REPO = Path(__file__).resolve().parents[1]
CORPUS = default_corpus()


def digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", corpus=CORPUS, seed=0)


@pytest.fixture(scope="module")
def tok(tiny: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


def test_directory_loads_as_a_qwen2_causal_lm(tiny: Path, tok) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny)
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.architectures == ["Qwen2ForCausalLM"]
    assert cfg.hidden_size // cfg.num_attention_heads >= 32  # vLLM's CPU attention has no head size 16
    assert cfg.vocab_size == len(tok) <= 192
    assert all(p.dtype == torch.float32 for p in model.parameters())
    logits = model(torch.tensor([[1, 5, 6]])).logits
    assert logits.shape == (1, 3, cfg.vocab_size)
    gen = json.loads((tiny / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.convert_tokens_to_ids(IM_END)]


def test_tokenizer_special_tokens_and_chat_template(tok) -> None:
    assert tok.convert_ids_to_tokens([0, 1, 2]) == [ENDOFTEXT, IM_START, IM_END]
    assert tok.eos_token == IM_END and tok.pad_token == ENDOFTEXT
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "guess a number"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (
        text
        == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nguess a number<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode(text, add_special_tokens=False)
    assert ids.count(1) == 3 and ids.count(2) == 2  # markers are single special tokens


def test_corpus_round_trips_and_its_words_are_short(tok) -> None:
    for text in CORPUS:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    words = {w.strip(".,") for text in CORPUS for w in text.split()}
    for w in words:
        assert 1 <= len(tok.encode(w, add_special_tokens=False)) <= 2, w


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", ""), max_size=80))
def test_any_ascii_text_round_trips(tok, text: str) -> None:
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_same_seed_same_bytes_other_seed_other_weights(tiny: Path, tmp_path: Path) -> None:
    again = make_tiny_model(tmp_path / "again", corpus=CORPUS, seed=0)
    other = make_tiny_model(tmp_path / "other", corpus=CORPUS, seed=1)
    assert digests(again) == digests(tiny)
    d_other = digests(other)
    assert d_other["model.safetensors"] != digests(tiny)["model.safetensors"]
    assert d_other["tokenizer.json"] == digests(tiny)["tokenizer.json"]  # the tokenizer does not depend on the seed


def test_cli_writes_the_default_model(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_tiny_model.py"), "--out", str(out), "--seed", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert digests(out) == digests(make_default_tiny_model(tmp_path / "fn", seed=0))


def test_bad_sizes_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="head_dim=16"):
        make_tiny_model(tmp_path / "a", corpus=CORPUS, hidden_size=64, num_heads=4)
    with pytest.raises(ValueError, match="corpus is empty"):
        make_tiny_model(tmp_path / "b", corpus=[])
    with pytest.raises(ValueError, match="vocab_size=50"):
        make_tiny_model(tmp_path / "c", corpus=CORPUS, vocab_size=50)
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        make_tiny_model(tmp_path / "d", corpus=CORPUS, num_heads=2, num_kv_heads=3)
