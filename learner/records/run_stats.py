"""The learner's counts of what arrived and what became of it, and its rates over recent steps.

    c = Counters()
    c.groups["accepted"] += 1; c.episodes["accepted"] += 8     # every status the learner acks
    rates = c.rates(agent_tokens=512)                          # per step: trajectories/s, tokens/s
    c.step_fields()                                            # groups_* / episodes_* for metrics.jsonl

One counter per fact: ``summary.json`` and every ``metrics.jsonl`` record read these.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

STATUSES = ("accepted", "stale", "duplicate", "invalid", "failed", "eval", "filtered")
RATE_WINDOW_S = 10.0
"""Rates are over the steps of the last ~10 s, not one step: several steps can be trained back
to back from a full buffer, with no new episodes in between."""


@dataclass
class Counters:
    groups: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    episodes: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*STATUSES, "env_failure"), 0))
    agent_tokens: int = 0
    """Agent tokens of every trained group."""
    expired: dict[str, int] = field(default_factory=lambda: {"groups": 0, "episodes": 0})
    """Accepted groups that aged past max_staleness in the buffer and were dropped untrained
    (a subset of ``groups["accepted"]``: the ack had already said accepted)."""
    prefix_breaks: dict[str, int] = field(default_factory=lambda: {"prefix_breaks": 0, "split_episodes": 0})
    """Agent-endpoint conversations (actors/play/agent_trace.py) among the episodes that arrived (not
    invalid): calls whose prompt did not extend the previous call's tokens, and episodes that
    therefore arrived in more than one segment."""
    _window: deque[tuple[float, int, int]] = field(default_factory=lambda: deque([(time.monotonic(), 0, 0)]))
    """(time, accepted episodes, agent tokens) at recent steps."""

    def rates(self, agent_tokens: int) -> dict[str, float]:
        """Count a trained step's agent tokens; accepted trajectories/s and agent tokens/s over
        the rate window."""
        now = time.monotonic()
        self.agent_tokens += agent_tokens
        eps, toks = self.episodes["accepted"], self.agent_tokens
        while len(self._window) > 1 and now - self._window[1][0] >= RATE_WINDOW_S:
            self._window.popleft()
        t0, eps0, toks0 = self._window[0]
        dt = max(now - t0, 1e-9)
        self._window.append((now, eps, toks))
        return {"trajectories_per_s": (eps - eps0) / dt, "tokens_per_s": (toks - toks0) / dt}

    def step_fields(self) -> dict[str, int]:
        return {
            **{f"groups_{k}": v for k, v in self.groups.items()},
            **{f"episodes_{k}": v for k, v in self.episodes.items()},
            "groups_expired": self.expired["groups"],
            **self.prefix_breaks,
        }

    def count_breaks(self, episodes: list) -> None:
        for e in episodes:
            if e.prefix_breaks:
                self.prefix_breaks["prefix_breaks"] += e.prefix_breaks
                self.prefix_breaks["split_episodes"] += 1
