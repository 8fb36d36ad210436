"""``probe``: one-turn environments that each test one thing the learner must be able to learn.

When a multi-turn task does not learn, the question is whether the learner's signal or the
task's exploration is at fault. A probe answers it in a minute: it has one turn, a known optimal
policy, and needs exactly one capability (the practice of "probe environments" in deep RL
debugging). Every text is in guess_number's ``CORPUS``, so the quickstart's tiny model and its
tokenizer play it as they are.

    options:  kind: "say" | "echo"      what is tested (below), default "echo"
              low: int = 1, high: int = 8
    kind = "say":   observation "guess a number from 1 to 8"; reward 1 for any number in range.
                    Needs the policy to move probability onto a set of actions: no context.
    kind = "echo":  observation one number n from low..high (drawn from the task id); reward 1
                    for saying exactly n. Needs the action to depend on the observation: the
                    smallest conditional policy there is. A policy ignoring the observation
                    solves 1 / (high - low + 1).
    step ->   "correct" (reward 1, success) | "game over" (reward 0); done either way.
              The expert says the right thing.

``python bench/learn_curve.py -o 'env.name="probe"' -o 'env.kwargs={kind="echo"}'`` trains on one;
docs/results-log.md ("The echo probe") reports what the quickstart's learner does on them.
"""

from __future__ import annotations

import random
from typing import Literal

from agentgym.envpool.base import Env, StepResult
from agentgym.envpool.envs.guess_number import CORRECT, GAME_OVER, parse_number, prompt

KINDS = ("say", "echo")


class Probe(Env):
    name = "probe"

    def __init__(self, kind: Literal["say", "echo"] = "echo", low: int = 1, high: int = 8, **kwargs: object) -> None:
        super().__init__(**kwargs)
        if kind not in KINDS:
            raise ValueError(f"probe: option kind must be one of {list(KINDS)}, got {kind!r}")
        for key, value in (("low", low), ("high", high)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"probe: option {key} must be an integer, got {value!r}")
        if low > high:
            raise ValueError(f"probe: low={low} is greater than high={high}")
        self.kind, self.low, self.high = kind, low, high
        self._target: int | None = None
        self._done = False

    def reset(self, task_id: int) -> str:
        self._target = random.Random(task_id).randint(self.low, self.high)
        self._done = False
        return prompt(self.low, self.high) if self.kind == "say" else str(self._target)

    def instructions(self) -> str:
        return "say one number."

    def _right(self, guess: int | None) -> bool:
        if guess is None:
            return False
        if self.kind == "say":
            return self.low <= guess <= self.high
        return guess == self._target

    def step(self, action: str) -> StepResult:
        if self._target is None or self._done:
            return StepResult(GAME_OVER, 0.0, True, {"turns": 1, "success": False})
        self._done = True
        ok = self._right(parse_number(action))
        return StepResult(CORRECT if ok else GAME_OVER, float(ok), True, {"turns": 1, "success": ok})

    def expert_action(self) -> str:
        if self._target is None:
            raise RuntimeError("probe: expert_action before reset")
        return str(self._target)
