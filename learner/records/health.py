"""Run health: says when a run cannot learn (no reward signal) or has collapsed, instead of
finishing "successfully" with a dead policy.

    health = RunHealth(window=cfg.run.health_window, decode=tokenizer.decode)
    verdict = health.observe(step, batch, entropy)   # after every optimizer step
    if verdict and cfg.run.stop_on_collapse: stop the run with verdict.reason
    health.metrics(); health.summary()                # metrics.jsonl; summary.json

Two states, each warned once per run on the console and in the JSON log:

- **no reward signal**: in each of the last ``window`` steps every group's episodes got equal
  rewards, so every GRPO advantage was 0 and the step trained nothing (loss 0, grad norm 0).
  A task the policy never solves (a maze at random) sits here from the start; the warning says
  what the reward was.
- **collapsed**: no reward signal AND at least ``COLLAPSE_SHARE`` of the actions played in the
  window are one action: the policy has settled on it and no gradient will move it (the async
  echo runs that answered ``<|im_start|>`` to almost every task, with entropy 1.57 -> 0.56 and
  grad norm 0 from step 5 to 100). The warning names that action, decoded, and its share.

A state that ends (a group with different rewards appears) resets the count; the warning for it
is not repeated. ``run.stop_on_collapse`` makes a collapse end the run with exit code 3 and a
one-line reason (``agentgym train`` and ``agentgym-learner`` print it).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import structlog

from agentgym.learner.training.batch import trainable_episodes
from agentgym.protocol import Rollout
from agentgym.protocol.arrays import I32, U8, unpack

log = structlog.get_logger(__name__)

COLLAPSE_SHARE = 0.9
"""Share of the window's actions that one action must hold for a signal-free run to be collapsed."""


@dataclass(frozen=True)
class Collapse:
    step: int
    action: str
    share: float
    entropy: float

    @property
    def reason(self) -> str:
        return (
            f"collapsed at step {self.step}: {self.share:.0%} of actions are {self.action!r}, every group "
            f"has equal rewards (no gradient), entropy {self.entropy:.2f}"
        )


def group_has_signal(r: Rollout) -> bool:
    """Whether the group's trained episodes got different rewards (some advantage is nonzero)."""
    return len({round(float(e.reward), 9) for e in trainable_episodes(r)}) > 1


def episode_actions(token_ids: np.ndarray, loss_mask: np.ndarray) -> list[tuple[int, ...]]:
    """The agent's turns of one episode: each contiguous run of loss-mask-1 tokens."""
    out: list[tuple[int, ...]] = []
    cur: list[int] = []
    for tok, m in zip(token_ids.tolist(), loss_mask.tolist()):
        if m:
            cur.append(tok)
        elif cur:
            out.append(tuple(cur))
            cur = []
    if cur:
        out.append(tuple(cur))
    return out


class RunHealth:
    def __init__(self, window: int, decode: Callable[[list[int]], str] | None = None) -> None:
        if window < 1:
            raise ValueError(f"RunHealth: window must be >= 1, got {window}")
        self.window = window
        self.decode = decode
        self.signal_free = 0
        """Consecutive steps in which no group had a reward signal."""
        self.actions: collections.deque[collections.Counter] = collections.deque(maxlen=window)
        self.rewards: collections.deque[float] = collections.deque(maxlen=window)
        self.warned_no_signal_at: int | None = None
        self.collapse: Collapse | None = None
        self.top_share = 0.0

    def observe(
        self, step: int, batch: list[Rollout], entropy: float, advantage_abs_mean: float | None = None
    ) -> Collapse | None:
        """Take one trained step; returns the Collapse when the run has just been found collapsed.
        ``advantage_abs_mean``: the trainer's (turn-level credit can make advantages nonzero where
        final rewards are equal); without it, the groups' rewards decide."""
        signal = any(group_has_signal(r) for r in batch) if advantage_abs_mean is None else advantage_abs_mean > 1e-9
        self.signal_free = 0 if signal else self.signal_free + 1
        counts: collections.Counter = collections.Counter()
        rewards = []
        for r in batch:
            for e in trainable_episodes(r):
                counts.update(episode_actions(unpack(e.token_ids, I32), unpack(e.loss_mask, U8)))
                rewards.append(float(e.reward))
        self.actions.append(counts)
        self.rewards.append(float(np.mean(rewards)) if rewards else 0.0)
        total = sum(self.actions, collections.Counter())
        top, n = total.most_common(1)[0] if total else ((), 0)
        self.top_share = n / max(1, sum(total.values()))
        if self.signal_free < self.window:
            return None
        if self.warned_no_signal_at is None:
            self.warned_no_signal_at = step
            log.warning(
                "no_reward_signal",
                step=step,
                steps=self.signal_free,
                reward=round(self.rewards[-1], 4),
                hint="every episode of every group got the same reward, so every advantage is 0 and "
                "nothing is trained; the task may be too hard for the start policy (try a shorter "
                "horizon, an easier task, or a base model that can act in this env)",
            )
        if self.collapse is None and self.top_share >= COLLAPSE_SHARE:
            self.collapse = Collapse(step, self._text(top), round(self.top_share, 3), round(entropy, 3))
            log.warning(
                "run_collapsed",
                step=step,
                action=self.collapse.action,
                share=self.collapse.share,
                entropy=self.collapse.entropy,
                reason=self.collapse.reason,
            )
            return self.collapse
        return None

    def _text(self, action: tuple[int, ...]) -> str:
        if self.decode is None:
            return " ".join(map(str, action))
        return self.decode(list(action))

    def metrics(self) -> dict[str, float]:
        return {
            "health/signal_free_steps": float(self.signal_free),
            "health/top_action_share": round(self.top_share, 4),
        }

    def summary(self) -> dict[str, object]:
        return {
            "no_reward_signal_at": self.warned_no_signal_at,
            "collapsed": None
            if self.collapse is None
            else {
                "step": self.collapse.step,
                "action": self.collapse.action,
                "share": self.collapse.share,
                "entropy": self.collapse.entropy,
            },
        }
