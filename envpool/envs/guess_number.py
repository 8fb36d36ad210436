"""``guess_number``: find a hidden integer from "higher" / "lower" hints.

Built so that a tiny language model (a few hundred tokens of vocabulary, two layers, random
initialisation) can learn it by RL on a CPU in minutes: every text the env emits comes from a
handful of fixed words (``CORPUS`` lists them all, for training a tokenizer), the action is one
number, and a good policy (binary search) needs only a few turns.

    options:  low: int = 1, high: int = 8          (env.kwargs in the config)
              step_latency_s: float = 0             each step first waits this long (the median)
              latency_sigma: float = 0              spread of that wait: log-normal, sigma of its log
              show_range: bool = False              hints also say what the hints so far allow:
                                                    "higher, 5 to 8" instead of "higher"
              shaping: float = 0                    weight of a potential-based reward for narrowing
                                                    the interval the hints allow (below)
              held_out: str = "none"                "targets": the splits draw from disjoint sets of
                                                    numbers (below); "none": every split draws any
    target:   random.Random(task_id).randint(low, high); with held_out "targets", a choice from
              the split's own numbers (``split_targets``)
    reset ->  "guess a number from 1 to 8"
    step  ->  "correct" (reward 1, done, success) | "higher" | "lower"
              | "invalid, say a number from 1 to 8" (no integer, or out of range; still a turn)

A game is fully determined by its target, so with the default ``held_out = "none"`` every test
game of a range of 8 is also a training game (bench/task_overlap.py reports 16 of 16).
``held_out = "targets"`` holds numbers out instead: by the number's place in the range, counted
from ``low`` modulo 4, places 1 go to test, places 2 to dev and places 0 and 3 to training (1 to 8:
test 2 and 6, dev 3 and 7, training 1, 4, 5 and 8), so a held-out game asks for a number the
policy was never rewarded for finding. A task id outside the procedural ranges counts as training.

``show_range`` makes the game Markov: the observation carries the interval, so the policy need
not reconstruct it from the whole history of guesses and hints. Its words and digits are already
in ``CORPUS``.

``shaping`` adds potential-based reward shaping (Ng, Harada & Russell, "Policy invariance under
reward transformations", ICML 1999) with the potential Φ(s) = −log2|I| / log2 N, I the interval
the hints so far allow (a solved game: |I| = 1) and N = high − low + 1: each turn earns
``shaping * (Φ(s') − Φ(s))``, the share of the bits still missing that the guess found. A guess
that halves the interval earns ``shaping / log2 N``; one outside it, a repeat or an invalid reply
earns 0. Over an episode the shaping telescopes to ``shaping * (Φ(end) − Φ(start))``, so it
changes no optimal policy; what it adds is a per-turn signal that says which guess used the
hints, which a 0/1 reward at the end spreads over every turn (docs/results-log.md, "What holds
guess_number near 0.6"). ``success`` stays "found the number"; held-out success ignores the
shaping.

The instructions repeat the rules for agents that get a system message; the first observation
alone is enough to play. The env has no turn limit of its own: the actor applies the learner's.
The expert plays binary search on the hints so far and always solves within
ceil(log2(high - low + 1)) + 1 turns.

``step_latency_s`` makes the env behave like one that waits on a tool, a web page or a
simulator: each step sleeps (no CPU) for ``step_latency_s * exp(latency_sigma * z)`` seconds,
z standard normal and drawn from (task id, turn), so a rerun waits the same. With
``latency_sigma = 1`` the mean wait is 1.65x the median and one step in a hundred waits over 10x:
the long tail that makes a synchronous batch wait for its slowest episode
(``agentgym bench``). The wait changes nothing else the env does.
"""

from __future__ import annotations

import math
import random
import re
import time

from agentgym.envpool.base import Env, StepResult, split_of

_INT = re.compile(r"[-+]?\d+")
_MAX_DIGITS = 18  # a longer run of digits is out of range anyway; int() of huge strings is slow


def prompt(low: int, high: int) -> str:
    return f"guess a number from {low} to {high}"


def invalid(low: int, high: int) -> str:
    return f"invalid, say a number from {low} to {high}"


def instructions(low: int, high: int) -> str:
    return f"guess a number from {low} to {high}. say one number. you hear higher, lower or correct."


CORRECT, HIGHER, LOWER, GAME_OVER = "correct", "higher", "lower", "game over"


def corpus(low: int = 1, high: int = 8) -> list[str]:
    """Every text the env emits for this range, plus every valid action and the digits."""
    texts = [prompt(low, high), invalid(low, high), instructions(low, high), CORRECT, HIGHER, LOWER, GAME_OVER]
    return texts + [str(n) for n in range(low, high + 1)] + [str(d) for d in range(10)]


CORPUS: list[str] = corpus()
"""The texts of the default range (1 to 8); ``corpus(low, high)`` for others."""


HELD_OUT = ("none", "targets")


