"""The turn-limit curriculum: each environment's current turn limit, advanced by step or by success.

    cur = Curriculum(cfg.schedule, ["babyai", "sciworld"])
    cur.limits()                          # {"babyai": 6, "sciworld": 10}: what actors play now
    for adv in cur.observe(step, counts): # after optimizer step ``step``; counts: env -> (successes, episodes)
        ...                               # Advance(env, from_limit, to_limit, step, reason)
    extra["curriculum"] = cur.state()     # in the learner checkpoint; cur.restore(extra["curriculum"], step)

Each env follows its own schedule (``[schedule.envs.NAME]``, else ``[schedule]``):

- by step (``turn_limits``): the limit is a function of the step, nothing to save;
- by success (``stages``): the env moves to its next stage when the success rate over its episodes
  of its last ``window`` steps that trained on it (within the stage) reaches ``threshold``, or when
  that rate has not risen by ``min_delta`` above the stage's best for ``patience`` such steps. A
  new stage starts with an empty window: success at a longer limit is a new quantity.

``observe`` is called once per optimizer step, before the step's weights are published and before
the step's checkpoint, so a checkpoint of step s holds the state after step s: a resume neither
re-applies step s (no double advance) nor loses a stage.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from agentgym.config import ScheduleConfig, TurnSchedule

REASONS = ("step", "threshold", "plateau")


@dataclass(frozen=True)
class Advance:
    """An env's turn limit changed after ``step``: the weights of version ``step`` carry ``to_limit``."""

    env: str
    from_limit: int
    to_limit: int
    step: int
    reason: str  # one of REASONS
    success: float | None = None
    """The windowed success that triggered it (success-driven stages)."""


@dataclass
class EnvStage:
    """Where one success-driven env stands: its stage and the success seen in that stage."""

    schedule: TurnSchedule
    stage: int = 0
    since_step: int = 0
    """The step after which this stage began (0: the first stage)."""
    window: deque[tuple[int, int]] = field(default_factory=deque)
    """(successes, episodes) of the env in each of its last ``window`` trained steps of this stage."""
    best: float | None = None
    since_best: int = 0

    @property
    def limit(self) -> int:
        return self.schedule.stages[self.stage]

    def success(self) -> float | None:
        """Success rate over the window's episodes; None until the window is full."""
        if len(self.window) < self.schedule.window:
            return None
        n = sum(e for _, e in self.window)
        return sum(s for s, _ in self.window) / n if n else 0.0

    def update(self, successes: int, episodes: int) -> tuple[str, float] | None:
        """Add one trained step; the reason to advance (and the success behind it), if any."""
        sch = self.schedule
        self.window.append((successes, episodes))
        while len(self.window) > sch.window:
            self.window.popleft()
        rate = self.success()
        if rate is None:
            return None
        # The plateau counter runs on every full-window step, so its state is the same whether
        # or not a threshold fired first.
        if self.best is None or rate >= self.best + sch.min_delta:
            self.best, self.since_best = rate, 0
        else:
            self.since_best += 1
        if self.stage + 1 >= len(sch.stages):
            return None  # the last stage: nothing to advance to
        if sch.threshold is not None and rate >= sch.threshold:
            return "threshold", rate
        if sch.patience is not None and self.since_best >= sch.patience:
            return "plateau", rate
        return None

    def advance(self, step: int) -> None:
        self.stage += 1
        self.since_step = step
        self.window.clear()
        self.best, self.since_best = None, 0

    def state(self) -> dict[str, Any]:
        return {
            "stages": list(self.schedule.stages),
            "stage": self.stage,
            "since_step": self.since_step,
            "window": [list(w) for w in self.window],
            "best": self.best,
            "since_best": self.since_best,
        }


