"""Who plays what: actor registry, tickets (credits), each actor's current capacity.

Plain bookkeeping, no I/O, so the rules are testable in isolation. The learner's control loop
calls it on every message and the reaper calls ``expire`` once a second.

A ticket is one group to play. Nothing is played without one, so the learner's memory and the
staleness of what it receives are bounded by what it hands out; whether a new training ticket
may be issued now is the staleness rule's call (``learner/control/staleness.py``, the one owner of it).
Each actor is granted up to its current capacity, which it sizes itself and reports in its
heartbeats (``actors/play/concurrency.py``).

Tickets of an actor that leaves or goes silent are re-issued to the others, so no group is lost.

Deadlines and earned grants (docs/operations.md, "Stragglers"): a live heartbeat says nothing of
the tickets an actor holds, so every ticket also has a deadline from measured turnaround (a few
times the p95 of its actor's grant-to-answer times, the fleet's for an actor with no history:
learner/control/deadlines.py owns the rule). ``overdue`` issues a ticket past its deadline again to
another actor, and with it every other ticket its holder has, at once; the first answer is
trained and the other is acknowledged ``duplicate`` (``late_answers`` counts them). The late
holder keeps the slots until it answers, and its earned grant shrinks to what it has answered
(at most half of it), so a hoarder ends up holding one ticket and a hung engine behind a live
heartbeat loses its tickets one deadline after it hangs. An actor holds at most
``min(capacity, earned, share)`` tickets: ``earned`` starts at ``grant_start`` and grows by one per
group it answers first; ``share`` is twice its fraction of the last ``SHARE_WINDOW`` first answers,
of the tickets the staleness rule admits (never below ``grant_start``).
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentgym.config import EnvSpec
from agentgym.learner.control.deadlines import DeadlineRule
from agentgym.learner.control.dedupe import split_ticket_id
from agentgym.learner.control.staleness import StalenessRule
from agentgym.protocol import Ticket


def ticket_task(seed: int, n: int, envs: Sequence[EnvSpec]) -> tuple[EnvSpec, int]:
    """The environment and task id of training ticket ``n`` of a run of ``seed``: a function of
    the two alone, so a resumed run draws the same, and a finished run's draws can be replayed
    (bench/task_overlap.py)."""
    rng = random.Random(f"{seed}:{n}")
    env = (
        envs[0]
        if len(envs) == 1
        else rng.choices(envs, cum_weights=list(itertools.accumulate(e.weight for e in envs)))[0]
    )
    return env, env.task_start + rng.randrange(env.task_count)


@dataclass
class ActorState:
    actor_id: str
    peer: bytes
    index: int
    hostname: str
    max_groups: int
    """Current capacity: groups this actor plays at once (its Hello, then its heartbeats)."""
    last_seen: float
    outstanding: dict[str, Ticket] = field(default_factory=dict)
    weight_version: int = -1
    groups_done: int = 0
    pid: int = 0
    session: str = ""
    """The Hello's per-process nonce: without keys, a Hello under a live id with another one is refused."""
    deadlines: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Outstanding group id -> (granted at, deadline), monotonic seconds; inf once past it."""
    late: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Tickets answered first by another actor that this one still plays (group id -> when it was
    granted, its deadline): each holds a slot until its (duplicate) answer comes, so an actor
    that never answers is never given more."""
    earned: int = 0
    """Tickets this actor may hold on its record (see the module docstring)."""
    turnaround_s: float | None = None
    """Seconds from grant to answer of its last answer (None until its first); its deadlines
    come from its recent ones (learner/control/deadlines.py)."""
    missed: int = 0
    """Tickets of this actor that passed their deadline."""
    last_grant: float = 0.0
    """When it was last granted a ticket (ties in ``fill`` go to the one served least recently)."""

    @property
    def held(self) -> int:
        return len(self.outstanding) + len(self.late)


