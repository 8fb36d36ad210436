"""Where the learner's time goes, and whether what it trains looks like what was played.

    clock = LearnerClock()
    with clock.part("wait"): ...            # also "train", "export"; the rest of a step is "other"
    rec = clock.step_record()               # per step: learner_train_s, ..., learner_utilisation
    clock.summary()                         # totals and fractions for summary.json

    mix = EpisodeMix()
    mix.add("played", rollout); mix.add("trained", rollout)
    mix.step_record(); mix.summary()        # turn-count and env distributions, played vs trained

Utilisation is the share of wall time spent in optimizer work (``Trainer.train_step``); waiting
for data and exporting weights are the two ways it is lost. The first step's wait (engines and
env pools starting) is reported but left out of the summary's utilisation, as the throughput
figures leave start-up out too.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from agentgym.learner.training.batch import trainable_episodes
from agentgym.protocol import Rollout
from agentgym.protocol.arrays import I32, unpack

PARTS = ("wait", "train", "export")


class LearnerClock:
    def __init__(self) -> None:
        self.start = self.mark = time.monotonic()
        self.step_parts = dict.fromkeys(PARTS, 0.0)
        self.totals = dict.fromkeys((*PARTS, "wall"), 0.0)
        self.steps = 0

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.step_parts[name] += time.monotonic() - t0

    def step_record(self) -> dict[str, float]:
        """Close one step (wall time since the previous call) and return its figures."""
        now = time.monotonic()
        wall = max(now - self.mark, 1e-9)
        self.mark = now
        self.steps += 1
        rec = {f"learner_{k}_s": v for k, v in self.step_parts.items()}
        rec["learner_wall_s"] = wall
        rec["learner_utilisation"] = self.step_parts["train"] / wall
        if self.steps > 1:  # the first step waits for the actors to start: not the steady state
            for k, v in self.step_parts.items():
                self.totals[k] += v
            self.totals["wall"] += wall
        self.step_parts = dict.fromkeys(PARTS, 0.0)
        return rec

    def summary(self) -> dict[str, float]:
        wall = max(self.totals["wall"], 1e-9)
        out = {f"{k}_s": round(v, 3) for k, v in self.totals.items()}
        out.update({f"{k}_frac": round(self.totals[k] / wall, 4) for k in PARTS})
        out["utilisation"] = out.pop("train_frac")
        out["other_frac"] = round(max(0.0, 1 - sum(self.totals[k] for k in PARTS) / wall), 4)
        out["steps_counted"] = max(self.steps - 1, 0)
        return out


class EpisodeMix:
    """Episode counts by agent turns and by env, for what was played and what was trained."""

    def __init__(self) -> None:
        self.turns = {"played": Counter[int](), "trained": Counter[int]()}
        self.envs = {"played": Counter[str](), "trained": Counter[str]()}

    def add(self, kind: str, r: Rollout) -> None:
        for e in trainable_episodes(r):
            self.turns[kind][int(unpack(e.turn_ends, I32).size)] += 1
            self.envs[kind][r.env] += 1

    def _mean(self, kind: str) -> float:
        c = self.turns[kind]
        return sum(t * n for t, n in c.items()) / max(sum(c.values()), 1)

    def step_record(self) -> dict[str, float]:
        return {"played_turns_mean": self._mean("played"), "trained_turns_mean": self._mean("trained")}

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {}
        gaps = []
        for name, table in (("turns", self.turns), ("env", self.envs)):
            shares = {}
            for kind, c in table.items():
                n = max(sum(c.values()), 1)
                shares[kind] = {str(k): round(v / n, 4) for k, v in sorted(c.items())}
            keys = set(shares["played"]) | set(shares["trained"])
            gap = max((abs(shares["played"].get(k, 0) - shares["trained"].get(k, 0)) for k in keys), default=0.0)
            gaps.append(gap)
            out[name] = {**shares, "max_share_gap": round(gap, 4)}
        out["episodes"] = {k: sum(c.values()) for k, c in self.turns.items()}
        out["turns_mean"] = {k: round(self._mean(k), 4) for k in self.turns}
        out["turns_mean_ratio"] = round(self._mean("trained") / max(self._mean("played"), 1e-9), 4)
        return out