class Curriculum:
    """The turn limit of every env of a run, one schedule each (see the module docstring)."""

    def __init__(self, schedule: ScheduleConfig, envs: list[str]) -> None:
        self.schedules = {name: schedule.for_env(name) for name in envs}
        self.by_success = {name: EnvStage(s) for name, s in self.schedules.items() if s.by_success}
        self.step = 0

    def limit(self, env: str) -> int:
        st = self.by_success.get(env)
        return st.limit if st is not None else self.schedules[env].turn_limit(self.step)

    def limits(self) -> dict[str, int]:
        """Each env's current turn limit (episodes started from now on play it)."""
        return {name: self.limit(name) for name in self.schedules}

    def observe(self, step: int, counts: dict[str, tuple[int, int]]) -> list[Advance]:
        """Account optimizer step ``step`` (its batch: env -> (successes, episodes)); return the
        limits that changed. Steps must come in order, each once."""
        if step != self.step + 1:
            raise ValueError(f"curriculum: step {step} observed after step {self.step} (steps go one by one)")
        out = []
        for name, sch in self.schedules.items():
            st = self.by_success.get(name)
            if st is None:
                before, after = sch.turn_limit(step - 1), sch.turn_limit(step)
                if before != after:
                    out.append(Advance(name, before, after, step, "step"))
                continue
            s, n = counts.get(name, (0, 0))
            if n <= 0:
                continue  # this batch had no episode of the env: its window waits
            fired = st.update(s, n)
            if fired is not None:
                before = st.limit
                st.advance(step)
                out.append(Advance(name, before, st.limit, step, fired[0], round(fired[1], 4)))
        self.step = step
        return out

    def metrics(self, played: dict[str, int]) -> dict[str, float]:
        """Per-env record of a step: ``env/<name>/turn_limit`` (the limit the step's episodes were
        started under: ``played``, taken before ``observe``), and for success-driven envs the
        stage and the windowed success after the step. ``turn_limit``: the largest of them."""
        out: dict[str, float] = {"turn_limit": max(played.values())}
        for name, limit in played.items():
            out[f"env/{name}/turn_limit"] = limit
        for name, st in self.by_success.items():
            out[f"env/{name}/turn_stage"] = st.stage
            rate = st.success()
            if rate is not None:
                out[f"env/{name}/stage_success"] = rate
        return out

    def state(self) -> dict[str, Any]:
        """JSON-able state for the learner checkpoint."""
        return {"step": self.step, "envs": {name: st.state() for name, st in self.by_success.items()}}

    def restore(self, state: dict[str, Any] | None, step: int) -> list[str]:
        """Take the state of a checkpoint of step ``step``; returns the success-driven envs that
        had no saved state (they start at their first stage). A saved state of another step, or
        of other stages than the config's, is an error: resuming from it would skip or repeat
        advances."""
        self.step = step
        saved: dict[str, Any] = (state or {}).get("envs", {})
        if state is not None and int(state.get("step", step)) != step:
            raise ValueError(f"curriculum state is of step {state.get('step')}, the checkpoint of step {step}")
        fresh = []
        for name, st in self.by_success.items():
            s = saved.get(name)
            if s is None:
                fresh.append(name)
                continue
            if list(s["stages"]) != list(st.schedule.stages):
                raise ValueError(
                    f"schedule for env {name!r}: the checkpoint's stages are {s['stages']}, "
                    f"the config's {st.schedule.stages}; resume with the run's own config"
                )
            if not 0 <= int(s["stage"]) < len(st.schedule.stages):
                raise ValueError(f"curriculum state of env {name!r}: stage {s['stage']} out of range")
            st.stage, st.since_step = int(s["stage"]), int(s["since_step"])
            st.window = deque((int(a), int(b)) for a, b in s["window"])
            while len(st.window) > st.schedule.window:  # a smaller window in the config: keep the newest
                st.window.popleft()
            st.best = None if s["best"] is None else float(s["best"])
            st.since_best = int(s["since_best"])
        return fresh


def success_counts(per_env: dict[str, float]) -> dict[str, tuple[int, int]]:
    """env -> (successes, episodes) from a batch's ``env/<name>/success_rate`` and ``.../episodes``."""
    out = {}
    for key, n in per_env.items():
        if key.startswith("env/") and key.endswith("/episodes"):
            name = key[len("env/") : -len("/episodes")]
            out[name] = (round(per_env[f"env/{name}/success_rate"] * n), int(n))
    return out
