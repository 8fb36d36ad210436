"""Ticket deadlines from measured turnaround: the one owner of the rule (ADR 0010, addendum).

    rule = DeadlineRule(factor=3.0, min_s=2.0, max_s=900.0)
    rule.observe("actor-a", 0.8)          # a ticket of actor-a answered 0.8 s after its grant
    rule.deadline_s("actor-a")            # 3 x the p95 of its recent turnarounds, within [2, 900]
    rule.deadline_s("newcomer")           # no history of its own: the fleet's p95, times 3
    rule.forget("actor-a")                # it left: its own window goes (the fleet's keeps it)

A ticket's deadline is ``factor`` times the 95th percentile of its actor's last ``WINDOW``
grant-to-answer times, once it has ``MIN_SAMPLES`` of them; before that, of the whole fleet's
last ``FLEET_WINDOW``; while nobody has answered, ``max_s``. The result is kept within
[``min_s``, ``max_s``]. A percentile, not a mean: an actor's turnarounds have a tail (longer
episodes, a weight update mid-episode), and a deadline at a few times the tail's edge is missed
by a working actor about never, while a peer that holds tickets and answers none loses them
within seconds of the fleet's pace instead of after a fixed floor. The scheduler
(learner/control/scheduler.py) asks this for every grant and feeds it every answer.
"""

from __future__ import annotations

import math
from collections import deque

WINDOW = 64
"""An actor's turnarounds kept for its percentile."""
FLEET_WINDOW = 256
"""The fleet's turnarounds kept (every actor's answers, in arrival order)."""
MIN_SAMPLES = 1
"""An actor's own answers before its own percentile replaces the fleet's: one is history, and
an actor slower than the fleet (a smaller GPU) must be judged by its own pace from its first answer."""
QUANTILE = 0.95


def quantile(values: deque[float] | list[float], q: float = QUANTILE) -> float | None:
    """The ``q`` quantile of ``values`` (nearest rank), None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class DeadlineRule:
    def __init__(self, factor: float = 3.0, min_s: float = 2.0, max_s: float = 900.0) -> None:
        if min_s > max_s:
            raise ValueError(f"DeadlineRule: min_s ({min_s}) must not exceed max_s ({max_s})")
        self.factor, self.min_s, self.max_s = factor, min_s, max_s
        self.own: dict[str, deque[float]] = {}
        self.fleet: deque[float] = deque(maxlen=FLEET_WINDOW)

    def observe(self, actor_id: str, took_s: float) -> None:
        """A ticket of ``actor_id`` answered ``took_s`` after its grant (a late copy's too)."""
        self.own.setdefault(actor_id, deque(maxlen=WINDOW)).append(took_s)
        self.fleet.append(took_s)

    def forget(self, actor_id: str) -> None:
        self.own.pop(actor_id, None)

    def turnaround_s(self, actor_id: str) -> float | None:
        """The p95 turnaround a deadline of ``actor_id`` is made from: its own once it has
        ``MIN_SAMPLES``, else the fleet's (None while nobody has answered)."""
        own = self.own.get(actor_id)
        if own is not None and len(own) >= MIN_SAMPLES:
            return quantile(own)
        return quantile(self.fleet)

    def deadline_s(self, actor_id: str) -> float:
        """Seconds a ticket granted to ``actor_id`` now may take before it is issued again."""
        est = self.turnaround_s(actor_id)
        if est is None:
            return self.max_s
        return min(max(self.factor * est, self.min_s), self.max_s)
