"""Dynamic sampling (``learner.filter_groups``; DAPO, arXiv 2503.14476): groups that carry no
policy-gradient signal are played but not trained.

    f = GroupFilter("solved", batch_groups=8)
    status = f.judge(usable_episodes)   # "filtered" or "accepted"; called for groups the staleness rule accepted

Under grpo and rloo a group whose episodes all got the same reward has advantages all 0: it adds
nothing to the policy gradient but its share of the batch and of the KL term. Filtering it
gives its place under the staleness bound to another ticket (the learner forfeits it), so every
batch is made of groups with a signal. Two modes:

- ``"equal"`` (DAPO): every group whose rewards are all equal, all solved or all failed.
- ``"solved"``: only groups whose episodes all succeeded with equal rewards. An all-failed group
  is still trained: its advantage is 0, but its KL term is what pulls back the tokens that made
  it fail. Measured on guess_number (docs/results-log.md, "Filtering solved groups"): under
  ``"equal"`` the mass that negative advantages push off the sampled guesses at late turns (only
  failing episodes reach them) gathered on a token that is not a guess, every group containing
  it failed and was filtered, and nothing pulled it back: held-out success fell 0.57 -> 0.37.

A run whose tasks are all solved (or all failed) would then never train again: after
``STREAK_LIMIT`` x ``batch_groups`` filtered groups in a row the next group is accepted whatever
its rewards, and the streak starts over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from agentgym.protocol import AckStatus, Episode

STREAK_LIMIT = 4
"""Batches' worth of consecutive filtered groups after which one is trained anyway."""

FilterMode = Literal["off", "equal", "solved"]


class GroupFilter:
    def __init__(self, mode: FilterMode, batch_groups: int) -> None:
        self.mode = mode
        self.max_streak = STREAK_LIMIT * batch_groups
        self.streak = 0
        """Groups filtered since the last accepted one."""

    def carries_no_signal(self, episodes: Sequence[Episode]) -> bool:
        """Whether this mode filters a group of these episodes (streak aside)."""
        if self.mode == "off" or len({e.reward for e in episodes}) > 1:
            return False
        return self.mode == "equal" or all(e.success for e in episodes)

    def judge(self, episodes: Sequence[Episode]) -> AckStatus:
        """``filtered`` when the mode says the group carries no signal and the streak allows it."""
        if self.carries_no_signal(episodes) and self.streak < self.max_streak:
            self.streak += 1
            return "filtered"
        self.streak = 0
        return "accepted"
