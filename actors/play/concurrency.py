"""How many groups an actor plays at once: sized by the actor itself, ``actor.max_groups`` a cap.

    ctl = Concurrency(cap=cfg.actor.max_groups, start=4)
    target = ctl.update(Signals(busy=..., kv_cache_usage=..., waiting=..., headroom=..., stale=...))

Called once per heartbeat. The rule is additive-increase / multiplicative-decrease, the way TCP
finds a link's rate without knowing it:

- grow (by a quarter, at least one) while every slot is busy, the engine's KV cache has room
  (usage below ``grow_below``) and the learner's staleness rule
  would issue more tickets (``headroom`` > 0, sent in the learner's heartbeats): more groups at
  once means larger engine batches and more env waits overlapped, and the learner has room.
- shrink (by a quarter, at least one) under memory pressure (usage at or above
  ``shrink_above``, or requests queued with usage past ``grow_below``) or when groups start to
  go stale (the learner's count of stale and expired groups rose since the last tick): past
  that point more concurrency only makes each group slower and older.
- otherwise hold.

A fast and a slow actor each settle where their own engine and envs put them: the slow one hits
memory pressure (or stops being fully busy) at a lower level. The learner grants each actor up
to the level it reports (``Heartbeat.stats["capacity"]``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Signals:
    busy: int
    """Groups being played now."""
    kv_cache_usage: float
    """Engine KV-cache usage in [0, 1] (``EngineLoad.kv_cache_usage``)."""
    waiting: int
    """Engine requests queued for memory (``EngineLoad.waiting``)."""
    running: int
    """Engine requests running (``EngineLoad.running``)."""
    headroom: float
    """Tickets the learner's staleness rule would still issue (its last heartbeat); < 0: unknown."""
    stale: float
    """The learner's count of stale + expired groups (its last heartbeat)."""


class Concurrency:
    def __init__(self, cap: int, start: int = 4, *, grow_below: float = 0.8, shrink_above: float = 0.95) -> None:
        if cap < 1 or start < 1:
            raise ValueError(f"Concurrency: cap and start must be >= 1, got cap={cap} start={start}")
        if not 0 < grow_below <= shrink_above <= 1:
            raise ValueError(f"Concurrency: need 0 < grow_below <= shrink_above <= 1, got {grow_below}, {shrink_above}")
        self.cap = cap
        self.target = min(start, cap)
        self.grow_below = grow_below
        self.shrink_above = shrink_above
        self._stale_seen: float | None = None
        self.last_reason = "start"

    def _step(self) -> int:
        return max(1, self.target // 4)

    def update(self, s: Signals) -> int:
        """One tick: returns the new target (also kept in ``self.target``)."""
        new_stale = self._stale_seen is not None and s.stale > self._stale_seen
        self._stale_seen = s.stale
        # Requests queued while the cache is nearly full wait for memory; queued with room to
        # spare they only wait for the scheduler's next batch, which is no reason to shrink.
        pressure = s.kv_cache_usage >= self.shrink_above or (s.waiting > 0 and s.kv_cache_usage >= self.grow_below)
        if pressure or new_stale:
            self.target = max(1, self.target - self._step())
            self.last_reason = "memory" if pressure else "stale"
        elif s.busy >= self.target and s.headroom > 0 and s.kv_cache_usage < self.grow_below and self.target < self.cap:
            self.target = min(self.cap, self.target + self._step())
            self.last_reason = "grow"
        else:
            self.last_reason = "hold"
        return self.target
