"""Episode hand-over: an actor asked to leave passes its live episodes on instead of losing them.

    episodes = await play_group(players, serving, ticket, pool, turn_limit, critic)  # None: handed over
    await leave(players)                              # on SIGTERM: stop at turn boundaries, collect
    Leave(actor_id=..., reason=..., handovers=players.handovers)

``players`` is the actor's ``Players`` (actors/play/players.py), ``serving`` its engine and tokenizer.
When the actor gets SIGTERM (Slurm's scancel and preemption send it), ``players.leaving`` is set:
every episode stops at its next turn boundary (a turn being sampled gets ``TURN_GRACE_S`` to
finish, then is aborted and dropped) and
the group becomes a ``Handover``: the episodes it finished, and for each stopped one its tokens
so far with their logprobs, versions and loss mask, the turn rewards, and the env's actions
(``PartialEpisode``). The actor sends them in its ``Leave``; the learner puts each on its ticket
when it goes back to the pool, and the actor that gets the ticket next replays the actions on a
fresh env of the same task (``Env.replayable``: deterministic given task and actions; it checks
that the replay reaches the same observation), restores the conversation and plays on. The
trained episode is the first actor's tokens followed by the second's, bitwise; every token keeps
the version that sampled it, so importance weights and staleness stay exact.
``Episode.resumed_at`` marks where the second actor took over.

Not handed over (played again from the start, as before): episodes of envs that are not
replayable, episodes with a critique loop, ones stopped before their first turn, evaluation
tickets, and groups played by external agents (actors/agents).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import structlog

from agentgym.actors.play.rollout import Interrupted, play_episode
from agentgym.protocol import Episode, Handover, PartialEpisode, Ticket

if TYPE_CHECKING:
    from agentgym.actors.play.critic import Critic
    from agentgym.actors.play.players import Players, Serving
    from agentgym.envpool.pool import EnvPool

log = structlog.get_logger(__name__)

LEAVE_GRACE_S = 30.0
"""Most seconds a leaving actor waits for its episodes to reach a turn boundary (an env step in
flight finishes first; a stuck one is cut at this and its group played again elsewhere)."""


async def play_group(
    players: Players, serving: Serving, ticket: Ticket, pool: EnvPool, turn_limit: int, critic: Critic | None
) -> list[Episode] | None:
    """The group's episodes, or None when ``players.leaving`` stopped it: then its ``Handover`` is
    in ``players.handovers`` (training tickets only: an evaluation group stops too, and is played
    again from the start)."""
    spec = serving.spec
    h = ticket.handover
    finished = list(h.finished) if h else []
    partial = list(h.partial) if h else []
    fresh = max(0, spec.group_size - len(finished) - len(partial))
    if h is not None:
        players.stats["handovers_taken"] = players.stats.get("handovers_taken", 0) + 1
        log.info(
            "handover_taken",
            group=ticket.group_id,
            from_actor=h.actor_id,
            finished=len(finished),
            partial=len(partial),
            fresh=fresh,
        )
    stop = players.leaving

    async def one(i: int, resume: PartialEpisode | None) -> Episode | Interrupted:
        try:
            return await play_episode(
                serving.engine,
                serving.tokenizer,
                pool,
                ticket,
                i,
                spec,
                turn_limit,
                critic=critic,
                stop=stop,
                resume=resume,
            )
        except Interrupted as exc:
            return exc

    results = await asyncio.gather(*(one(i, p) for i, p in enumerate([*partial, *[None] * fresh])))
    played = [r for r in results if isinstance(r, Episode)]
    done = finished + played
    s = players.stats
    if len(done) >= spec.group_size:
        s["sampled_tokens_sent"] = s.get("sampled_tokens_sent", 0) + sum(
            _own(e.loss_mask, e.resumed_at) for e in played
        )
        return done[: spec.group_size]
    stopped = [r for r in results if isinstance(r, Interrupted)]
    # An episode stopped before its first turn is played again from the start (nothing is lost).
    kept = [r.partial for r in stopped if r.partial.actions]
    # Sampled tokens: those of turns aborted mid-sampling are lost; those handed over are not.
    s["sampled_tokens_dropped"] = s.get("sampled_tokens_dropped", 0) + sum(r.dropped for r in stopped)
    if ticket.split != "train" or (not done and not kept):  # evaluation, or nothing played worth keeping:
        return None  # the ticket just goes back
    players.handovers.append(Handover(group_id=ticket.group_id, actor_id=players.actor_id, finished=done, partial=kept))
    s["handover_groups"] = s.get("handover_groups", 0) + 1
    s["handover_partial"] = s.get("handover_partial", 0) + len(kept)
    s["handover_finished"] = s.get("handover_finished", 0) + len(done)
    # This actor's own tokens only: not those of episodes it was handed (finished, or the prefix
    # of one it continued), so that sampled = sent + handed over + lost holds per actor.
    sampled = sum(_own(r.partial.loss_mask, r.resumed_at) for r in stopped if r.partial.actions)
    sampled += sum(_own(e.loss_mask, e.resumed_at) for e in played)
    s["sampled_tokens_handed_over"] = s.get("sampled_tokens_handed_over", 0) + sampled
    return None


def _own(loss_mask: bytes, resumed_at: int) -> int:
    """Sampled tokens (loss mask 1) from ``resumed_at`` on: those this actor sampled."""
    return len(loss_mask) - resumed_at - loss_mask[resumed_at:].count(0)


async def leave(players: Players) -> None:
    """Stop every running group at its episodes' next turn boundary and wait (at most
    ``LEAVE_GRACE_S``) until each has been handed over; players take no new ticket meanwhile."""
    t0 = time.monotonic()
    players.leaving.set()
    while players.running_groups and time.monotonic() - t0 < LEAVE_GRACE_S:
        await asyncio.sleep(0.02)
    log.info(
        "handover_ready",
        groups=len(players.handovers),
        still_running=players.running_groups,
        seconds=round(time.monotonic() - t0, 3),
        partial=sum(len(h.partial) for h in players.handovers),
    )