def split_targets(low: int, high: int) -> dict[str, list[int]]:
    """held_out "targets": the numbers each split draws from (by place in the range, modulo 4)."""
    place = {0: "train", 1: "test", 2: "dev", 3: "train"}
    out: dict[str, list[int]] = {"train": [], "dev": [], "test": []}
    for n in range(low, high + 1):
        out[place[(n - low) % 4]].append(n)
    return out


def parse_number(action: str) -> int | None:
    """The first integer in ``action`` (None: none, or too many digits to be in any range)."""
    m = _INT.search(action)
    if m is None or len(m.group().lstrip("+-")) > _MAX_DIGITS:
        return None
    return int(m.group())


class GuessNumber(Env):
    name = "guess_number"

    def __init__(
        self,
        low: int = 1,
        high: int = 8,
        step_latency_s: float = 0.0,
        latency_sigma: float = 0.0,
        show_range: bool = False,
        shaping: float = 0.0,
        held_out: str = "none",
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(show_range, bool):
            raise TypeError(f"guess_number: option show_range must be true or false, got {show_range!r}")
        self.show_range = show_range
        if not isinstance(shaping, (int, float)) or isinstance(shaping, bool) or not 0 <= shaping < math.inf:
            raise ValueError(f"guess_number: option shaping must be a number >= 0, got {shaping!r}")
        self.shaping = float(shaping)
        for key, value in (("low", low), ("high", high)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"guess_number: option {key} must be an integer, got {value!r}")
        if low > high:
            raise ValueError(f"guess_number: low={low} is greater than high={high}")
        for key, seconds in (("step_latency_s", step_latency_s), ("latency_sigma", latency_sigma)):
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 <= seconds < math.inf:
                raise ValueError(f"guess_number: option {key} must be a number >= 0, got {seconds!r}")
        if held_out not in HELD_OUT:
            raise ValueError(f"guess_number: option held_out must be one of {list(HELD_OUT)}, got {held_out!r}")
        self.targets = split_targets(low, high) if held_out == "targets" else None
        if self.targets is not None and not all(self.targets.values()):
            raise ValueError(
                f"guess_number: held_out 'targets' needs a range of at least 3 numbers, got {low} to {high}"
            )
        self.low, self.high = low, high
        self.step_latency_s, self.latency_sigma = float(step_latency_s), float(latency_sigma)
        self._task_id = 0
        self._target: int | None = None
        self._lo, self._hi = low, high  # what the hints so far allow (for the expert)
        self._turns = 0
        self._done = False

    def reset(self, task_id: int) -> str:
        self._task_id = task_id
        draw = random.Random(task_id)
        if self.targets is None:
            self._target = draw.randint(self.low, self.high)
        else:
            self._target = draw.choice(self.targets[split_of(task_id) or "train"])
        self._lo, self._hi = self.low, self.high
        self._turns = 0
        self._done = False
        return prompt(self.low, self.high)

    def instructions(self) -> str:
        return instructions(self.low, self.high)

    def step(self, action: str) -> StepResult:
        if self._target is None:
            return StepResult(invalid(self.low, self.high), 0.0, False, {"turns": self._turns})
        if self._done:
            return StepResult(GAME_OVER, 0.0, True, {"turns": self._turns, "success": False})
        self._turns += 1
        if self.step_latency_s:
            time.sleep(self.latency(self._task_id, self._turns))
        guess = parse_number(action)
        if guess is None or not self.low <= guess <= self.high:
            return StepResult(invalid(self.low, self.high), 0.0, False, {"turns": self._turns, "valid": False})
        before = self._potential()
        if guess == self._target:
            self._done = True
            return StepResult(
                CORRECT, 1.0 + self.shaping * (0.0 - before), True, {"turns": self._turns, "success": True}
            )
        if guess < self._target:
            self._lo = max(self._lo, guess + 1)
            word = HIGHER
        else:
            self._hi = min(self._hi, guess - 1)
            word = LOWER
        return StepResult(self._hint(word), self.shaping * (self._potential() - before), False, {"turns": self._turns})

    def _potential(self) -> float:
        """Φ = −log2|I| / log2 N of the interval the hints allow: −1 at the start, 0 when one number is left."""
        n = self.high - self.low + 1
        return -math.log2(self._hi - self._lo + 1) / math.log2(n) if n > 1 else 0.0

    def _hint(self, word: str) -> str:
        return f"{word}, {self._lo} to {self._hi}" if self.show_range else word

    def latency(self, task_id: int, turn: int) -> float:
        """Seconds step ``turn`` (from 1) of task ``task_id`` waits (0 unless ``step_latency_s``)."""
        if not self.step_latency_s:
            return 0.0
        z = random.Random(f"latency {task_id} {turn}").gauss(0.0, 1.0)
        return self.step_latency_s * math.exp(self.latency_sigma * z)

    def random_action(self, rng: random.Random) -> str:
        # Any number of the range, whatever the hints said (repeats included).
        return str(rng.randint(self.low, self.high))

    def expert_action(self) -> str:
        # Binary search over what the hints allow; it only uses what the agent has seen.
        return str((self._lo + self._hi) // 2)