class Scheduler:
    def __init__(
        self,
        *,
        envs: Sequence[EnvSpec],
        batch_groups: int,
        max_staleness: int | None = None,
        mode: str | None = None,
        run_id: str,
        seed: int,
        issued: int = 0,
        rule: StalenessRule | None = None,
        deadline_factor: float = 3.0,
        deadline_min_s: float = 2.0,
        deadline_max_s: float = 900.0,
        grant_start: int = 2,
    ) -> None:
        if not envs:
            raise ValueError("Scheduler: no environment to play")
        self.envs = list(envs)
        self.batch_groups = batch_groups
        self.run_id = run_id
        self.seed = seed
        self.actors: dict[str, ActorState] = {}
        self.requeue: deque[Ticket] = deque()
        self.eval_queue: deque[Ticket] = deque()
        """Evaluation tickets: handed out before new training work, outside the staleness rule."""
        self.issued = issued
        """Tickets created so far (ticket numbers are 0..issued-1); restored on resume."""
        self.forfeited = 0
        """Issued tickets whose group will never be trained (rejected stale, invalid or failed;
        expired in the buffer; lost in a learner restart). The admission rule counts only the
        others: otherwise every lost group would shrink the pipeline for good, and after
        batch_groups x max_staleness of them no batch could ever fill again."""
        # One owner of the rule: the learner passes its own (``rule``); ``max_staleness`` and
        # ``mode`` only build one where none is given (a scheduler on its own, as in the tests).
        if (rule is None) == (max_staleness is None or mode is None):
            raise ValueError("Scheduler: give either rule or both max_staleness and mode")
        self.rule = rule or StalenessRule(mode=mode, max_staleness=max_staleness, batch_groups=batch_groups)  # type: ignore[arg-type]  # both given when rule is not (checked above)
        self._next_index = 0
        self.deadlines = DeadlineRule(deadline_factor, deadline_min_s, deadline_max_s)
        self.grant_start = grant_start
        self._copies: dict[str, set[str]] = {}
        """Tickets issued again past a deadline and not yet answered -> the actors holding them."""
        self._firsts: deque[str] = deque(maxlen=self.SHARE_WINDOW)
        """Actor ids of the last first answers (demonstrated throughput)."""
        self._first_counts: Counter[str] = Counter()
        self.deadline_reissued = 0
        """Tickets issued again because their holder missed the deadline (events)."""
        self.late_answers = 0
        """Answers to a ticket another actor had answered first after a deadline (acked duplicate)."""
        self.reissued: set[str] = set()
        """Training tickets of an earlier learner life issued again (``reissue``), not yet forfeited."""
        self.owners: dict[str, str] = {}
        """Actor id -> the CURVE user id (z85 public key) that registered it: one key, one identity."""

    SHARE_WINDOW = 256
    """First answers over which each actor's share of the pipeline is measured."""

    # ------------------------------------------------------------------ actors
    def register(
        self, actor_id: str, peer: bytes, hostname: str, max_groups: int, session: str = ""
    ) -> tuple[ActorState, bool]:
        """Add an actor, or refresh one that reconnects. Returns (state, is_new)."""
        now = time.monotonic()
        known = self.actors.get(actor_id)
        if known is not None:
            known.peer, known.last_seen, known.max_groups, known.session = peer, now, max_groups, session
            return known, False
        state = ActorState(
            actor_id, peer, self._next_index, hostname, max_groups, now, session=session, earned=self.grant_start
        )
        self._next_index += 1
        self.actors[actor_id] = state
        return state, True

    def identity_conflict(self, actor_id: str, user_id: str, session: str) -> str | None:
        """Why a Hello for ``actor_id`` must be refused (None: it may register). With keys
        (``user_id``: the ZAP user id of the connection) the id belongs to the first key that
        registered it, for the whole run; without keys a live actor's id is refused to a Hello of
        another process (another ``session``) until that actor leaves or times out."""
        if user_id:
            owner = self.owners.setdefault(actor_id, user_id)
            return None if owner == user_id else "actor_id_of_another_key"
        known = self.actors.get(actor_id)
        if known is not None and known.session and session != known.session:
            return "actor_id_in_use"
        return None

    def owned_by(self, actor_id: str, user_id: str) -> bool:
        """Whether a message naming ``actor_id`` may come from the key ``user_id`` ('' without keys)."""
        return not user_id or self.owners.get(actor_id, user_id) == user_id

    def seen(self, actor_id: str) -> ActorState | None:
        state = self.actors.get(actor_id)
        if state is not None:
            state.last_seen = time.monotonic()
        return state

    def remove(self, actor_id: str) -> list[Ticket]:
        """Forget an actor; its unfinished tickets go back to the front of the queue."""
        state = self.actors.pop(actor_id, None)
        if state is None:
            return []
        self.deadlines.forget(actor_id)
        back = []
        for t in state.outstanding.values():
            holders = self._copies.get(t.group_id)
            if holders is not None:  # issued again past its deadline: that copy is in play or queued
                holders.discard(actor_id)
                if holders or any(q.group_id == t.group_id for q in self.requeue):
                    continue
            back.append(t)
        self.requeue.extendleft(reversed(back))
        return back

    def touch_all(self) -> None:
        """Count every actor as heard from now (after the learner itself was held up)."""
        now = time.monotonic()
        for a in self.actors.values():
            a.last_seen = now

    def expire(self, timeout_s: float) -> list[ActorState]:
        """Remove actors silent for longer than ``timeout_s``."""
        now = time.monotonic()
        dead = [a for a in self.actors.values() if now - a.last_seen > timeout_s]
        for a in dead:
            self.remove(a.actor_id)
        return dead

    # ------------------------------------------------------------------ deadlines
    def deadline_s(self, state: ActorState) -> float:
        """Seconds a ticket granted to ``state`` now may take before it is issued again."""
        return self.deadlines.deadline_s(state.actor_id)

    def overdue(self, now: float | None = None) -> list[tuple[ActorState, Ticket]]:
        """Tickets past their deadline, and every other ticket their holders have: each is queued
        to be issued again (first in line; an actor that missed one is not waited on for the rest)
        and the holder's earned grant shrinks to its recent first answers, at most half of what it
        was (never below one). The holder keeps them: its answer, if first, still counts."""
        now = time.monotonic() if now is None else now
        missed: list[tuple[ActorState, Ticket]] = []
        for a in self.actors.values():
            if not any(now > dl for _, dl in a.deadlines.values()):
                continue
            late = [g for g, (_, dl) in a.deadlines.items() if dl != math.inf]  # past it, or of the same holder
            for gid in late:
                a.deadlines[gid] = (a.deadlines[gid][0], math.inf)  # issued again once, not each tick
                t = a.outstanding[gid]
                self._copies.setdefault(gid, set()).add(a.actor_id)
                self.deadline_reissued += 1
                missed.append((a, t))
            self.requeue.extendleft(reversed([a.outstanding[g] for g in late]))
            a.missed += len(late)
            a.earned = max(1, min(a.earned // 2, self._first_counts[a.actor_id]))
        return missed

    def postpone(self, seconds: float) -> None:
        """Move every deadline ``seconds`` later (the learner itself was held up that long)."""
        for a in self.actors.values():
            a.deadlines = {g: (t0, dl + seconds) for g, (t0, dl) in a.deadlines.items()}

    def limit(self, state: ActorState, version: int) -> int:
        """Tickets ``state`` may hold now: min(capacity, earned, share of the pipeline)."""
        share = self.grant_start
        if self._firsts and len(self.actors) > 1:
            pipeline = max(self.batch_groups, self.live(version) + self.headroom(version))
            share = max(share, math.ceil(2 * pipeline * self._first_counts[state.actor_id] / len(self._firsts)))
        else:
            share = max(share, state.max_groups)
        return min(state.max_groups, state.earned, share)

    # ------------------------------------------------------------------ tickets
    def _new_ticket(self, min_version: int) -> Ticket:
        n = self.issued
        self.issued += 1
        env, task = ticket_task(self.seed, n, self.envs)
        return Ticket(group_id=f"{self.run_id}:{n}", env=env.name, task_id=task, min_version=min_version)

    def eval_round(self, version: int, split: Literal["train", "dev", "test"], tasks: int) -> list[Ticket]:
        """Queue one evaluation: the first ``tasks`` tasks of ``split`` of every env, played with
        weights of at least ``version``. Ticket task ids are indexes into the split."""
        made = [
            Ticket(
                group_id=f"{self.run_id}:eval{version}:{e.name}:{i}",
                env=e.name,
                task_id=i,
                min_version=version,
                split=split,
            )
            for e in self.envs
            for i in range(tasks)
        ]
        self.eval_queue.extend(made)
        return made

    def live(self, version: int) -> int:
        """Training tickets issued and neither trained (``batch_groups`` per version) nor forfeited."""
        return self.issued - self.forfeited - self.batch_groups * version

    def headroom(self, version: int) -> int:
        """Training tickets the staleness rule would still issue now (sent to actors as a hint)."""
        return self.rule.headroom(self.live(version))

    def forfeit(self, group_id: str) -> None:
        """The group of one of this run's training tickets, or of one ``reissue``d, will not be
        trained: free its place under the admission rule (other ids — evaluation, an earlier
        run's — are ignored)."""
        key = split_ticket_id(group_id)
        if (key is not None and key[0] == self.run_id) or group_id in self.reissued:
            self.reissued.discard(group_id)
            self.forfeited += 1
            self.rule.on_forfeit()

    def reissue(self, tickets: Sequence[Ticket], version: int) -> None:
        """After a learner restart at ``version``: ``tickets`` of the earlier life (buffered, in
        flight or trained after its checkpoint; ADR 0010) go out again, first. Its training ones
        are the whole pipeline now, so the admission rule counts them as live; every other
        ticket it issued is forfeited. Counted as free instead, they would let the rule issue a
        full pipeline beside them, and every step after would train that many more versions stale.
        (``forfeited`` goes below 0 when the earlier life issued tickets after its checkpoint:
        what the rule reads is ``live``, here exactly those training tickets.)"""
        training = [t.group_id for t in tickets if split_ticket_id(t.group_id) is not None]
        self.reissued = set(training)
        self.forfeited = self.issued - self.batch_groups * version - len(training)
        self.rule.on_reissue(len(training))
        self.requeue.extend(tickets)

    def on_version(self, version: int) -> None:
        """The learner published ``version`` (sync mode: the next round of tickets is for it)."""
        self.rule.on_version(version)

    def set_capacity(self, actor_id: str, groups: int) -> None:
        """An actor's heartbeat says how many groups it plays at once now (>= 1)."""
        state = self.actors.get(actor_id)
        if state is not None and groups >= 1:
            state.max_groups = groups

    def fill(self, version: int) -> dict[str, list[Ticket]]:
        """Hand out tickets to actors with free capacity; returns new tickets per actor."""
        grants: dict[str, list[Ticket]] = {}
        now = time.monotonic()
        # One ticket per actor per round, the least served first: a pipeline smaller than the
        # fleet's capacity is spread over the actors, not given to whichever is first in line.
        limits = {a.actor_id: self.limit(a, version) for a in self.actors.values()}
        pending = sorted(self.actors.values(), key=lambda a: (a.held, a.last_grant))
        while pending:
            again = []
            for state in pending:
                if state.held >= limits[state.actor_id]:
                    continue
                ticket = self._next_for(version, state)
                if ticket is None:
                    continue  # nothing for it (the rule admits none, or only its own overdue tickets wait)
                state.outstanding[ticket.group_id] = ticket
                state.deadlines[ticket.group_id] = (now, now + self.deadline_s(state))
                state.last_grant = now
                if ticket.group_id in self._copies:
                    self._copies[ticket.group_id].add(state.actor_id)
                grants.setdefault(state.actor_id, []).append(ticket)
                again.append(state)
            pending = again
        return grants

    def _next_for(self, version: int, state: ActorState) -> Ticket | None:
        for i, t in enumerate(self.requeue):
            if t.group_id not in state.outstanding and t.group_id not in state.late:  # not its own again
                del self.requeue[i]
                return t
        if self.eval_queue:
            return self.eval_queue.popleft()
        min_version = self.rule.min_version(self.live(version), version)
        return None if min_version is None else self._new_ticket(min_version)

    def complete(self, actor_id: str, group_id: str, now: float | None = None) -> Ticket | None:
        """A rollout for ``group_id`` arrived from ``actor_id``; release its ticket. Returns it
        when this is its first answer (None: answered before, or unknown)."""
        now = time.monotonic() if now is None else now
        state = self.actors.get(actor_id)
        ticket = None
        if state is not None:
            state.groups_done += 1
            t0: float | None
            if group_id in state.late:  # another actor answered first: this is the duplicate
                t0, deadline = state.late.pop(group_id)
                self._observe(state, now - t0)  # still how long it takes
                if (
                    now <= deadline != math.inf
                ):  # in time by its own deadline (inf: it missed it): a race lost, not a failure
                    state.earned = min(state.earned + 1, max(state.max_groups, self.grant_start))
                self.late_answers += 1
                return None
            ticket = state.outstanding.pop(group_id, None)
            t0, deadline = state.deadlines.pop(group_id, (None, math.inf))
            if ticket is not None:
                if t0 is not None:
                    self._observe(state, now - t0)
                if deadline != math.inf:  # answered first and in time: it earns one more
                    state.earned = min(state.earned + 1, max(state.max_groups, self.grant_start))
                self._first(actor_id)
        holders = self._copies.pop(group_id, set())
        for other in holders - {actor_id}:  # copies issued past a deadline: their answers are late now
            o = self.actors.get(other)
            if o is not None and o.outstanding.pop(group_id, None) is not None:
                o.late[group_id] = o.deadlines.pop(group_id, (now, 0.0))
        if ticket is not None:
            self._drop_queued(group_id)
            return ticket
        # The ticket may have been re-queued (its first actor was presumed dead) or moved.
        return self._drop_queued(group_id)  # None: unknown or answered before (a duplicate)

    def _observe(self, state: ActorState, took: float) -> None:
        state.turnaround_s = took
        self.deadlines.observe(state.actor_id, took)

    def _first(self, actor_id: str) -> None:
        if len(self._firsts) == self._firsts.maxlen:
            self._first_counts[self._firsts[0]] -= 1
        self._firsts.append(actor_id)
        self._first_counts[actor_id] += 1

    def _drop_queued(self, group_id: str) -> Ticket | None:
        for queue in (self.requeue, self.eval_queue):
            for i, t in enumerate(queue):
                if t.group_id == group_id:
                    del queue[i]
                    return t
        return None

    @property
    def in_flight(self) -> int:
        """Distinct tickets held by actors or queued (a ticket issued again past its deadline counts once)."""
        held = {g for a in self.actors.values() for g in a.outstanding}
        return len(held | {t.group_id for t in self.requeue}) + len(self.eval_queue)
