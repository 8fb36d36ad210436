"""``reasoning_gym``: any dataset of the ``reasoning-gym`` package (procedural reasoning tasks),
scored by the dataset's own ``score_answer``. Needs the ``reasoning-gym`` extra.

    options:  dataset: str                 a dataset name (``reasoning_gym.factory.DATASETS``:
                                           "leg_counting", "basic_arithmetic", "sudoku", ...)
              size: int = 1000             training items
              seed: int = 0                the training items' seed
              test_size: int = 100         test items
              test_seed: int = seed + size the test items' seed
              max_tries: int = 1           answers per task; above 1 a wrong answer gets its score
                                           back and another try (multi-turn)
              answer: str = "tag"          "tag": the answer is the text in the reply's last
                                           <answer>...</answer> (reasoning-gym's extract_answer; no
                                           tag scores as no answer); "raw": the whole reply
              any other option             a field of the dataset's config ("min_animals = 2");
                                           an unknown field is an error listing the fields
    task ids: train 0..size-1 (ids below 2**30 wrap onto them), test from 2**30 + 10000 on
              (``tasks("test")``); no dev split.
    reset ->  the item's question; ``instructions()`` asks for the answer format.
    step  ->  reward = ``score_answer(answer, item)`` (0 to 1), done, success when 1. With
              ``max_tries`` > 1 a wrong answer is answered "incorrect (score 0.25): try again, 2
              tries left" with reward 0 and the episode goes on; the last try's score is the
              reward. reasoning-gym's scorers return a number, not a text: the score is the feedback.
    expert:   the item's oracle answer (``item["answer"]``), in the answer format.

Train and test are disjoint by construction. reasoning-gym generates item ``i`` of a dataset
with seed ``s`` from ``Random(s + i)`` (nearly every dataset), so "a different seed" is not
enough: seed 1's item 1 is seed 2's item 0. The train items use the seeds ``seed`` to
``seed + size - 1`` and the test items ``test_seed`` to ``test_seed + test_size - 1``; the
default ``test_seed = seed + size`` starts where the training seeds end, and a ``test_seed``
whose range overlaps the training one is an error. (The few datasets that draw their items from
a fixed pool by the seed alone, such as ``list_functions``, ``gsm_symbolic`` and ``acre``, can
repeat a training item in the test split whatever the seeds.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from agentgym.envpool.base import SPLITS, Env, StepResult
from agentgym.envpool.envs.ecosystem import TEST_START, one_line, require, split_index, unknown

NAME = "reasoning_gym"
EXTRA = "reasoning-gym"
_OWN = ("dataset", "size", "seed", "test_size", "test_seed", "max_tries", "answer")


def _int(key: str, value: object, lo: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ValueError(f"env {NAME}: option {key} must be an integer >= {lo}, got {value!r}")
    return value


class ReasoningGym(Env):
    name = NAME
    preload = (
        "reasoning_gym",
        "reasoning_gym.utils",
    )  # imported once by the pool's zygote, shared by every forked worker

    def __init__(
        self,
        dataset: str = "",
        size: int = 1000,
        seed: int = 0,
        test_size: int = 100,
        test_seed: int | None = None,
        max_tries: int = 1,
        answer: str = "tag",
        **config: Any,
    ) -> None:
        super().__init__()
        rg = require("reasoning_gym", EXTRA, NAME)
        datasets = rg.factory.DATASETS
        if dataset not in datasets:
            raise unknown(NAME, "dataset", dataset, datasets)
        self.size, self.seed = _int("size", size, 1), _int("seed", seed, 0)
        self.test_size = _int("test_size", test_size, 0)
        self.test_seed = self.seed + self.size if test_seed is None else _int("test_seed", test_seed, 0)
        if self.test_size and self.test_seed < self.seed + self.size and self.seed < self.test_seed + self.test_size:
            raise ValueError(
                f"env {NAME}: test seeds {self.test_seed}..{self.test_seed + self.test_size - 1} overlap the training "
                f"seeds {self.seed}..{self.seed + self.size - 1} (item i of seed s is generated from s + i); "
                f"use test_seed >= {self.seed + self.size} or leave it unset"
            )
        self.max_tries = _int("max_tries", max_tries, 1)
        if answer not in ("tag", "raw"):
            raise ValueError(f"env {NAME}: option answer must be 'tag' or 'raw', got {answer!r}")
        self.answer = answer
        fields = dataclasses.fields(datasets[dataset][1])
        known = {f.name for f in fields} - {"seed", "size"}
        bad = sorted(set(config) - known)
        if bad:
            raise ValueError(
                f"env {NAME}: dataset {dataset!r} has no option(s) {bad}; its options: "
                f"{', '.join(sorted(known))} (and the adapter's: {', '.join(_OWN)})"
            )
        # TOML gives lists; a config field whose default is a tuple (a range) wants a tuple.
        tuples = {f.name for f in fields if isinstance(f.default, tuple)}
        self.config = {k: tuple(v) if k in tuples and isinstance(v, list) else v for k, v in config.items()}
        self.dataset = dataset
        self._rg = rg
        self._data: dict[str, Any] = {"train": self._make(self.seed, self.size)}  # bad config values fail here
        self._ds: Any = None
        self._item: dict[str, Any] | None = None
        self._tries = 0
        self._done = True

    def _make(self, seed: int, size: int) -> Any:
        try:
            return self._rg.create_dataset(self.dataset, seed=seed, size=size, **self.config)
        except (TypeError, ValueError, AssertionError) as exc:
            raise ValueError(
                f"env {NAME}: dataset {self.dataset!r} rejects its options {self.config}: "
                f"{type(exc).__name__}: {one_line(exc)}"
            ) from None

    @classmethod
    def check_options(cls, **options: object) -> None:
        cls(**options)  # type: ignore[arg-type]  # the constructor checks them; cheap: the dataset generates its items on demand

    @classmethod
    def tasks(cls, split: str = "train", **options: object) -> Sequence[int]:
        if split not in SPLITS:
            raise ValueError(f"env {NAME}: unknown split {split!r}; splits are {list(SPLITS)}")
        if split == "train":
            return range(0, int(options.get("size", 1000)))  # type: ignore[call-overload]  # an int option, as the constructor checks
        if split == "test":
            return range(TEST_START, TEST_START + int(options.get("test_size", 100)))  # type: ignore[call-overload]  # an int option, as the constructor checks
        return range(0)

    def reset(self, task_id: int) -> str:
        split, index = split_index(NAME, task_id, self.size, self.test_size)
        if split not in self._data:
            self._data[split] = self._make(self.test_seed, self.test_size)
        self._ds = self._data[split]
        self._item = self._ds[index]
        self._tries, self._done = 0, False
        return str(self._item["question"])

    def instructions(self) -> str:
        if self.answer == "tag":
            return "Answer the question. Give your final answer between <answer> and </answer> tags."
        return "Answer the question. Reply with the answer only."

    def _extract(self, action: str) -> str | None:
        if self.answer == "raw":
            return action.strip()
        from reasoning_gym.utils import extract_answer

        return extract_answer(action)

    def step(self, action: str) -> StepResult:
        if self._item is None or self._done:
            return StepResult("the task is over", 0.0, True, {"success": False})
        self._tries += 1
        score = float(self._ds.score_answer(self._extract(action), self._item))
        left = self.max_tries - self._tries
        info: dict[str, str | int | float | bool] = {"score": score, "tries": self._tries}
        if score >= 1.0 or left == 0:
            self._done = True
            word = "correct" if score >= 1.0 else f"incorrect (score {score:.2f})"
            return StepResult(word, score, True, {**info, "success": score >= 1.0})
        tries = "try" if left == 1 else "tries"
        return StepResult(f"incorrect (score {score:.2f}): try again, {left} {tries} left", 0.0, False, info)

    def expert_action(self) -> str:
        oracle = "" if self._item is None or self._item.get("answer") is None else str(self._item["answer"])
        return f"<answer>{oracle}</answer>" if self.answer == "tag" else oracle
