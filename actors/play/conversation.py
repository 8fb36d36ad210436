"""A multi-turn conversation kept as token ids, built with the model's own chat template.

    conv = Conversation.start(tokenizer, system="You play a game.", first_observation=obs)
    gen = await engine.generate(rid, conv.prompt_ids, spec)        # prompt ends with the generation prompt
    conv.add_agent_turn(gen.token_ids, gen.logprobs, gen.versions)  # appended exactly as sampled
    conv.add_observation(next_obs)                                  # the env's reply, as a template delta
    conv.token_ids, conv.loss_mask, conv.logprobs, conv.versions, conv.turn_spans

Why tokens and not text: decoding the sampled tokens and tokenizing the text again can give
different ids (a BPE merges what the model emitted as separate pieces), and then the learner
would train on tokens the model never sampled, with behaviour logprobs that belong to other
tokens. Here the sampled ids are appended untouched, and only text the environment or the
template wrote is ever tokenized. Each turn's prompt is therefore a prefix-extension of the
previous one (which also makes vLLM's prefix cache hit on every turn).

Template deltas: the text the template adds around a message is found by rendering a small
scaffold conversation with placeholder contents and taking differences, so any HF chat template
that renders a conversation as the concatenation of its messages works (ChatML, Llama 3,
Gemma, ...). A tokenizer without a template gets ChatML.

End of an agent turn: the template's end-of-turn text after the assistant content (ChatML:
``<|im_end|>\\n``) must precede the next message. When the sample ended with the stop token that
opens that text (finish "stop"), the stop token stays an agent token (loss mask 1: the model
chose to stop) and only the rest is appended; when it did not (cut at max_tokens), the whole
end-of-turn text is appended with loss mask 0, so the model is never trained to emit a stop
token it did not sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from agentgym.protocol.chat_template import CHATML_TEMPLATE

# Placeholder contents for the scaffold conversation; never part of a real prompt. Plain
# letters, so templates that trim or escape contents leave them alone.
_USER = "AGENTGYMUSERPLACEHOLDER"
_AGENT = "AGENTGYMAGENTPLACEHOLDER"


class Conversation:
    """Token ids, loss mask, behaviour logprobs and weight versions of one episode so far."""

    def __init__(self, tokenizer: Any, system: str | None) -> None:
        self.tokenizer = tokenizer
        self.system = system
        # Fallback for tokenizers that ship without a template (base models).
        self.template: str | None = None if getattr(tokenizer, "chat_template", None) else CHATML_TEMPLATE
        self._ids: list[int] = []
        self._mask: list[int] = []
        self._logprobs: list[float] = []
        self._versions: list[int] = []
        self.turn_spans: list[tuple[int, int]] = []
        """``(start, end)`` of each agent turn's sampled tokens in ``token_ids``."""
        self._awaiting_agent = False
        self._special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
        self._head = [{"role": "system", "content": system}] if system is not None else []
        scaffold = self._render(
            [*self._head, {"role": "user", "content": _USER}, {"role": "assistant", "content": _AGENT}]
        )
        # Everything the template writes after an assistant message's content.
        self.end_of_turn = scaffold[scaffold.index(_AGENT) + len(_AGENT) :]

    # ------------------------------------------------------------------ building
    @classmethod
    def start(cls, tokenizer: Any, system: str | None, first_observation: str) -> Conversation:
        """The conversation's first prompt: optional system message, the first observation, then
        the template's generation prompt."""
        conv = cls(tokenizer, system)
        messages = [*conv._head, {"role": "user", "content": first_observation}]
        conv._extend(conv._encode(conv._render(messages, add_generation_prompt=True)))
        conv._awaiting_agent = True
        return conv

    @classmethod
    def restore(
        cls,
        tokenizer: Any,
        system: str | None,
        token_ids: Iterable[int],
        loss_mask: Iterable[int],
        logprobs: Iterable[float],
        versions: Iterable[int],
        turn_ends: Iterable[int],
    ) -> Conversation:
        """A conversation another actor began, from its arrays (a hand-over, actors/play/handover.py):
        it ends with the generation prompt of the next turn, as ``prompt_ids`` needs."""
        conv = cls(tokenizer, system)
        conv._ids, conv._mask = [int(t) for t in token_ids], [int(m) for m in loss_mask]
        conv._logprobs, conv._versions = [float(x) for x in logprobs], [int(v) for v in versions]
        for end in (int(e) for e in turn_ends):
            start = end
            while start > 0 and conv._mask[start - 1] == 1:  # the turn's sampled tokens: a run of mask 1
                start -= 1
            conv.turn_spans.append((start, end))
        conv._awaiting_agent = True
        return conv

    @property
    def prompt_ids(self) -> list[int]:
        """Every token so far, ending with the generation prompt: what the engine continues."""
        if not self._awaiting_agent:
            raise RuntimeError("Conversation.prompt_ids: the agent just spoke; add an observation first")
        return list(self._ids)

    def add_agent_turn(self, token_ids: Sequence[int], logprobs: Sequence[float], version: int | Sequence[int]) -> None:
        """Append the sampled tokens as they are (loss mask 1), then close the turn.

        ``version``: the weight version of every token, or one per token (``Generation.versions``:
        a turn generated across a weight update carries two)."""
        if not self._awaiting_agent:
            raise RuntimeError("Conversation.add_agent_turn: two agent turns in a row (no observation between)")
        if len(token_ids) != len(logprobs):
            raise ValueError(f"Conversation.add_agent_turn: {len(token_ids)} token ids but {len(logprobs)} logprobs")
        versions = [int(version)] * len(token_ids) if isinstance(version, int) else [int(v) for v in version]
        if len(versions) != len(token_ids):
            raise ValueError(f"Conversation.add_agent_turn: {len(token_ids)} token ids but {len(versions)} versions")
        if any(v < 0 for v in versions):
            raise ValueError(f"Conversation.add_agent_turn: versions must be >= 0, got {min(versions)}")
        start = len(self._ids)
        self._ids.extend(int(t) for t in token_ids)
        self._mask.extend([1] * len(token_ids))
        self._logprobs.extend(float(x) for x in logprobs)
        self._versions.extend(versions)
        self.turn_spans.append((start, len(self._ids)))
        self._extend(self._encode(self._closing(token_ids)))
        self._awaiting_agent = False

    @property
    def closing_tokens(self) -> int:
        """Most tokens ``add_agent_turn`` appends after the sampled ones (the end-of-turn text)."""
        return len(self._encode(self.end_of_turn))

    def add_observation(self, text: str, max_len: int | None = None) -> bool:
        """Append the environment's message and the generation prompt, rendered by the template.

        With ``max_len``: if the conversation would grow past it, append nothing and return
        False (the episode's token budget is spent); else True."""
        if self._awaiting_agent:
            raise RuntimeError("Conversation.add_observation: the agent has not answered the last observation")
        base = [*self._head, {"role": "user", "content": _USER}, {"role": "assistant", "content": _AGENT}]
        before = self._render(base)
        after = self._render([*base, {"role": "user", "content": text}], add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError(
                "Conversation.add_observation: the chat template re-renders earlier messages when a "
                "user message follows an assistant message, so a turn cannot be appended as a delta; "
                f"rendered {before[-80:]!r} then {after[: len(before)][-80:]!r}"
            )
        ids = self._encode(after[len(before) :])
        if max_len is not None and len(self._ids) + len(ids) > max_len:
            return False
        self._extend(ids)
        self._awaiting_agent = True
        return True

    def truncate(self, max_len: int) -> None:
        """Cut a prompt that alone exceeds the episode's budget to its first ``max_len`` tokens
        (the episode then ends as a token_limit truncation, with no agent turn)."""
        if self.turn_spans:
            raise RuntimeError("Conversation.truncate: only a first prompt (no agent turn yet) can be cut")
        for seq in (self._ids, self._mask, self._logprobs, self._versions):
            del seq[max_len:]

    # ------------------------------------------------------------------ arrays out
    @property
    def token_ids(self) -> np.ndarray:
        return np.asarray(self._ids, dtype=np.int32)

    @property
    def loss_mask(self) -> np.ndarray:
        """1 for tokens the agent sampled, 0 for template and environment tokens."""
        return np.asarray(self._mask, dtype=np.uint8)

    @property
    def logprobs(self) -> np.ndarray:
        """Behaviour logprob of each agent token; 0 elsewhere."""
        return np.asarray(self._logprobs, dtype=np.float32)

    @property
    def versions(self) -> np.ndarray:
        """Weight version that sampled each agent token; -1 elsewhere."""
        return np.asarray(self._versions, dtype=np.int32)

    def __len__(self) -> int:
        return len(self._ids)

    # ------------------------------------------------------------------ helpers
    def _closing(self, token_ids: Sequence[int]) -> str:
        """The end-of-turn text still missing after the sampled tokens."""
        if token_ids and int(token_ids[-1]) in self._special_ids:
            last = self.tokenizer.decode([int(token_ids[-1])], skip_special_tokens=False)
            if last and self.end_of_turn.startswith(last):  # the agent sampled the stop token itself
                return self.end_of_turn[len(last) :]
        return self.end_of_turn

    def _extend(self, ids: list[int]) -> None:
        self._ids.extend(ids)
        self._mask.extend([0] * len(ids))
        self._logprobs.extend([0.0] * len(ids))
        self._versions.extend([-1] * len(ids))

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, chat_template=self.template
        )
        if not isinstance(text, str):
            raise TypeError(f"Conversation: apply_chat_template returned {type(text).__name__}, expected str")
        return text

    def _encode(self, text: str) -> list[int]:
        # The template already wrote any BOS / special markers as text: add nothing more.
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []
