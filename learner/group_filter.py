"""Dynamic sampling (``learner.filter_groups``; DAPO, arXiv 2503.14476): groups whose episodes all
got the same reward are played but not trained.

    f = GroupFilter(batch_groups=8)
    status = f.judge(usable_episodes)   # "filtered" or "accepted"; called for groups the staleness rule accepted

Under grpo and rloo such a group's advantages are all 0: it adds nothing to the policy gradient
but its share of the batch (and of the KL term, which then pulls toward the reference with
nothing against it). Filtering it gives its place under the staleness bound to another ticket
(the learner forfeits it), so every batch is made of groups with a signal. A run whose tasks are
all solved (or all failed) would then never train again: after ``STREAK_LIMIT`` x
``batch_groups`` filtered groups in a row the next group is accepted whatever its rewards, and
the streak starts over.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentgym.protocol import AckStatus, Episode

STREAK_LIMIT = 4
"""Batches' worth of consecutive filtered groups after which one is trained anyway."""


class GroupFilter:
    def __init__(self, batch_groups: int) -> None:
        self.max_streak = STREAK_LIMIT * batch_groups
        self.streak = 0
        """Groups filtered since the last accepted one."""

    def judge(self, episodes: Sequence[Episode]) -> AckStatus:
        """``filtered`` when every episode's reward is the same (and the streak allows it)."""
        uniform = len({e.reward for e in episodes}) <= 1
        if uniform and self.streak < self.max_streak:
            self.streak += 1
            return "filtered"
        self.streak = 0
        return "accepted"
