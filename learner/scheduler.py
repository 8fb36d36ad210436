"""Who plays what: actor registry, tickets (credits), each actor's current capacity.

Plain bookkeeping, no I/O, so the rules are testable in isolation. The learner's control loop
calls it on every message and the reaper calls ``expire`` once a second.

A ticket is one group to play. Nothing is played without one, so the learner's memory and the
staleness of what it receives are bounded by what it hands out; whether a new training ticket
may be issued now is the staleness rule's call (``learner/staleness.py``, the one owner of it).
Each actor is granted up to its current capacity, which it sizes itself and reports in its
heartbeats (``actors/concurrency.py``).

Tickets of an actor that leaves or goes silent are re-issued to the others, so no group is lost.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentgym.config import EnvSpec
from agentgym.learner.staleness import StalenessRule
from agentgym.protocol import Ticket


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


class Scheduler:
    def __init__(
        self,
        *,
        envs: Sequence[EnvSpec],
        batch_groups: int,
        max_staleness: int,
        mode: str,
        run_id: str,
        seed: int,
        issued: int = 0,
        rule: StalenessRule | None = None,
    ) -> None:
        if not envs:
            raise ValueError("Scheduler: no environment to play")
        self.envs = list(envs)
        self._weights = list(itertools.accumulate(e.weight for e in self.envs))
        self.batch_groups = batch_groups
        self.max_staleness = max_staleness
        self.mode = mode
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
        self.rule = rule or StalenessRule(mode=mode, max_staleness=max_staleness, batch_groups=batch_groups)  # type: ignore[arg-type]
        self._next_index = 0

    # ------------------------------------------------------------------ actors
    def register(self, actor_id: str, peer: bytes, hostname: str, max_groups: int) -> tuple[ActorState, bool]:
        """Add an actor, or refresh one that reconnects. Returns (state, is_new)."""
        now = time.monotonic()
        known = self.actors.get(actor_id)
        if known is not None:
            known.peer, known.last_seen, known.max_groups = peer, now, max_groups
            return known, False
        state = ActorState(actor_id, peer, self._next_index, hostname, max_groups, now)
        self._next_index += 1
        self.actors[actor_id] = state
        return state, True

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
        back = list(state.outstanding.values())
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

    # ------------------------------------------------------------------ tickets
    def _new_ticket(self, min_version: int) -> Ticket:
        n = self.issued
        self.issued += 1
        # Environment and task are a function of (seed, ticket number): a resumed run draws the same.
        rng = random.Random(f"{self.seed}:{n}")
        env = self.envs[0] if len(self.envs) == 1 else rng.choices(self.envs, cum_weights=self._weights)[0]
        task = env.task_start + rng.randrange(env.task_count)
        return Ticket(group_id=f"{self.run_id}:{n}", env=env.name, task_id=task, min_version=min_version)

    def eval_round(self, version: int, split: str, tasks: int) -> list[Ticket]:
        """Queue one evaluation: the first ``tasks`` tasks of ``split`` of every env, played with
        weights of at least ``version``. Ticket task ids are indexes into the split."""
        made = [
            Ticket(group_id=f"{self.run_id}:eval{version}:{e.name}:{i}", env=e.name, task_id=i,
                   min_version=version, split=split)  # type: ignore[arg-type]
            for e in self.envs for i in range(tasks)
        ]  # fmt: skip
        self.eval_queue.extend(made)
        return made

    def live(self, version: int) -> int:
        """Training tickets issued and neither trained (``batch_groups`` per version) nor forfeited."""
        return self.issued - self.forfeited - self.batch_groups * version

    def headroom(self, version: int) -> int:
        """Training tickets the staleness rule would still issue now (sent to actors as a hint)."""
        return self.rule.headroom(self.live(version))

    def forfeit(self, group_id: str) -> None:
        """The group of one of this run's training tickets will not be trained: free its place
        under the admission rule (other ids — evaluation, an earlier run's — are ignored)."""
        prefix = f"{self.run_id}:"
        if group_id.startswith(prefix) and group_id[len(prefix) :].isdigit():
            self.forfeited += 1
            self.rule.on_forfeit()

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
        for state in sorted(self.actors.values(), key=lambda a: len(a.outstanding)):
            while len(state.outstanding) < state.max_groups:
                ticket = self._next_for(version)
                if ticket is None:
                    return grants
                state.outstanding[ticket.group_id] = ticket
                grants.setdefault(state.actor_id, []).append(ticket)
        return grants

    def _next_for(self, version: int) -> Ticket | None:
        if self.requeue:
            return self.requeue.popleft()
        if self.eval_queue:
            return self.eval_queue.popleft()
        min_version = self.rule.min_version(self.live(version))
        return None if min_version is None else self._new_ticket(min_version)

    def complete(self, actor_id: str, group_id: str) -> Ticket | None:
        """A rollout for ``group_id`` arrived from ``actor_id``; release its ticket."""
        state = self.actors.get(actor_id)
        if state is not None:
            state.groups_done += 1
            ticket = state.outstanding.pop(group_id, None)
            if ticket is not None:
                return ticket
        # The ticket may have been re-queued (its first actor was presumed dead) or moved.
        for queue in (self.requeue, self.eval_queue):
            for i, t in enumerate(queue):
                if t.group_id == group_id:
                    del queue[i]
                    return t
        return None  # unknown or already re-issued elsewhere: that copy will come back a duplicate

    @property
    def in_flight(self) -> int:
        return sum(len(a.outstanding) for a in self.actors.values()) + len(self.requeue) + len(self.eval_queue)
