"""Critique in the loop: a critic that reads the episode so far and gives the agent feedback.

    critic = await shared_critic(spec.critic, engine, tokenizer, seed)  # OracleCritic | LmCritic | None
    loop = CritiqueLoop(critic, spec.critic)                           # one per episode
    text = await loop.critic.critique(CritiqueView("draft", transcript, action, ep))

Where it speaks (``CriticSpec.when``; the hook is in ``actors/play/rollout.py``):

- ``every_turn``: the agent's proposed action is reviewed before it runs; when the critic objects,
  its critique is added as an observation and the agent proposes again (``max_revisions``
  rounds). The draft stays in the episode as a sampled agent turn with reward 0; only the last
  proposal is executed.
- ``after_failure``: after an invalid or unrewarded step that did not end the episode, the
  critique follows the env's observation in the same message.
- ``episode_end``: after a failed episode the task is reset and played again in the same
  conversation, the critique before the new first observation (``max_revisions`` retries).

A critique is an observation like any env message: rendered by the policy's chat template,
loss mask 0, version -1, so it is never trained on as the agent's own; the agent's turns after
it were sampled with it in context and are trained with it in context (on-policy; see
docs/adr/0016-critique-in-the-loop.md). ``Episode.critiques`` keeps the token spans of the
messages that carry one, for the episode log and the viewer.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import structlog

from agentgym.protocol import CriticSpec
from agentgym.protocol.chat_template import CHATML_TEMPLATE

log = structlog.get_logger(__name__)

Moment = Literal["draft", "after_step", "retry"]

CRITIC_SYSTEM = (
    "You are a critic. You read an agent's interaction with an environment and judge the agent's "
    "latest move. If the move is good, answer exactly OK. Otherwise say in one sentence what is "
    "wrong and what to do instead."
)


@dataclass
class CritiqueView:
    """What a critic sees: the moment, the conversation as (role, text), the move judged and
    the live env episode (only the oracle reads it, through ``expert_action``)."""

    moment: Moment
    transcript: list[tuple[str, str]]
    action: str
    episode: Any = None


class Critic(Protocol):
    """Anything that answers a view with a critique, or None for "no objection"."""

    async def critique(self, view: CritiqueView) -> str | None: ...


def _same_move(action: str, expert: str) -> bool:
    a, e = action.strip().lower(), expert.strip().lower()
    return a == e or (bool(e) and re.search(rf"(?<![\w]){re.escape(e)}(?![\w])", a) is not None)


class OracleCritic:
    """Scripted critic from the env's privileged state: names the expert's move. For testing, and
    for envs where such feedback is legitimate (it leaks the expert's policy into the context)."""

    async def critique(self, view: CritiqueView) -> str | None:
        expert = await view.episode.expert_action()
        if view.moment == "draft":
            if _same_move(view.action, expert):
                return None
            return f"Critique: {view.action.strip()[:80]!r} is not the best move here. A better move: {expert}"
        if view.moment == "after_step":
            return f"Critique: that move did not help. A better move now: {expert}"
        return f"Critique: that attempt failed. Try again from the start; a good first move: {expert}"


class LmCritic:
    """A language model prompted with the episode so far (its own chat template), answering with
    feedback; "OK" (or nothing) means no objection."""

    def __init__(
        self, engine: Any, tokenizer: Any, max_tokens: int, temperature: float, seed: int | None = None
    ) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.max_tokens, self.temperature, self.seed = max_tokens, temperature, seed
        self._n = 0

    def prompt_ids(self, view: CritiqueView) -> list[int]:
        lines = [f"{'Agent' if role == 'agent' else 'Environment'}: {text}" for role, text in view.transcript]
        ask = {
            "draft": "The agent proposes this move",
            "after_step": "The agent's last move did not help",
            "retry": "The agent's attempt failed; its last move",
        }[view.moment]
        user = "\n".join(lines[-12:]) + f"\n\n{ask}: {view.action.strip()}\nYour judgement:"
        template = None if getattr(self.tokenizer, "chat_template", None) else CHATML_TEMPLATE
        text = self.tokenizer.apply_chat_template(
            [{"role": "system", "content": CRITIC_SYSTEM}, {"role": "user", "content": user}],
            tokenize=False,
            add_generation_prompt=True,
            chat_template=template,
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    async def critique(self, view: CritiqueView) -> str | None:
        from agentgym.actors.engines.engine import SamplingSpec

        self._n += 1
        eos = getattr(self.tokenizer, "eos_token_id", None)
        spec = SamplingSpec(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=1.0,
            stop_token_ids=(eos,) if eos is not None else (),
            seed=None if self.seed is None else self.seed + self._n,
        )
        gen = await self.engine.generate(f"critic/{id(self)}/{self._n}", self.prompt_ids(view), spec)
        text = str(self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)).strip()
        if not text or (view.moment == "draft" and text.upper().startswith("OK")):
            return None
        return f"Critique: {text}"


# Per policy engine (weakly: a closed engine's critics go with it) and spec.
_critics: weakref.WeakKeyDictionary[Any, dict[bytes, Critic]] = weakref.WeakKeyDictionary()
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


async def shared_critic(spec: CriticSpec | None, engine: Any, tokenizer: Any, seed: int = 0) -> Critic | None:
    """The actor's critic for ``spec`` (built once per policy engine and spec; None when off).
    An LM critic on its own engine loads and starts it here."""
    if spec is None:
        return None
    import msgspec

    key = msgspec.json.encode(spec)
    async with _locks.setdefault(asyncio.get_running_loop(), asyncio.Lock()):  # players ask at once
        mine = _critics.setdefault(engine, {})
        if key not in mine:
            mine[key] = await _make(spec, engine, tokenizer, seed)
            log.info("critic_ready", kind=spec.kind, when=spec.when, engine=spec.engine, model=spec.model)
        return mine[key]


async def _make(spec: CriticSpec, engine: Any, tokenizer: Any, seed: int) -> Critic:
    if spec.kind == "oracle":
        return OracleCritic()
    if spec.engine == "policy":  # self-critique: the policy's engine, outside the episode's tokens
        return LmCritic(engine, tokenizer, spec.max_tokens, spec.temperature, seed)
    from agentgym.actors.engines.builders import EngineRequest, build_engine

    if spec.engine == "remote":
        if not spec.url:
            raise ValueError("critic.url: an LM critic with engine 'remote' needs the server's base URL")
        req = EngineRequest(None, seed=seed, url=spec.url, model=spec.model)
    else:
        if not spec.model or not Path(spec.model).is_dir():
            raise FileNotFoundError(f"critic.model: the LM critic's model dir {spec.model!r} does not exist")
        req = EngineRequest(Path(spec.model), seed=seed)
    critic_engine: Any = build_engine(spec.engine, req)  # the actor's one engine factory (actors/engines/builders.py)
    await critic_engine.start()
    from transformers import AutoTokenizer

    tok = await asyncio.to_thread(AutoTokenizer.from_pretrained, spec.model) if spec.model else tokenizer
    return LmCritic(critic_engine, tok, spec.max_tokens, spec.temperature, seed)


@dataclass
class CritiqueLoop:
    """One episode's critique state: the critic, when it speaks, and the spans it left."""

    critic: Critic
    spec: CriticSpec
    spans: list[tuple[int, int]] = field(default_factory=list)
    transcript: list[tuple[str, str]] = field(default_factory=list)
    count: int = 0
    last_action: str = ""

    def wants(self, moment: Moment) -> bool:
        return {"draft": "every_turn", "after_step": "after_failure", "retry": "episode_end"}[moment] == self.spec.when

    async def ask(self, moment: Moment, action: str, episode: Any) -> str | None:
        text = await self.critic.critique(CritiqueView(moment, list(self.transcript), action, episode))
        if text is not None:
            self.count += 1
            log.debug("critique", moment=moment, chars=len(text))
        return text

    def mark(self, start: int, end: int) -> None:
        """The message at token ``[start, end)`` carries a critique."""
        if end > start:
            self.spans.append((start, end))
