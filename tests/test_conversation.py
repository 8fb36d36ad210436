"""Conversations as tokens: prompts grow by prefix-extension, sampled tokens are kept exactly.

Uses the tiny model's real tokenizer (trained by ``make_tiny_model``) and, for a realistic
episode, samples agent turns from the tiny model with ``transformers``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from agentgym.actors.play.conversation import Conversation
from agentgym.models.tiny import CHATML_TEMPLATE, IM_END, make_tiny_model

CORPUS = ["guess a number from 1 to 8", "higher", "lower", "correct", "invalid", *map(str, range(1, 9))]
SYSTEM = "You play a guessing game. Answer with one number."


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("conv") / "tiny", corpus=CORPUS, seed=0)


@pytest.fixture(scope="module")
def tok(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_episode_prompts_grow_by_prefix_and_agent_tokens_are_exact(model_dir: Path, tok) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(0)
    conv = Conversation.start(tok, SYSTEM, "guess a number from 1 to 8")
    gen_prompt = encode(tok, "<|im_start|>assistant\n")
    prompts, samples = [], []
    for turn, obs in enumerate(["higher", "lower", "correct"]):
        prompt = conv.prompt_ids
        assert prompt[-len(gen_prompt) :] == gen_prompt
        if prompts:  # each prompt extends the previous one: the engine's prefix cache hits
            assert prompt[: len(prompts[-1])] == prompts[-1] and len(prompt) > len(prompts[-1])
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                do_sample=True,
                max_new_tokens=6,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
                output_scores=True,
                return_dict_in_generate=True,
            )
        sampled = out.sequences[0, len(prompt) :].tolist()
        logps = [float(torch.log_softmax(s[0], -1)[t]) for s, t in zip(out.scores, sampled)]
        conv.add_agent_turn(sampled, logps, version=turn + 3)
        conv.add_observation(obs)
        prompts.append(prompt)
        samples.append((sampled, logps, turn + 3))

    ids, mask, lps, vers = conv.token_ids, conv.loss_mask, conv.logprobs, conv.versions
    assert ids.dtype == np.int32 and mask.dtype == np.uint8 and lps.dtype == np.float32 and vers.dtype == np.int32
    assert len(ids) == len(mask) == len(lps) == len(vers) == len(conv)
    assert ids[: len(prompts[-1])].tolist() == prompts[-1]
    assert len(conv.turn_spans) == 3
    agent = np.zeros(len(ids), dtype=bool)
    for (start, end), (sampled, logps, version) in zip(conv.turn_spans, samples):
        assert ids[start:end].tolist() == sampled  # exactly as sampled
        assert lps[start:end].tolist() == pytest.approx(logps)
        assert (vers[start:end] == version).all()
        assert start == len(prompts[conv.turn_spans.index((start, end))])  # a turn starts where its prompt ended
        agent[start:end] = True
    assert (mask == agent).all()
    assert (lps[~agent] == 0).all() and (vers[~agent] == -1).all()
    assert agent.sum() == sum(len(s) for s, _, _ in samples)


def test_tokens_equal_the_template_rendering_of_the_whole_conversation(tok) -> None:
    # With agent turns that are the canonical tokenization of their text plus the stop token,
    # the token list equals the template's rendering of the full conversation, tokenized once.
    eos = tok.eos_token_id
    conv = Conversation.start(tok, SYSTEM, "guess a number from 1 to 8")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "guess a number from 1 to 8"}]
    for answer, obs in [("4", "higher"), ("6", "lower"), ("5", "correct")]:
        conv.add_agent_turn([*encode(tok, answer), eos], [-1.0] * (len(encode(tok, answer)) + 1), version=0)
        messages.append({"role": "assistant", "content": answer})
        if obs != "correct":
            conv.add_observation(obs)
            messages.append({"role": "user", "content": obs})
    full = tok.apply_chat_template(messages, tokenize=False)
    assert conv.token_ids.tolist() == encode(tok, full)
    # The stop token the agent sampled is its own (mask 1); the template's newline is not.
    for _, end in conv.turn_spans:
        assert conv.token_ids[end - 1] == eos and conv.loss_mask[end - 1] == 1
        assert conv.loss_mask[end] == 0


def test_sampled_tokens_are_kept_even_where_retokenizing_differs(tok) -> None:
    # A multi-character vocabulary entry sampled as single characters: decoding and encoding
    # the text again gives the merged token, i.e. different ids than the model sampled.
    vocab = tok.get_vocab()
    word = next(
        w
        for w, i in sorted(vocab.items(), key=lambda kv: kv[1])
        if len(w) >= 3 and w.isalpha() and all(c in vocab for c in w)
    )
    pieces = [vocab[c] for c in word]
    sampled = [*pieces, tok.eos_token_id]
    retokenized = encode(tok, tok.decode(sampled, skip_special_tokens=False))
    assert retokenized != sampled  # the point: text round trips would change the tokens

    conv = Conversation.start(tok, None, "guess a number from 1 to 8")
    conv.add_agent_turn(sampled, [-0.5] * len(sampled), version=1)
    conv.add_observation("higher")
    start, end = conv.turn_spans[0]
    assert conv.token_ids[start:end].tolist() == sampled
    assert conv.prompt_ids[start:end] == sampled


def test_a_turn_cut_at_max_tokens_is_closed_with_masked_end_of_turn(tok) -> None:
    conv = Conversation.start(tok, None, "guess")
    sampled = encode(tok, "12")  # no stop token: the engine hit max_tokens
    conv.add_agent_turn(sampled, [-1.0] * len(sampled), version=0)
    start, end = conv.turn_spans[0]
    closing = conv.token_ids[end:].tolist()
    assert closing == encode(tok, f"{IM_END}\n")
    assert (conv.loss_mask[end:] == 0).all() and (conv.versions[end:] == -1).all()
    assert conv.end_of_turn == f"{IM_END}\n"


def test_tokenizer_without_a_chat_template_gets_chatml(tok) -> None:
    bare = copy.deepcopy(tok)
    bare.chat_template = None
    conv = Conversation.start(bare, SYSTEM, "guess a number from 1 to 8")
    assert conv.template == CHATML_TEMPLATE
    expected = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nguess a number from 1 to 8<|im_end|>\n<|im_start|>assistant\n"
    assert conv.prompt_ids == encode(bare, expected)
    conv.add_agent_turn([*encode(bare, "3"), bare.eos_token_id], [-1.0, -1.0], version=0)
    conv.add_observation("higher")
    assert bare.decode(conv.prompt_ids, skip_special_tokens=False) == (
        expected + "3<|im_end|>\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"
    )


def test_any_concatenating_template_works(tok) -> None:
    # A Gemma-style template whose markers are plain text for this tokenizer.
    gemma = copy.deepcopy(tok)
    gemma.chat_template = (
        "{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
        "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    )
    conv = Conversation.start(gemma, None, "guess a number")
    assert conv.end_of_turn == "<end_of_turn>\n"
    conv.add_agent_turn(encode(gemma, "7"), [-2.0], version=0)
    conv.add_observation("lower")
    text = gemma.decode(conv.prompt_ids, skip_special_tokens=False)
    assert text == (
        "<start_of_turn>user\nguess a number<end_of_turn>\n<start_of_turn>model\n7<end_of_turn>\n"
        "<start_of_turn>user\nlower<end_of_turn>\n<start_of_turn>model\n"
    )


def test_template_that_rewrites_history_is_refused(tok) -> None:
    odd = copy.deepcopy(tok)
    # Renders only the last message: appending a turn changes what came before.
    odd.chat_template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>{% endif %}"
    conv = Conversation.start(odd, None, "guess")
    conv.add_agent_turn(encode(odd, "1"), [-1.0], version=0)
    with pytest.raises(ValueError, match="re-renders earlier messages"):
        conv.add_observation("higher")


def test_misuse_is_reported(tok) -> None:
    conv = Conversation.start(tok, None, "guess")
    with pytest.raises(RuntimeError, match="agent has not answered"):
        conv.add_observation("higher")
    with pytest.raises(ValueError, match="2 token ids but 1 logprobs"):
        conv.add_agent_turn([5, 6], [-1.0], version=0)
    conv.add_agent_turn([5], [-1.0], version=0)
    with pytest.raises(RuntimeError, match="add an observation first"):
        _ = conv.prompt_ids
    with pytest.raises(RuntimeError, match="two agent turns in a row"):
        conv.add_agent_turn([5], [-1.0], version=0)
