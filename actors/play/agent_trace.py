"""One agent conversation seen through the agent endpoint, kept as exact token ids; it becomes an Episode.

    trace = AgentTrace(tokenizer)
    plan = trace.plan(messages, tools)              # the prompt ids the engine continues
    gen = await engine.generate(rid, plan.prompt_ids, spec)
    trace.record(plan, gen)                         # generated ids, behaviour logprobs, versions
    episode = trace.to_episode(reward=1.0, success=True, finish="done", turn_limit=6)

Token-exact: an agent sends its whole history with every call, as messages. The endpoint renders
them with the model's chat template. When that text starts with the text of everything this
conversation's current segment holds (the previous prompt and the completion as the model sampled
it), the new prompt is the segment's own token ids plus the tokens of the text after it: the
sampled ids are never decoded and encoded again, so the learner trains exactly the ids the engine
produced and reads its logprobs at the places they were sampled (a BPE may tokenize the decoded
text differently from how the model emitted it; reusing the ids sidesteps that).

When the rendered text does not extend the segment (the agent edited or dropped history, or the
template rewrote an earlier turn: reasoning stripped, a tool call reformatted, content trimmed),
the call is a prefix break: it opens a new segment whose prompt is the rendered text tokenized
afresh. Each segment is a sequence the model really saw, so each trains correctly on its own;
``Episode.segment_ends`` tells the learner where one ends and the next begins, and
``prefix_breaks`` counts the breaks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.actors.engines.engine import Generation
from agentgym.protocol import Episode
from agentgym.protocol.arrays import F32, I32, U8, pack
from agentgym.protocol.chat_template import CHATML_TEMPLATE
from agentgym.protocol.messages import EpisodeFinish


class BudgetExceeded(Exception):
    """The call's prompt leaves no room for a sampled token within the episode's token budget."""


@dataclass
class Segment:
    """Token ids the model saw in one unbroken run of calls, and their rendered text."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)
    text: str = ""
    """The text these ids decode to as the template renders them: what the next call must extend."""

    def extend(self, ids: Sequence[int]) -> None:
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.versions.extend([-1] * len(ids))


@dataclass(frozen=True)
class Plan:
    """What one call sends to the engine, before it runs (a failed call changes nothing)."""

    prompt_ids: list[int]
    delta_ids: list[int]
    """The tokens appended to the current segment (the whole prompt when ``extends`` is False)."""
    text: str
    extends: bool


@dataclass(frozen=True)
class CallRecord:
    """Exactly what one call gave and got: for tests and for the conversation's own log."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    extends: bool


class AgentTrace:
    """The token-level record of one conversation: segments of calls, breaks between them."""

    def __init__(self, tokenizer: Any, budget: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.budget = budget
        """Most tokens the episode may hold, all segments together (rollout.max_episode_tokens)."""
        self.template: str | None = None if getattr(tokenizer, "chat_template", None) else CHATML_TEMPLATE
        self.segments: list[Segment] = []
        self.calls: list[CallRecord] = []
        self.prefix_breaks = 0
        self._special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])

    def __len__(self) -> int:
        return sum(len(s.ids) for s in self.segments)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=True, chat_template=self.template
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text

    def plan(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Plan:
        """The prompt for a call with these messages: the current segment's ids and the new
        text's tokens when the rendered text extends it, else the whole text in a new segment.
        Raises ``BudgetExceeded`` when no sampled token would fit in the episode's budget."""
        text = self.render(messages, tools)
        seg = self.segments[-1] if self.segments else None
        if seg is not None and text.startswith(seg.text):
            delta = self._encode(text[len(seg.text) :])
            plan = Plan(seg.ids + delta, delta, text, True)
            used = len(self) + len(delta)
        else:
            ids = self._encode(text)
            plan = Plan(ids, ids, text, False)
            used = len(self) + len(ids)
        if self.budget is not None and used + 1 > self.budget:
            raise BudgetExceeded(f"the prompt brings the episode to {used} tokens; its budget is {self.budget}")
        return plan

    def room(self, plan: Plan) -> int:
        """Tokens the call may sample within the budget (None budget: unbounded, a large number)."""
        if self.budget is None:
            return 1 << 30
        return self.budget - len(self) - len(plan.delta_ids)

    def record(self, plan: Plan, gen: Generation) -> str:
        """Keep the call: the prompt delta (mask 0) and the sampled ids exactly (mask 1). Returns
        the completion's text as a chat message carries it (special tokens left out)."""
        if not plan.extends:
            if self.segments:
                self.prefix_breaks += 1
            self.segments.append(Segment())
        seg = self.segments[-1]
        seg.extend(plan.delta_ids)
        seg.ids.extend(int(t) for t in gen.token_ids)
        seg.mask.extend([1] * len(gen.token_ids))
        seg.logprobs.extend(float(x) for x in gen.logprobs)
        seg.versions.extend(int(v) for v in gen.versions)
        seg.turn_ends.append(len(seg.ids))
        # What the template will render for this completion when the agent sends it back: the
        # sampled text, stop token included (ChatML's <|im_end|> is both the stop token and the
        # start of the template's end of turn).
        seg.text = plan.text + self._decode(gen.token_ids)
        self.calls.append(
            CallRecord(
                list(plan.prompt_ids),
                list(gen.token_ids),
                list(gen.logprobs),
                list(gen.versions),
                gen.finish_reason,
                plan.extends,
            )
        )
        # The message content: everything sampled but the closing stop token. Special tokens
        # sampled inside the content stay as text, so that the message sent back renders (and
        # tokenizes) to the same ids; a server that drops them would break the prefix there.
        ids = list(gen.token_ids)
        if gen.finish_reason == "stop" and ids and ids[-1] in self._special_ids:
            ids.pop()
        return self._decode(ids)

    def to_episode(
        self, *, reward: float, success: bool, finish: EpisodeFinish, turn_limit: int, failure: str = ""
    ) -> Episode:
        """The conversation as one Episode: segments laid end to end (``segment_ends`` marks
        them), one turn per call, the reward on the last call."""
        ids: list[int] = []
        mask: list[int] = []
        logps: list[float] = []
        vers: list[int] = []
        turn_ends: list[int] = []
        ends: list[int] = []
        for seg in self.segments:
            turn_ends += [len(ids) + e for e in seg.turn_ends]
            ids += seg.ids
            mask += seg.mask
            logps += seg.logprobs
            vers += seg.versions
            ends.append(len(ids))
        rewards = [0.0] * len(turn_ends)
        if rewards:
            rewards[-1] = float(reward)
        return Episode(
            token_ids=pack(ids, I32),
            logprobs=pack(logps, F32),
            loss_mask=pack(mask, U8),
            versions=pack(vers, I32),
            turn_ends=pack(turn_ends, I32),
            turn_rewards=pack(rewards, F32),
            reward=float(reward) if rewards else 0.0,
            success=bool(success),
            finish=finish,
            turn_limit=max(1, turn_limit),
            failure=failure[:4000],
            segment_ends=pack(ends, I32) if len(ends) > 1 else b"",
            prefix_breaks=self.prefix_breaks,
        )

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _encode(self, text: str) -> list[int]:
        # The template wrote any BOS / special markers as text: add nothing more.
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []
