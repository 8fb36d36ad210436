"""Playing episodes: prompt -> generate -> act -> observe, until done or a limit, as tokens.

    episode = await play_episode(engine, tokenizer, pool, ticket, index, spec, turn_limit)

The conversation is one growing list of token ids: the engine's samples are appended exactly as
sampled (never re-tokenized) and each observation is rendered by the model's chat template.
An environment that crashes or hangs fails this episode only (finish="env_failure").
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import structlog

from agentgym.actors.engines.engine import InferenceEngine, SamplingSpec
from agentgym.actors.play.conversation import Conversation
from agentgym.actors.play.critic import Critic, CritiqueLoop
from agentgym.envpool.base import StepResult
from agentgym.envpool.pool import EnvFailure, EnvPool
from agentgym.envpool.pool import Episode as PoolEpisode
from agentgym.protocol import Episode, PartialEpisode, RolloutSpec, Ticket
from agentgym.protocol.arrays import F32, I32, U8, pack, unpack
from agentgym.protocol.messages import EpisodeFinish
from agentgym.protocol.vocab import banned_action_ids

log = structlog.get_logger(__name__)

MAX_CHARS_PER_TOKEN = 32
"""An observation longer than this many characters per token of budget cannot fit and ends the
episode (token_limit) without being tokenized: a huge env output costs no tokenizer time."""


async def play_episode(
    engine: InferenceEngine,
    tokenizer: Any,  # a transformers tokenizer (encode, decode, apply_chat_template)
    pool: EnvPool,
    ticket: Ticket,
    index: int,
    spec: RolloutSpec,
    turn_limit: int,
    seed: int | None = None,
    critic: Critic | None = None,
    stop: asyncio.Event | None = None,
    resume: PartialEpisode | None = None,
) -> Episode:
    """Play one episode. ``stop``: once set, the episode ends at the next turn boundary (the turn
    being sampled is aborted) by raising ``Interrupted`` with where it stands, when it can be
    handed over (a replayable env, no critique loop), else it plays on. ``resume``: continue an
    episode another actor stopped (actors/play/handover.py): its actions are replayed on a fresh env
    and, if that reaches the same observation, play goes on from its next turn; else the episode
    is played from the start."""
    sampling = _sampling(tokenizer, spec, seed)
    # The episode's token budget is also bounded by the engine's context: a prompt never reaches
    # the engine's limit, so no observation can make generate() raise.
    budget = min(spec.max_episode_tokens, getattr(engine, "max_model_len", None) or spec.max_episode_tokens)
    conv: Conversation | None = None
    turn_rewards: list[float] = []
    finish: EpisodeFinish = "turn_limit"
    failure, success = "", False
    actions: list[str] = []
    last_obs = ""
    resumed_at = first_turn = 0
    # Critique in the loop (actors/play/critic.py): off unless the spec has a critic; evaluation
    # tickets are played without it unless critic.at_eval.
    cs = spec.critic
    loop = CritiqueLoop(critic, cs) if critic and cs and (ticket.split == "train" or cs.at_eval) else None
    attempts = 1 + (cs.max_revisions if cs and loop and loop.wants("retry") else 0)
    handable = loop is None and attempts == 1 and pool.replayable
    if resume is not None and not handable:
        resume = None
    pending = None
    player = _Player(
        engine, tokenizer, f"{ticket.group_id}/{index}", spec, sampling, seed, budget, loop, stop if handable else None
    )
    try:
        task_id = ticket.task_id if ticket.split == "train" else _eval_task(pool, ticket)
        # One more pass when resuming: a replay that diverges plays the episode again on a fresh env.
        for _attempt in range(attempts + (resume is not None)):
            async with pool.episode(task_id) as ep:
                obs = last_obs = await ep.reset()
                # The config's system prompt wins; "" means none; None means the env's instructions.
                system = spec.system_prompt if spec.system_prompt is not None else (ep.instructions or None)
                if resume is not None:
                    conv, last_obs = await _replay(tokenizer, ep, system, resume, ticket, obs)
                    if conv is None:  # the replay went elsewhere: the next pass plays it from the start
                        resume = None
                        continue
                    turn_rewards, actions = [float(x) for x in unpack(resume.turn_rewards, F32)], list(resume.actions)
                    resumed_at, first_turn, turn_limit, resume = len(conv), len(actions), resume.turn_limit, None
                if resumed_at:
                    pass  # the conversation another actor began, ending with its next turn's prompt
                elif conv is None:
                    conv = Conversation.start(tokenizer, system or None, obs[: MAX_CHARS_PER_TOKEN * budget])
                    if len(conv) > budget - conv.closing_tokens - 1:  # no room for even one sampled token
                        conv.truncate(budget)  # the loop below ends it at once as token_limit
                else:  # a retry after a failed attempt: the critique, then the task again, in one message
                    fits = await _retry_prompt(conv, loop, ep, pending, obs, budget)
                    pending = None
                    if not fits:
                        finish = "token_limit"
                        break
                if loop:
                    loop.transcript.append(("env", obs))
                assert conv is not None  # set above: restored, started, or from the attempt before
                finish, success, pending = await _play_turns(
                    player,
                    ep,
                    conv,
                    first_turn,
                    turn_limit,
                    turn_rewards,
                    actions,
                    last_obs,
                    resumed_at,
                    retry_follows=_attempt + 1 < attempts,
                )
            if success or finish == "token_limit" or resumed_at:
                break
    except EnvFailure as exc:
        finish, failure = "env_failure", str(exc)
        log.warning("episode_env_failure", group=ticket.group_id, task=ticket.task_id, error=failure)
    episode = _to_episode(conv, turn_rewards, finish, failure, success, turn_limit)
    episode.resumed_at = resumed_at
    if loop and loop.spans:
        episode.critiques = pack([x for span in loop.spans for x in span], I32)
    return episode


@dataclass(frozen=True)
class _Player:
    """What every turn of one episode uses."""

    engine: InferenceEngine
    tokenizer: Any  # a transformers tokenizer (encode, decode, apply_chat_template)
    rid: str
    """The episode's request ids' prefix, GROUP/INDEX: turn t samples GROUP/INDEX/t."""
    spec: RolloutSpec
    sampling: SamplingSpec
    seed: int | None
    budget: int
    loop: CritiqueLoop | None
    stop: asyncio.Event | None
    """Set: end the episode at the next turn boundary (only when it can be handed over)."""


async def _play_turns(
    p: _Player,
    ep: PoolEpisode,
    conv: Conversation,
    first_turn: int,
    turn_limit: int,
    turn_rewards: list[float],
    actions: list[str],
    last_obs: str,
    resumed_at: int,
    *,
    retry_follows: bool,
) -> tuple[EpisodeFinish, bool, str | None]:
    """Turns ``first_turn`` .. ``turn_limit`` - 1 of one attempt, each appended to ``conv``,
    ``turn_rewards`` and ``actions``. Returns (finish, success, the last observation held for a
    retry's opening message when ``retry_follows``); raises ``Interrupted`` when ``p.stop`` is set."""
    engine, tokenizer, spec, budget, loop = p.engine, p.tokenizer, p.spec, p.budget, p.loop
    pending = None
    # Token budgets: a turn samples at most max_tokens_per_turn, and no more than leaves
    # room for its end-of-turn tokens within max_episode_tokens; an observation that
    # does not fit ends the episode. The episode never exceeds its budget.
    for turn in range(first_turn, turn_limit):
        room = budget - len(conv) - conv.closing_tokens
        if room < 1:
            return "token_limit", False, pending
        if p.stop is not None and p.stop.is_set():
            raise Interrupted(_partial(conv, turn_rewards, actions, last_obs, turn_limit), resumed_at=resumed_at)
        # Each turn its own seed: the same seed every turn would correlate the turns.
        turn_sampling = replace(
            p.sampling, max_tokens=min(spec.max_tokens_per_turn, room), seed=None if p.seed is None else p.seed + turn
        )
        gen = await _generate(engine, f"{p.rid}/{turn}", conv.prompt_ids, turn_sampling, p.stop)
        if isinstance(gen, int):  # asked to leave while sampling: that turn is dropped, the rest handed over
            raise Interrupted(
                _partial(conv, turn_rewards, actions, last_obs, turn_limit), dropped=gen, resumed_at=resumed_at
            )
        conv.add_agent_turn(gen.token_ids, gen.logprobs, gen.versions)
        action = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        if loop and loop.wants("draft"):
            action = await _revise_draft(
                engine, tokenizer, conv, loop, ep, action, p.sampling, spec, budget, f"{p.rid}/{turn}", turn_rewards
            )
        result = await ep.step(action)
        turn_rewards.append(float(result.reward))
        actions.append(action)
        last_obs = result.observation
        if loop:
            loop.last_action = action
            loop.transcript += [("agent", action), ("env", result.observation)]
        if result.done:
            return "done", bool(result.info.get("success", result.reward > 0)), pending
        if len(result.observation) > MAX_CHARS_PER_TOKEN * budget:  # cannot fit: not even tokenized
            return "token_limit", False, pending
        # The last turn's observation opens the next attempt's message when a retry follows.
        fits, held = await _add_observation(
            conv, loop, ep, action, result, budget, last=turn + 1 >= turn_limit, retry_follows=retry_follows
        )
        if held is not None:
            pending = held
        if not fits:
            return "token_limit", False, pending
    return "turn_limit", False, pending


def _sampling(tokenizer: Any, spec: RolloutSpec, seed: int | None) -> SamplingSpec:
    """The episode's sampling: the spec's, stopping at the tokenizer's end of sequence."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return SamplingSpec(
        max_tokens=spec.max_tokens_per_turn,
        temperature=spec.temperature,
        top_p=spec.top_p,
        stop_token_ids=(eos,) if eos is not None else (),
        seed=seed,
        banned_token_ids=() if spec.allow_special_tokens else banned_action_ids(tokenizer),
    )


async def _retry_prompt(
    conv: Conversation, loop: CritiqueLoop | None, ep: PoolEpisode, pending: str | None, obs: str, budget: int
) -> bool:
    """A retry's opening message: the last attempt's final observation, the critique and the task
    again, in one message; False when it does not fit the budget."""
    critique = await loop.ask("retry", loop.last_action, ep) if loop else None
    mark = len(conv)
    text = "\n\n".join(t for t in (pending, critique, obs[: MAX_CHARS_PER_TOKEN * budget]) if t)
    if not conv.add_observation(text, budget - 1 - conv.closing_tokens):
        return False
    if critique and loop:
        loop.mark(mark, len(conv))
    return True


async def _revise_draft(
    engine: InferenceEngine,
    tokenizer: Any,  # a transformers tokenizer (encode, decode, apply_chat_template)
    conv: Conversation,
    loop: CritiqueLoop,
    ep: PoolEpisode,
    action: str,
    sampling: SamplingSpec,
    spec: RolloutSpec,
    budget: int,
    rid: str,
    turn_rewards: list[float],
) -> str:
    """The action to run after the critic's review of the draft ``action``; returns it."""
    assert spec.critic is not None  # a draft is revised only with a critic
    for rnd in range(spec.critic.max_revisions):
        # The critic reviews the proposal before it runs; on an objection the agent
        # sees the critique (a masked observation) and proposes again. The draft
        # stays a sampled turn with reward 0; only the last proposal is executed.
        critique = await loop.ask("draft", action, ep)
        mark = len(conv)
        if critique is None or not conv.add_observation(critique, budget - 1 - conv.closing_tokens):
            break
        loop.mark(mark, len(conv))
        turn_rewards.append(0.0)
        gen = await engine.generate(
            f"{rid}/r{rnd}",
            conv.prompt_ids,
            replace(
                sampling, max_tokens=max(1, min(spec.max_tokens_per_turn, budget - len(conv) - conv.closing_tokens))
            ),
        )
        conv.add_agent_turn(gen.token_ids, gen.logprobs, gen.versions)
        action = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    return action


async def _add_observation(
    conv: Conversation,
    loop: CritiqueLoop | None,
    ep: PoolEpisode,
    action: str,
    result: StepResult,
    budget: int,
    *,
    last: bool,
    retry_follows: bool,
) -> tuple[bool, str | None]:
    """After a step: the env's observation (with the critic's word on a failed step) added for the
    next turn. Returns (whether it fit, the observation held for a retry's opening message)."""
    critique = None
    if loop and loop.wants("after_step") and result.reward <= 0:
        critique = await loop.ask("after_step", action, ep)
        if critique:
            result = replace(result, observation=f"{result.observation}\n\n{critique}")
    mark = len(conv)
    fits, held = True, None
    if not last:
        # Room for the observation and at least one sampled token plus its closing.
        if not conv.add_observation(result.observation, budget - 1 - conv.closing_tokens):
            return False, None
    elif retry_follows:  # a retry follows: this observation opens its message
        held = result.observation
    elif not conv.add_observation(result.observation, budget):
        # At the turn limit the episode ends in the state the agent would act in next
        # (the last observation and the generation prompt, masked): PPO reads its
        # bootstrap value V(s_end) there. No room for it: the token budget ended it.
        fits = False
    if critique and loop and len(conv) > mark:
        loop.mark(mark, len(conv))
    return fits, held


TURN_GRACE_S = 5.0
"""An actor asked to leave lets a turn being sampled finish for this long before aborting it
(docs/operations.md, "Preemption": the tokens of an aborted turn are lost)."""


class Interrupted(Exception):
    """An episode stopped at a turn boundary because its actor is leaving."""

    def __init__(self, partial: PartialEpisode, dropped: int = 0, resumed_at: int = 0) -> None:
        super().__init__("interrupted at a turn boundary")
        self.partial = partial
        self.dropped = dropped
        """Tokens of the turn being sampled when it stopped (aborted: lost)."""
        self.resumed_at = resumed_at
        """Where this actor took the episode over (0: it played it from the start)."""


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


async def _generate(
    engine: InferenceEngine, rid: str, prompt: list[int], sampling: SamplingSpec, stop: asyncio.Event | None
):
    """``engine.generate``; when ``stop`` is set first, the turn gets ``TURN_GRACE_S`` more to
    finish, then it is aborted and the number of tokens it had sampled (dropped) is returned."""
    if stop is None:
        return await engine.generate(rid, prompt, sampling)
    gen = asyncio.ensure_future(engine.generate(rid, prompt, sampling))
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({gen, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if gen.done():
        return gen.result()
    try:  # a turn close to its end is worth finishing: it is handed over whole
        return await asyncio.wait_for(asyncio.shield(gen), TURN_GRACE_S)
    except TimeoutError:
        pass
    await engine.abort(rid)
    return len((await gen).token_ids)  # it returns with finish "abort" and the tokens so far


def _partial(
    conv: Conversation, turn_rewards: list[float], actions: list[str], last_obs: str, turn_limit: int
) -> PartialEpisode:
    return PartialEpisode(
        token_ids=pack(conv.token_ids, I32),
        logprobs=pack(conv.logprobs, F32),
        loss_mask=pack(conv.loss_mask, U8),
        versions=pack(conv.versions, I32),
        turn_ends=pack([end for _, end in conv.turn_spans], I32),
        turn_rewards=pack(turn_rewards, F32),
        actions=list(actions),
        observation_sha256=sha256(last_obs),
        turn_limit=turn_limit,
    )


async def _replay(tokenizer: Any, ep: PoolEpisode, system: str | None, p: PartialEpisode, ticket: Ticket, obs: str):
    """Step a fresh env (just reset, its first observation ``obs``) through ``p.actions``; returns
    the restored conversation and the last observation, or (None, "") when the env ended early
    or reached another observation."""
    done = False
    for action in p.actions:
        result = await ep.step(action)
        obs, done = result.observation, result.done
        if done:
            break
    if done or sha256(obs) != p.observation_sha256:
        log.warning("handover_replay_diverged", group=ticket.group_id, task=ticket.task_id, actions=len(p.actions))
        return None, ""
    conv = Conversation.restore(
        tokenizer,
        system,
        unpack(p.token_ids, I32),
        unpack(p.loss_mask, U8),
        unpack(p.logprobs, F32),
        unpack(p.versions, I32),
        unpack(p.turn_ends, I32),
    )
    return conv, obs


def _eval_task(pool: EnvPool, ticket: Ticket) -> int:
    """An evaluation ticket names a split and an index; the env's ``tasks(split)`` has the id."""
    try:
        return pool.task_id(ticket.split, ticket.task_id)
    except Exception as exc:  # noqa: BLE001 - an env's task list failing fails this episode only
        raise EnvFailure("tasks_error", ticket.env, ticket.task_id, f"{ticket.split} split: {exc!r}") from exc


def _to_episode(
    conv: Conversation | None,
    turn_rewards: list[float],
    finish: EpisodeFinish,
    failure: str,
    success: bool,
    turn_limit: int,
) -> Episode:
    if conv is None:  # failed before the first observation
        ids = logps = vers = np.zeros(0)
        turn_ends: list[int] = []
        mask = np.zeros(0, dtype=np.uint8)
    else:
        ids, logps, mask, vers = conv.token_ids, conv.logprobs, conv.loss_mask, conv.versions
        turn_ends = [end for _, end in conv.turn_spans]
    n_turns = len(turn_ends)
    rewards = turn_rewards[:n_turns] + [0.0] * (n_turns - len(turn_rewards))
    return Episode(
        token_ids=pack(ids, I32),
        logprobs=pack(logps, F32),
        loss_mask=pack(mask, U8),
        versions=pack(vers, I32),
        turn_ends=pack(turn_ends, I32),
        turn_rewards=pack(rewards, F32),
        reward=float(sum(turn_rewards)),
        success=success,
        finish=finish,
        turn_limit=turn_limit,
        failure=failure[:4000],
    )
