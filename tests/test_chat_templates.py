"""Conversations as tokens under other model families' chat templates (Llama 3, Mistral, Gemma).

No model hub here: each family gets a tiny local tokenizer (byte-level BPE trained with
``tokenizers``) that carries the family's special tokens and its real chat template as a jinja
string. The checks: the final token list equals the template's rendering of the whole
conversation tokenized once (what the learner trains on is what the model saw), the sampled
stop token is the agent's own (mask 1), a turn cut at max_tokens is closed with masked template
tokens, and decoding + re-tokenizing would have changed the ids on cases built here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from agentgym.actors.play.conversation import Conversation
from agentgym.models.tiny import train_tokenizer

CORPUS = [
    "guess a number from 1 to 8",
    "higher",
    "lower",
    "correct",
    "invalid",
    "model",
    "INST",
    *map(str, range(1, 9)),
]

# Meta-Llama-3-8B-Instruct's template.
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# Mistral-7B-Instruct-v0.1/v0.2's template (no system role, no generation prompt).
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
# gemma-2-it's template (no system role).
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)


@dataclass
class Family:
    name: str
    template: str
    bos: str
    eos: str
    stop: str  # the token an instruct model of this family ends its turn with
    extra: tuple[str, ...]
    system: str | None


FAMILIES = [
    Family(
        "llama3",
        LLAMA3,
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|eot_id|>",
        ("<|start_header_id|>", "<|end_header_id|>", "<|end_of_text|>"),
        "Answer with one number.",
    ),
    Family("mistral", MISTRAL, "<s>", "</s>", "</s>", (), None),
    Family("gemma", GEMMA, "<bos>", "<eos>", "<end_of_turn>", ("<start_of_turn>", "<end_of_turn>"), None),
]


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f.name)
def fam(request: pytest.FixtureRequest):
    from transformers import PreTrainedTokenizerFast

    f: Family = request.param
    raw = train_tokenizer(CORPUS, vocab_size=256)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=f.bos,
        eos_token=f.eos,
        additional_special_tokens=list(f.extra),
        chat_template=f.template,
        clean_up_tokenization_spaces=False,
    )
    return f, tok


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def stop_id(f: Family, tok) -> int:
    (i,) = encode(tok, f.stop)
    return i


def test_family_tokens_are_special_tokens(fam) -> None:
    f, tok = fam
    for s in (f.bos, f.eos, f.stop, *f.extra):
        assert len(encode(tok, s)) == 1, f"{s} must be one token"


def test_episode_tokens_equal_the_whole_rendering_tokenized_once(fam) -> None:
    f, tok = fam
    stop = stop_id(f, tok)
    conv = Conversation.start(tok, f.system, "guess a number from 1 to 8")
    messages = ([{"role": "system", "content": f.system}] if f.system else []) + [
        {"role": "user", "content": "guess a number from 1 to 8"}
    ]
    answers = []
    for answer, obs in [("4", "higher"), ("6", "lower"), ("5", None)]:
        sampled = [*encode(tok, answer), stop]
        conv.add_agent_turn(sampled, [-0.5] * len(sampled), version=2)
        answers.append(sampled)
        messages.append({"role": "assistant", "content": answer})
        if obs is not None:
            conv.add_observation(obs)
            messages.append({"role": "user", "content": obs})
    full = tok.apply_chat_template(messages, tokenize=False)
    assert conv.token_ids.tolist() == encode(tok, full)
    assert conv.token_ids[0] == tok.bos_token_id  # the template's BOS, written once
    # Agent tokens are exactly the sampled ones, stop token included; the rest is masked.
    agent = np.zeros(len(conv), dtype=bool)
    for (start, end), sampled in zip(conv.turn_spans, answers):
        assert conv.token_ids[start:end].tolist() == sampled
        agent[start:end] = True
    assert (conv.loss_mask == agent).all()
    assert (conv.versions[agent] == 2).all() and (conv.versions[~agent] == -1).all()


def test_turn_cut_at_max_tokens_gets_the_end_of_turn_masked(fam) -> None:
    f, tok = fam
    conv = Conversation.start(tok, f.system, "guess")
    sampled = encode(tok, "12")  # no stop token: the engine stopped at max_tokens
    conv.add_agent_turn(sampled, [-1.0] * len(sampled), version=0)
    conv.add_observation("higher")
    _, end = conv.turn_spans[0]
    assert f.stop in conv.end_of_turn
    closing = encode(tok, conv.end_of_turn)
    assert conv.token_ids[end : end + len(closing)].tolist() == closing
    assert (conv.loss_mask[end:] == 0).all()


def test_retokenizing_the_text_would_have_changed_the_ids(fam) -> None:
    f, tok = fam
    vocab = tok.get_vocab()
    # Sampled as single letters, a word whose merged token exists: the text re-tokenizes to it.
    word = next(w for w in ("higher", "lower", "correct", "guess") if w in vocab or f"Ġ{w}" in vocab)
    pieces = [vocab[c] for c in word]
    sampled = [*pieces, stop_id(f, tok)]
    conv = Conversation.start(tok, f.system, "guess a number from 1 to 8")
    conv.add_agent_turn(sampled, [-0.3] * len(sampled), version=1)
    conv.add_observation("lower")
    start, end = conv.turn_spans[0]
    assert conv.token_ids[start:end].tolist() == sampled
    # A text pipeline (decode the episode, encode it again) trains on other ids than sampled.
    text = tok.decode(conv.token_ids.tolist(), skip_special_tokens=False)
    retokenized = encode(tok, text)
    assert retokenized != conv.token_ids.tolist()
    assert len(retokenized) < len(conv)  # the letters merged into one token


def test_template_without_system_role_reports_it(fam) -> None:
    f, tok = fam
    if f.system is not None:
        pytest.skip("this family's template has a system role")
    with pytest.raises(Exception, match="ystem role not supported|roles must alternate"):
        Conversation.start(tok, "You play a game.", "guess")
